"""The HTTP edge through real sockets (docs/api.md "Transport", "Responses", "Error codes"):
body errors (400 naming the field, nothing applied), 413, 415, Content-Type and Accept,
404/405, and the operational endpoints /healthz, /readyz, /metrics, find-coordinator.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import aiohttp
import msgpack
import pytest

from protocol.routing import partition_for
from tests.harness import (
    MEDIA,
    TOPIC,
    Api,
    batch,
    body,
    decode,
    encode,
    init_entry,
    metric_value,
    part,
    read_entry,
    write_entry,
)
from tests.hostile_strings import PLACEHOLDER, encode_with, hostile_strings
from tests.server.conftest import Served, ServeFactory, StoreUnderTest


@pytest.fixture
def serve(serve: ServeFactory, store_postgres_slow: StoreUnderTest) -> ServeFactory:
    """Every node of this module on each state store: PostgreSQL's in `make
    reliability` only (test_e2e_rpc.py is the slice that runs on both in `make test`)."""

    async def start(**flags: Any) -> Served:
        return await serve(**{**store_postgres_slow.flags, **flags})

    return start


def _entry(rpc: str, partition: int = 0) -> dict[str, Any]:
    return {
        "initialize": init_entry(partition),
        "read": read_entry(partition),
        "write": write_entry(partition, batch(0, 1)),
        "delete": part(partition),
        "read-summary": read_entry(partition),
    }[rpc]


def _topic(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"group_id": "g", "topics": [{"topic_id": TOPIC, "partitions": entries}]}


def _with(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``obj`` with the item at ``path`` set (or removed for ``...``)."""
    copy = json.loads(json.dumps(obj))
    target = copy
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


# (rpc, path into the body, bad value (... = remove it), the field the message names)
# The bad entry comes second: a server applying entries as it decodes them would have
# applied the good first one before finding the error.
P0 = ("topics", 0, "partitions", 1)
BODY_ERRORS = [
    ("initialize", ("group_id",), ..., "group_id"),
    ("initialize", ("group_id",), "", "group_id"),
    ("read", ("group_id",), 7, "group_id"),
    ("write", ("topics",), {"a": 1}, "topics"),
    ("write", ("topics",), "not a list", "topics"),
    ("read", ("topics", 0), [1], "topics[0]"),
    ("read", ("topics", 0, "topic_id"), ..., "topics[0].topic_id"),
    ("read", ("topics", 0, "topic_id"), "my-topic", "topics[0].topic_id"),
    ("read", ("topics", 0, "topic_id"), None, "topics[0].topic_id"),
    ("delete", ("topics", 0, "partitions"), ..., "topics[0].partitions"),
    ("delete", ("topics", 0, "partitions"), "0", "topics[0].partitions"),
    ("delete", (*P0,), 0, "topics[0].partitions[1]"),
    ("delete", (*P0, "partition"), True, "topics[0].partitions[1].partition"),
    ("read", (*P0, "partition"), 1.0, "topics[0].partitions[1].partition"),
    ("read", (*P0, "partition"), "1", "topics[0].partitions[1].partition"),
    ("read", (*P0, "partition"), 2**31, "topics[0].partitions[1].partition"),
    ("read", (*P0, "leader_epoch"), ..., "topics[0].partitions[1].leader_epoch"),
    ("read-summary", (*P0, "leader_epoch"), -(2**31) - 1, "topics[0].partitions[1].leader_epoch"),
    ("initialize", (*P0, "state_epoch"), ..., "topics[0].partitions[1].state_epoch"),
    ("initialize", (*P0, "start_offset"), 2**63, "topics[0].partitions[1].start_offset"),
    ("initialize", (*P0, "start_offset"), None, "topics[0].partitions[1].start_offset"),
    ("write", (*P0, "state_batches"), ..., "topics[0].partitions[1].state_batches"),
    ("write", (*P0, "state_batches"), {}, "topics[0].partitions[1].state_batches"),
    ("write", (*P0, "state_batches", 0), [0, 1, 0, 1], "topics[0].partitions[1].state_batches[0]"),
    (
        "write",
        (*P0, "state_batches", 0, "delivery_count"),
        2**15,
        "topics[0].partitions[1].state_batches[0].delivery_count",
    ),
    (
        "write",
        (*P0, "state_batches", 0, "delivery_state"),
        128,
        "topics[0].partitions[1].state_batches[0].delivery_state",
    ),
    (
        "write",
        (*P0, "state_batches", 0, "first_offset"),
        False,
        "topics[0].partitions[1].state_batches[0].first_offset",
    ),
    (
        "write",
        (*P0, "state_batches", 0, "last_offset"),
        ...,
        "topics[0].partitions[1].state_batches[0].last_offset",
    ),
    (
        "write",
        (*P0, "delivery_complete_count"),
        0.5,
        "topics[0].partitions[1].delivery_complete_count",
    ),
    ("write", (*P0, "leader_epoch"), "3", "topics[0].partitions[1].leader_epoch"),
]


@pytest.mark.parametrize(("rpc", "path", "value", "field"), BODY_ERRORS)
async def test_body_errors_answer_400_naming_the_field_and_apply_nothing(
    serve, fmt, rpc, path, value, field
):
    api = (await serve()).api(fmt)
    # Key 1 exists (except for initialize, which would create it); the request's good
    # entry for it would change it if anything of the refused body were applied.
    if rpc != "initialize":
        await api.rpc("initialize", _topic([init_entry(1, 0, 42)]))
    before = await api.state("g", TOPIC, 1)
    good = {
        "initialize": init_entry(1, 0, 42),
        "read": read_entry(1, 5),  # would record leader epoch 5
        "write": write_entry(1, batch(50, 60), start_offset=50),
        "delete": part(1),
        "read-summary": read_entry(1),
    }[rpc]
    obj = _with(_topic([good, _entry(rpc)]), path, value)
    reply = await api.rpc_reply(rpc, obj)
    assert reply.status == 400, reply.body
    assert reply.format == fmt
    assert reply.body["error_code"] == 42
    assert reply.body["error_message"].startswith(field), reply.body
    assert set(reply.body) == {"error_code", "error_message"}
    assert await api.state("g", TOPIC, 1) == before


NOT_JSON = "the body is not valid JSON: "
NESTED = (
    "the body nests lists and maps too deeply to be decoded (hundreds of levels); "
    "no body of the API nests more than 7"
)
DEEP = 100_000


# The exact answer to each: a sentence a client author understands, never the parser's.
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "the body is empty: expected a JSON object"),
        (b"{", NOT_JSON + "expected a field name in double quotes (line 1, column 2)"),
        (b"[]", "expected the body to be a map, got a list"),
        (b"null", "expected the body to be a map, got null"),
        (b'"just a string"', "expected the body to be a map, got a string ('just a string')"),
        (
            b"\xff\xfe",
            "the body is UTF-16 (it starts with a UTF-16 byte order mark): send it in UTF-8",
        ),
        (
            b'{"group_id": NaN}',
            NOT_JSON + "NaN is not a JSON number (JSON has no NaN, Infinity or -Infinity)",
        ),
        (
            b'\xef\xbb\xbf{"group_id": "g", "topics": []}',
            "the body starts with a byte order mark (EF BB BF): send the JSON text without it",
        ),
        (b"[" * DEEP + b"]" * DEEP, NESTED),
        (
            b'{"group_id": "g", "topics": [{"topic_id": "' + TOPIC.encode() + b'", '
            b'"partitions": [{"partition": ' + b"7" * 5001 + b', "leader_epoch": 0}]}]}',
            "topics[0].partitions[0].partition: expected an integer in int32 range, got an "
            "integer of 5001 digits",
        ),
        (
            b'{"group_id": "\xff\xfe", "topics": []}',
            "group_id: expected UTF-8 text, got bytes that are not UTF-8 (ff fe) at byte 0 of "
            "the string",
        ),
        (
            b'{"group_id": "\\ud800", "topics": []}',
            "group_id: expected valid Unicode text, got a lone surrogate (\\ud800) at "
            "character 0 of the string",
        ),
        (
            b'{"group_id": "g\x00", "topics": []}',
            "group_id: a raw control character (U+0000) at character 1 of the string: a JSON "
            "string carries it escaped, as \\u0000",
        ),
    ],
)
async def test_undecodable_json_bodies_answer_400_saying_why(serve, raw, message, caplog):
    api = (await serve()).api("json")
    with caplog.at_level("ERROR", logger="sharecoord"):
        reply = await api.request(
            "POST",
            "/v1/share-group-state/read",
            data=raw,
            headers={"Content-Type": "application/json"},
        )
    assert reply.status == 400
    assert reply.format == "json"
    assert reply.body == {"error_code": 42, "error_message": message}
    assert not caplog.records


NOT_MSGPACK = "the body is not valid msgpack: "


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "the body is empty: expected a msgpack map"),
        (b"\xc1", NOT_MSGPACK + "byte 0xc1 at offset 0, which msgpack never uses"),
        (msgpack.packb([1, 2]), "expected the body to be a map, got a list"),
        (
            msgpack.packb({"group_id": "g", "topics": []}) + b"\x00",
            NOT_MSGPACK
            + "1 more byte after its first value (a body is one msgpack map, and nothing after it)",
        ),
        (msgpack.packb({1: 2}), NOT_MSGPACK + "a map key that is not a string"),
        (
            b"\xef\xbb\xbf" + msgpack.packb({"group_id": "g", "topics": []}),
            "the body starts with a UTF-8 byte order mark (EF BB BF), which is no part of "
            "msgpack: send the map alone",
        ),
        (b"\x91" * DEEP + b"\xc0", NESTED),
        (
            b"\x82\xa8group_id\xa3\xed\xa0\x80\xa6topics\x90",
            "group_id: expected UTF-8 text, got a UTF-16 surrogate encoded in UTF-8 (ed a0 80) "
            "at byte 0 of the string",
        ),
    ],
)
async def test_undecodable_msgpack_bodies_answer_400_saying_why(serve, raw, message, caplog):
    api = (await serve()).api("msgpack")
    with caplog.at_level("ERROR", logger="sharecoord"):
        reply = await api.request(
            "POST",
            "/v1/share-group-state/write",
            data=raw,
            headers={"Content-Type": "application/msgpack"},
        )
    assert reply.status == 400
    assert reply.format == "msgpack"
    assert reply.body == {"error_code": 42, "error_message": message}
    assert not caplog.records


# Every string of every body route: (method, path, a valid body, where the string is,
# the field the message names).
TOPIC_ID_AT = ("topics", 0, "topic_id")
FIND = {"keys": [f"g:{TOPIC}:0", f"h:{TOPIC}:1"]}
REGISTRATION = {"topic_id": TOPIC, "partition_count": 1}
STRING_POSITIONS = [
    *[
        ("POST", f"/v1/share-group-state/{rpc}", _topic([_entry(rpc)]), where, field)
        for rpc in ("initialize", "read", "write", "delete", "read-summary")
        for where, field in ((("group_id",), "group_id"), (TOPIC_ID_AT, "topics[0].topic_id"))
    ],
    ("POST", "/v1/find-coordinator", FIND, ("keys", 0), "keys[0]"),
    ("POST", "/v1/find-coordinator", FIND, ("keys", 1), "keys[1]"),
    ("PUT", "/v1/admin/topics", REGISTRATION, ("topic_id",), "topic_id"),
]


@pytest.mark.parametrize(
    ("method", "path", "valid", "where", "field"),
    STRING_POSITIONS,
    ids=[f"{path.rsplit('/', 1)[1]}-{field}" for _, path, _, _, field in STRING_POSITIONS],
)
async def test_hostile_bytes_in_any_string_answer_400_naming_it_and_log_nothing(
    serve, fmt, caplog, method, path, valid, where, field
):
    """Bytes that are not UTF-8 (overlong forms, encoded surrogates), lone surrogates
    and raw control characters in JSON: 400, code 42, the field and what was wrong, no
    trace; nothing written."""
    api = (await serve()).api(fmt)
    headers = {"Content-Type": MEDIA[fmt]}
    with caplog.at_level("ERROR", logger="sharecoord"):
        for kind, (raw, problem) in hostile_strings(fmt).items():
            data = encode_with(_with(valid, where, PLACEHOLDER), raw, fmt)
            reply = await api.request(method, path, data=data, headers=headers)
            assert (reply.status, reply.format) == (400, fmt), (kind, reply.body)
            assert reply.body == {"error_code": 42, "error_message": f"{field}: {problem}"}, kind
    assert not caplog.records
    assert await appended(api) == 0


async def test_a_group_id_query_that_is_not_utf8_answers_400_naming_it(serve, fmt):
    api = (await serve()).api(fmt)
    headers = {"Accept": MEDIA[fmt]}
    query = f"topic_id={TOPIC}&partition=0&group_id="
    reply = await api.request("GET", "/v1/admin/state?" + query + "%ED%A0%80", headers=headers)
    assert (reply.status, reply.format) == (400, fmt)
    assert reply.body == {
        "error_code": 42,
        "error_message": "query parameter group_id: expected UTF-8 text, got a UTF-16 "
        "surrogate encoded in UTF-8 (ed a0 80) at byte 0 of the string",
    }
    # U+FFFD itself, sent as UTF-8, is a group id like any other: it has no state.
    reply = await api.request("GET", "/v1/admin/state?" + query + "%EF%BF%BD", headers=headers)
    assert (reply.status, reply.body["error_code"]) == (404, 3)


async def test_nul_is_a_character_like_any_other_in_a_group_id(serve):
    """Kafka takes any string as a group id, NUL included: msgpack carries it as it is,
    JSON escaped; both name the same key, which the admin query reads back."""
    served = await serve()
    json_api, msgpack_api = served.api("json"), served.api("msgpack")
    group = "a\x00b"
    assert await msgpack_api.codes("initialize", body(group, (TOPIC, [init_entry(0, 0, 7)]))) == [0]
    assert (await json_api.results("read-summary", body(group, (TOPIC, [read_entry(0)]))))[0][
        "start_offset"
    ] == 7
    state = await json_api.state(group, TOPIC, 0)
    assert state is not None
    assert (state["group_id"], state["start_offset"]) == (group, 7)


async def test_unknown_fields_are_ignored(serve, fmt):
    api = (await serve()).api(fmt)
    obj = _topic([{**init_entry(0, 0, 5), "extra": [1, {"x": None}]}])
    obj["unknown"] = {"nested": True}
    obj["topics"][0]["more"] = 1
    assert await api.codes("initialize", obj) == [0]


async def test_limits_on_entries_and_batches_answer_400(serve, fmt):
    api = (await serve(max_entries_per_request=3, max_state_batches_per_entry=2)).api(fmt)
    reply = await api.rpc_reply("read", _topic([read_entry(p) for p in range(4)]))
    assert (reply.status, reply.body["error_code"]) == (400, 42)
    assert reply.body["error_message"].startswith("topics")
    # Topics without partitions count too.
    obj = {"group_id": "g", "topics": [{"topic_id": TOPIC, "partitions": []}] * 4}
    assert (await api.rpc_reply("read", obj)).status == 400
    reply = await api.rpc_reply("write", _topic([write_entry(0, *[batch(i, i) for i in range(3)])]))
    assert reply.status == 400
    assert reply.body["error_message"].startswith("topics[0].partitions[0].state_batches")
    # At the limits: fine.
    assert await api.codes("read-summary", _topic([read_entry(p) for p in range(3)])) == [0] * 3


RPCS = ("initialize", "read", "write", "delete", "read-summary")
OVER_THE_LIMIT = "group_id: 1048576 bytes, over the limit of 255 (max_group_id_bytes)"


async def appended(api: Api) -> int:
    reply = await api.request("GET", "/v1/admin/partitions")
    return sum(p["log_end_offset"] or 0 for p in reply.body["partitions"])


async def _post_large(api: Api, path: str, obj: Any) -> Any:
    # BytesIO: aiohttp warns about (and the suite refuses) big raw bytes bodies.
    data = io.BytesIO(encode(obj, api.fmt))
    return await api.request("POST", path, data=data, headers={"Content-Type": MEDIA[api.fmt]})


async def test_a_group_id_over_the_limit_answers_400_naming_it_and_writes_nothing(serve, fmt):
    """docs/api.md "Limits": a 1 MiB group id with many entries once wrote ~1 GB (every
    record repeats it); now every RPC refuses it whole, before any entry runs."""
    api = (await serve()).api(fmt)
    huge = "g" * (1 << 20)
    for rpc in RPCS:
        obj = _topic([_entry(rpc, p) for p in range(3)])
        obj["group_id"] = huge
        reply = await _post_large(api, f"/v1/share-group-state/{rpc}", obj)
        assert (reply.status, reply.format) == (400, fmt), (rpc, reply.status)
        assert reply.body == {"error_code": 42, "error_message": OVER_THE_LIMIT}, rpc
    reply = await _post_large(api, "/v1/find-coordinator", {"keys": [f"{huge}:{TOPIC}:0"]})
    assert (reply.status, reply.body["error_code"]) == (400, 42)
    assert reply.body["error_message"] == (
        "keys[0]: its group id: 1048576 bytes, over the limit of 255 (max_group_id_bytes)"
    )
    assert await appended(api) == 0


async def test_a_group_id_of_exactly_the_limit_in_utf8_bytes_works_everywhere(serve, fmt):
    api = (await serve()).api(fmt)
    group = "€" * 85  # 85 characters, 255 bytes
    obj = {**_topic([_entry("initialize", 0)]), "group_id": group}
    assert await api.codes("initialize", obj) == [0]
    for rpc in RPCS:
        assert await api.codes(rpc, {**_topic([_entry(rpc, 0)]), "group_id": group}) == [0], rpc
    assert (await api.admin_state(group, TOPIC, 0)).status == 404  # deleted just now
    reply = await api.post("/v1/find-coordinator", {"keys": [f"{group}:{TOPIC}:0"]})
    assert reply.body["coordinators"][0]["error_code"] == 0
    # One byte more is over, in every place that takes a group id.
    over = group + "g"
    reply = await api.rpc_reply("read", {**_topic([read_entry(0)]), "group_id": over})
    assert (reply.status, reply.body["error_message"]) == (
        400,
        "group_id: 256 bytes, over the limit of 255 (max_group_id_bytes)",
    )
    reply = await api.admin_state(over, TOPIC, 0)
    assert (reply.status, reply.body["error_code"]) == (400, 42)
    assert reply.body["error_message"] == (
        "query parameter group_id: 256 bytes, over the limit of 255 (max_group_id_bytes)"
    )


async def test_max_group_id_bytes_sets_the_limit(serve, fmt):
    api = (await serve(max_group_id_bytes=4)).api(fmt)
    assert await api.codes("initialize", {**_topic([init_entry(0)]), "group_id": "éé"}) == [0]
    reply = await api.rpc_reply("initialize", {**_topic([init_entry(0)]), "group_id": "ééé"})
    assert reply.body["error_message"] == (
        "group_id: 6 bytes, over the limit of 4 (max_group_id_bytes)"
    )


# --- 413 and 415 ----------------------------------------------------------------------------

LIMIT = 2048


def _padded(fmt: str, size: int) -> bytes:
    """A valid read-summary body of exactly ``size`` bytes (padded with an unknown field)."""
    obj = {**_topic([read_entry(0)]), "padding": ""}
    raw = encode(obj, fmt)
    obj["padding"] = "x" * (size - len(raw))
    raw = encode(obj, fmt)
    if len(raw) != size:  # msgpack's str header grew: take the difference off again
        obj["padding"] = "x" * (len(obj["padding"]) - (len(raw) - size))
        raw = encode(obj, fmt)
    assert len(raw) == size
    return raw


async def test_a_body_over_the_limit_answers_413_with_content_length(serve, fmt):
    api = (await serve(max_body_bytes=LIMIT)).api(fmt)
    headers = {"Content-Type": MEDIA[fmt]}
    path = "/v1/share-group-state/read-summary"
    ok = await api.request("POST", path, data=_padded(fmt, LIMIT), headers=headers)
    assert ok.status == 200, ok.body
    reply = await api.request("POST", path, data=_padded(fmt, LIMIT + 1), headers=headers)
    assert reply.status == 413
    assert reply.format == fmt
    assert reply.body["error_code"] == 42
    assert "max-body-bytes" in reply.body["error_message"]
    # The connection still serves.
    assert (await api.request("POST", path, data=_padded(fmt, 300), headers=headers)).status == 200


async def test_a_chunked_body_over_the_limit_answers_413(serve, fmt):
    api = (await serve(max_body_bytes=LIMIT)).api(fmt)

    def chunks(raw: bytes):
        async def gen():
            for i in range(0, len(raw), 500):
                yield raw[i : i + 500]

        return gen()

    headers = {"Content-Type": MEDIA[fmt]}
    path = "/v1/share-group-state/read-summary"
    ok = await api.request("POST", path, data=chunks(_padded(fmt, LIMIT)), headers=headers)
    assert ok.status == 200, ok.body
    big = _padded(fmt, LIMIT * 3)
    async with api.session.post(api.base_url + path, data=chunks(big), headers=headers) as resp:
        # No Content-Length went out: only reading the body can find it too large.
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in resp.request_info.headers
        raw = await resp.read()
        assert resp.status == 413
        assert resp.content_type == MEDIA[fmt]
        error = decode(raw, resp.content_type)
        assert error["error_code"] == 42
        assert "max-body-bytes" in error["error_message"]


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
)
async def test_other_content_types_answer_415_in_json(serve, content_type):
    api = (await serve()).api("json")
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = await api.request(
        "POST",
        "/v1/share-group-state/initialize",
        data=json.dumps(_topic([init_entry(0)])).encode(),
        headers=headers,
    )
    assert reply.status == 415
    assert reply.format == "json"
    assert reply.body["error_code"] == 42
    assert "Content-Type" in reply.body["error_message"]
    assert await api.state("g", TOPIC, 0) is None


# --- Content-Type and Accept ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "accept", "answer"),
    [
        ("application/json; charset=utf-8", None, "json"),
        ("Application/JSON", None, "json"),
        ("application/msgpack; foo=bar", None, "msgpack"),
        ("application/json", "application/msgpack", "msgpack"),
        ("application/msgpack", "application/json; q=0.9", "json"),
        ("application/json", "application/msgpack;q=1.0, text/html", "msgpack"),
        ("application/json", "*/*", "json"),
        ("application/msgpack", "application/json;q=0", "msgpack"),
        ("application/json", "application/json, application/msgpack", "json"),
    ],
)
async def test_content_type_and_accept_with_parameters(serve, content_type, accept, answer):
    api = (await serve()).api("json")
    sent = "msgpack" if "msgpack" in content_type.lower() else "json"
    headers = {"Content-Type": content_type}
    if accept:
        headers["Accept"] = accept
    reply = await api.request(
        "POST",
        "/v1/share-group-state/read-summary",
        data=encode(_topic([read_entry(0)]), sent),
        headers=headers,
    )
    assert reply.status == 200, reply.body
    assert reply.format == answer
    assert reply.body["results"][0]["partitions"][0]["start_offset"] == -1
    # Error answers follow the same choice.
    reply = await api.request(
        "POST",
        "/v1/share-group-state/read-summary",
        data=encode({"topics": []}, sent),
        headers=headers,
    )
    assert reply.status == 400
    assert reply.format == answer


async def test_admin_get_answers_msgpack_when_accept_asks(serve):
    api = (await serve()).api("json")
    await api.rpc("initialize", _topic([init_entry(0)]))
    reply = await api.admin_state("g", TOPIC, 0, accept="application/msgpack")
    assert (reply.status, reply.format) == (200, "msgpack")
    reply = await api.request(
        "GET", "/v1/admin/partitions", headers={"Accept": "application/msgpack"}
    )
    assert (reply.status, reply.format) == (200, "msgpack")


# --- every non-200 answer has the error body --------------------------------------------------


async def test_unknown_route_answers_404_with_code_3(serve, fmt):
    api = (await serve()).api(fmt)
    for method, path in (
        ("POST", "/v1/share-group-state/nope"),
        ("GET", "/v2/anything"),
        ("GET", "/"),
    ):
        reply = await api.request(
            method, path, data=encode({}, fmt), headers={"Content-Type": MEDIA[fmt]}
        )
        assert reply.status == 404, path
        assert reply.body["error_code"] == 3
        assert path in reply.body["error_message"]
        # In the request's format when it was recognised (docs/api.md).
        assert reply.format == fmt, path


async def test_wrong_method_answers_405_with_an_error_body(serve, fmt):
    api = (await serve()).api(fmt)
    for method, path in (
        ("GET", "/v1/share-group-state/write"),
        ("PUT", "/v1/find-coordinator"),
        ("POST", "/v1/admin/state"),
        ("POST", "/healthz"),
    ):
        reply = await api.request(
            method, path, data=encode({}, fmt), headers={"Content-Type": MEDIA[fmt]}
        )
        assert reply.status == 405, path
        assert set(reply.body) == {"error_code", "error_message"}
        assert reply.body["error_code"] == 42
        assert reply.format == fmt, path


# --- operational endpoints --------------------------------------------------------------------


async def test_healthz_and_readyz(serve):
    served = await serve()
    api = served.api()
    health = await api.request("GET", "/healthz")
    assert health.status == 200
    ready = await api.readyz()
    assert ready.status == 200
    assert ready.body == {"status": "ready", "failed_partitions": [], "failures": []}


async def test_metrics_are_prometheus_text_and_move_with_a_write(serve, fmt):
    api = (await serve()).api(fmt)
    reply = await api.request("GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    before = reply.raw.decode()
    assert "# TYPE sharecoord_shard_writes_total counter" in before
    await api.rpc("initialize", _topic([init_entry(0)]))
    await api.rpc("write", _topic([write_entry(0, batch(0, 4)), write_entry(0, batch(3, 8))]))
    await api.rpc_reply("write", {"group_id": 5})
    after = await api.metrics()
    assert metric_value(after, "sharecoord_shard_writes_total") == (
        metric_value(before, "sharecoord_shard_writes_total") + 2
    )
    assert (
        metric_value(after, "sharecoord_partition_results_total", rpc="write", error_code="0") == 2
    )
    assert metric_value(after, "sharecoord_rpc_requests_total", rpc="write", outcome="ok") == 1
    assert metric_value(after, "sharecoord_rpc_requests_total", rpc="write", outcome="42") == 1
    assert metric_value(after, "sharecoord_http_error_responses_total", status="400") == 1
    partition = partition_for("g", TOPIC, 0, 8)
    assert metric_value(after, "sharecoord_records_appended_total", partition=str(partition)) == 3
    assert metric_value(after, "sharecoord_keys", partition=str(partition)) == 1
    # The group commit reports every cycle: a partition per cycle and its fsync time.
    cycles = metric_value(after, "sharecoord_group_commit_partitions_count")
    assert cycles >= 1
    assert metric_value(after, "sharecoord_fsync_duration_seconds_count") >= cycles
    assert (
        metric_value(
            after, "sharecoord_partition_status", partition=str(partition), status="active"
        )
        == 1
    )


async def test_every_refused_rpc_request_counts_with_its_request_level_code(serve, fmt):
    """sharecoord_rpc_requests_total: "ok", or the request-level error code: 42 for any
    refused body (400, 413, 415), 31 for a missing token."""
    served = await serve(max_body_bytes=LIMIT, token="t")
    api = served.api(fmt)
    assert (await api.rpc_reply("read", {"group_id": 5})).status == 400
    assert (await api.rpc_reply("read", {"pad": "x" * LIMIT})).status == 413
    reply = await api.request(
        "POST", "/v1/share-group-state/read", data=b"{}", headers={"Content-Type": "text/csv"}
    )
    assert reply.status == 415
    assert (await served.api(fmt, token="wrong").rpc_reply("delete", {})).status == 401
    assert await api.codes("read-summary", _topic([read_entry(0)])) == [0]
    text = await api.metrics()
    assert metric_value(text, "sharecoord_rpc_requests_total", rpc="read", outcome="42") == 3
    assert metric_value(text, "sharecoord_rpc_requests_total", rpc="delete", outcome="31") == 1
    assert (
        metric_value(text, "sharecoord_rpc_requests_total", rpc="read-summary", outcome="ok") == 1
    )
    for status in ("400", "401", "413", "415"):
        assert metric_value(text, "sharecoord_http_error_responses_total", status=status) == 1


async def test_find_coordinator_on_a_single_node(serve, fmt):
    served = await serve(node_id=7)
    api = served.api(fmt)
    good = f"g:{TOPIC}:3"
    keys = [good, "nope", f"g:{TOPIC}", f" g :{TOPIC}:3:", f"g:{TOPIC}:x", good]
    reply = await api.post("/v1/find-coordinator", {"keys": keys})
    assert reply.status == 200
    coordinators = reply.body["coordinators"]
    assert [c["key"] for c in coordinators] == keys
    expected = {
        "key": good,
        "state_partition": partition_for("g", TOPIC, 3, 8),
        "node_id": 7,
        "host": "127.0.0.1",
        "port": served.server.port,
        "error_code": 0,
        "error_message": None,
    }
    assert coordinators[0] == coordinators[5] == expected
    # Java split drops the trailing empty token; the group id " g " is kept as the RPCs
    # carry it (docs/semantics.md §1.2).
    assert coordinators[3]["state_partition"] == partition_for(" g ", TOPIC, 3, 8)
    assert coordinators[3]["error_code"] == 0
    for bad in (coordinators[1], coordinators[2], coordinators[4]):
        assert bad["error_code"] == 42
        assert (bad["state_partition"], bad["node_id"], bad["host"], bad["port"]) == (
            -1,
            -1,
            "",
            -1,
        )
        assert bad["error_message"]
    reply = await api.post("/v1/find-coordinator", {"keys": "g:t:0"})
    assert (reply.status, reply.body["error_code"]) == (400, 42)
    assert reply.body["error_message"].startswith("keys")


async def test_a_client_may_keep_its_connection_across_errors(serve, fmt):
    """Keep-alive: 400, 404, 413 and 415 answers leave the connection usable."""
    served = await serve(max_body_bytes=LIMIT)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        api = Api(session, served.url, fmt)
        for _ in range(3):
            assert (await api.rpc_reply("read", {"group_id": ""})).status == 400
            assert (await api.request("GET", "/nowhere")).status == 404
            assert (await api.rpc_reply("read", {"x": "y" * LIMIT})).status == 413
            reply = await api.request(
                "POST", "/v1/share-group-state/read", data=b"x", headers={"Content-Type": "a/b"}
            )
            assert reply.status == 415
            assert await api.codes("read-summary", _topic([read_entry(0)])) == [0]


async def test_answers_without_a_recognised_body_format_follow_accept(serve):
    """A GET, or a body in another format (415), answers JSON unless Accept asks msgpack;
    this holds for error answers given before any handler runs too."""
    api = (await serve()).api("json")
    msgpack_please = {"Accept": "application/msgpack"}
    reply = await api.request("GET", "/v1/nowhere", headers=msgpack_please)
    assert (reply.status, reply.format, reply.body["error_code"]) == (404, "msgpack", 3)
    reply = await api.request(
        "POST",
        "/v1/share-group-state/read",
        data=b"x",
        headers={**msgpack_please, "Content-Type": "text/plain"},
    )
    assert (reply.status, reply.format, reply.body["error_code"]) == (415, "msgpack", 42)
    reply = await api.request("GET", "/v1/nowhere")
    assert (reply.status, reply.format) == (404, "json")


async def test_a_body_that_never_arrives_is_cut_off_after_the_request_timeout(serve):
    """--request-timeout-s: "seconds a client may take to send a request ... slow clients
    are cut off after it". A request whose body stops coming gets 408 and the connection
    closes, instead of holding it (and a handler) forever."""
    served = await serve(request_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    try:
        writer.write(
            b"POST /v1/share-group-state/read HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        # Generous: only a server that never answers fails (at the deadline).
        answer = await asyncio.wait_for(reader.read(), timeout=60)
    finally:
        writer.close()
    head, _, raw = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(raw)
    assert error["error_code"] == 42
    assert "request-timeout" in error["error_message"]
    # The daemon serves on.
    assert await served.api().codes("read-summary", _topic([read_entry(0)])) == [0]


async def test_once_the_daemon_stops_reading_bodies_a_body_still_arriving_is_cut(serve):
    """At SIGTERM the daemon stops reading bodies (server.daemon): a request whose body
    has not all arrived is cut, not answered, however long the request timeout; one whose
    body is all there is still served."""
    served = await serve(request_timeout_s=600)
    assert served.edge.stop_reading_bodies() == 0  # nobody was waiting
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    try:
        writer.write(
            b"POST /v1/share-group-state/read HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        # Generous: only a daemon that waits for the body (600 s) fails, at the deadline.
        assert await asyncio.wait_for(reader.read(), timeout=60) == b""  # closed, no answer
    finally:
        writer.close()
    assert await served.api().codes("read-summary", _topic([read_entry(0)])) == [0]


async def test_the_default_body_limit_is_4_mib(serve, fmt):
    api = (await serve()).api(fmt)
    headers = {"Content-Type": MEDIA[fmt]}
    path = "/v1/share-group-state/read-summary"
    limit = 4 * 1024 * 1024
    bodies = await asyncio.to_thread(lambda: (_padded(fmt, limit), _padded(fmt, limit + 1)))
    # BytesIO: aiohttp warns about (and the suite refuses) big raw bytes bodies.
    ok = await api.request("POST", path, data=io.BytesIO(bodies[0]), headers=headers)
    assert ok.status == 200
    reply = await api.request("POST", path, data=io.BytesIO(bodies[1]), headers=headers)
    assert (reply.status, reply.body["error_code"]) == (413, 42)


class _Broken:
    """A node's service whose ``handle`` is a bug, the rest the real one's. (A stand-in,
    not a patched method: in the compiled mode the service is an extension class.)"""

    def __init__(self, service: Any) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    async def handle(self, rpc: Any, request: Any) -> Any:
        raise RuntimeError("a bug in the service")


async def test_a_bug_answers_500_with_code_minus_1_and_is_logged_with_a_trace(
    serve, fmt, caplog, monkeypatch
):
    """UNKNOWN_SERVER_ERROR (-1) is "a bug; logged with a trace": make the service fail."""
    served = await serve()
    monkeypatch.setattr(served.node, "_service", _Broken(served.node.service))
    with caplog.at_level("ERROR", logger="sharecoord.http"):
        reply = await served.api(fmt).rpc_reply("read", _topic([read_entry(0)]))
    assert reply.status == 500
    assert reply.format == fmt
    assert reply.body == {
        "error_code": -1,
        "error_message": "The server experienced an unexpected error when processing the request.",
    }
    assert "a bug in the service" in caplog.text
    assert any(record.exc_info for record in caplog.records)
