"""protocol.codec: request and response bodies (docs/api.md, docs/semantics.md §A.1), one
test per rule."""

from __future__ import annotations

import base64
import gc
import json
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.client_codec import (
    decode_admin_state,
    decode_error,
    decode_find_coordinator_response,
    decode_response,
    encode_find_coordinator,
    encode_request,
)
from protocol.codec import (
    DEFAULT_LIMITS,
    BodyError,
    Format,
    Limits,
    decode_find_coordinator,
    decode_request,
    decode_topic_registration,
    encode_admin_state,
    encode_error,
    encode_find_coordinator_response,
    encode_object,
    encode_response,
    format_of,
    response_format,
)
from protocol.errors import MSG_NEGATIVE_PARTITION
from protocol.messages import (
    AdminState,
    CoordinatorResult,
    DeletePartition,
    ErrorBody,
    Fencing,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitializePartition,
    PartitionResult,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicRequest,
    TopicResult,
    WritePartition,
)
from protocol.state_batch import StateBatch
from tests.hostile_strings import PLACEHOLDER, encode_with, hostile_strings

MSGPACK, JSON = Format.MSGPACK, Format.JSON
FORMATS = [MSGPACK, JSON]
TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
TOPIC_RFC4122 = "5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d"  # the same topic as TOPIC

INT8 = (-(2**7), 2**7 - 1)
INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


# --- helpers --------------------------------------------------------------------------


def encode(obj: object, fmt: Format) -> bytes:
    if fmt is MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj).encode()  # escapes lone surrogates (a "\\ud800"-style escape)


def batch(first: int = 0, last: int = 9, state: int = 0, count: int = 1) -> dict[str, int]:
    return {
        "first_offset": first,
        "last_offset": last,
        "delivery_state": state,
        "delivery_count": count,
    }


def entry(rpc: Rpc, **fields: Any) -> dict[str, Any]:
    base: dict[Rpc, dict[str, Any]] = {
        Rpc.INITIALIZE: {"partition": 0, "state_epoch": 0, "start_offset": 0},
        Rpc.READ: {"partition": 0, "leader_epoch": 0},
        Rpc.WRITE: {
            "partition": 0,
            "state_epoch": 0,
            "leader_epoch": 0,
            "start_offset": 0,
            "delivery_complete_count": 0,
            "state_batches": [batch()],
        },
        Rpc.DELETE: {"partition": 0},
        Rpc.READ_SUMMARY: {"partition": 0, "leader_epoch": 0},
    }
    return {**base[rpc], **fields}


def body(rpc: Rpc, *entries: dict[str, Any], topic_id: str = TOPIC) -> dict[str, Any]:
    partitions = list(entries) if entries else [entry(rpc)]
    return {"group_id": "g", "topics": [{"topic_id": topic_id, "partitions": partitions}]}


def set_path(obj: Any, path: str, value: Any) -> None:
    """Set ``obj`` at a codec field path such as ``topics[0].partitions[0].partition``;
    a value of ``DELETE`` removes the field."""
    steps: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.replace("]", "").split("[")
        if name:
            steps.append(name)
        steps.extend(int(i) for i in indexes)
    for step in steps[:-1]:
        obj = obj[step]
    if value is DELETE:
        del obj[steps[-1]]
    else:
        obj[steps[-1]] = value


DELETE = object()


def body_error(decode: Callable[[], object], field: str) -> BodyError:
    with pytest.raises(BodyError) as info:
        decode()
    exc = info.value
    assert exc.field == field
    str(exc).encode("utf-8")  # the message can always be sent, whatever was received
    assert str(exc) == (f"{field}: {exc.problem}" if field else exc.problem)
    return exc


def decode_write(obj: object, fmt: Format = JSON, limits: Limits = DEFAULT_LIMITS) -> Any:
    return decode_request(Rpc.WRITE, encode(obj, fmt), fmt, limits)


# Every integer field of every RPC request: (rpc, path below the entry, (min, max)).
INT_FIELDS = [
    (Rpc.INITIALIZE, "partition", INT32),
    (Rpc.INITIALIZE, "state_epoch", INT32),
    (Rpc.INITIALIZE, "start_offset", INT64),
    (Rpc.READ, "partition", INT32),
    (Rpc.READ, "leader_epoch", INT32),
    (Rpc.WRITE, "partition", INT32),
    (Rpc.WRITE, "state_epoch", INT32),
    (Rpc.WRITE, "leader_epoch", INT32),
    (Rpc.WRITE, "start_offset", INT64),
    (Rpc.WRITE, "delivery_complete_count", INT32),
    (Rpc.WRITE, "state_batches[0].first_offset", INT64),
    (Rpc.WRITE, "state_batches[0].last_offset", INT64),
    (Rpc.WRITE, "state_batches[0].delivery_state", INT8),
    (Rpc.WRITE, "state_batches[0].delivery_count", INT16),
    (Rpc.DELETE, "partition", INT32),
    (Rpc.READ_SUMMARY, "partition", INT32),
    (Rpc.READ_SUMMARY, "leader_epoch", INT32),
]
INT_FIELD_IDS = [f"{rpc.value}.{path}" for rpc, path, _ in INT_FIELDS]
ENTRY = "topics[0].partitions[0]"

DECODERS: list[tuple[str, Callable[[bytes, Format], object]]] = [
    *[(f"decode_request[{r.value}]", partial(decode_request, r)) for r in Rpc],
    ("decode_find_coordinator", decode_find_coordinator),
    ("decode_topic_registration", decode_topic_registration),
    *[(f"decode_response[{r.value}]", partial(decode_response, r)) for r in Rpc],
    ("decode_find_coordinator_response", decode_find_coordinator_response),
    ("decode_admin_state", decode_admin_state),
    ("decode_error", decode_error),
]


# --- formats --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/msgpack", MSGPACK),
        ("application/json", JSON),
        ("Application/MsgPack", MSGPACK),
        ("APPLICATION/JSON", JSON),
        ("application/json; charset=utf-8", JSON),
        (" application/json ;charset=UTF-8", JSON),
        ("application/msgpack; foo=bar", MSGPACK),
        (None, None),
        ("", None),
        ("text/plain", None),
        ("application/x-msgpack", None),
        ("application/jsonx", None),
        ("application/json+x; charset=utf-8", None),
        ("text/json", None),
    ],
)
def test_format_of_names_our_two_media_types_ignoring_case_and_parameters(
    content_type: str | None, expected: Format | None
) -> None:
    assert format_of(content_type) is expected


@pytest.mark.parametrize(
    ("content_type", "accept", "expected"),
    [
        ("application/msgpack", None, MSGPACK),
        ("application/json", None, JSON),
        ("application/json", "", JSON),
        ("application/json", "application/msgpack", MSGPACK),
        ("application/msgpack", "application/json", JSON),
        ("application/msgpack", "Application/JSON; charset=utf-8", JSON),
        ("application/msgpack", "*/*", MSGPACK),
        ("application/json", "application/*", JSON),
        ("application/json", "application/msgpack;q=0.9, */*;q=0.1", MSGPACK),
        ("application/json", "application/msgpack, application/json", JSON),
        ("application/msgpack", "application/json, application/msgpack;q=0.5", MSGPACK),
        ("application/json", "application/msgpack;q=0", JSON),
        ("application/json", "application/msgpack;q=bogus", MSGPACK),
        ("application/json", "text/html, application/xhtml+xml", JSON),
        (None, None, JSON),
        ("text/plain", "application/msgpack", MSGPACK),
        (None, "application/msgpack", MSGPACK),
    ],
)
def test_response_format_is_the_requests_unless_accept_names_only_the_other(
    content_type: str | None, accept: str | None, expected: Format
) -> None:
    assert response_format(content_type, accept) is expected


# --- round trips ----------------------------------------------------------------------


def ints(bounds: tuple[int, int]) -> st.SearchStrategy[int]:
    return st.integers(*bounds)


@st.composite
def topic_ids(draw: st.DrawFn) -> tuple[str, str]:
    """(topic id as spelled, canonical 22-char id)."""
    raw = draw(st.binary(min_size=16, max_size=16))
    canonical = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    if not draw(st.booleans()):
        return canonical, canonical
    h = raw.hex()
    rfc = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return (rfc.upper() if draw(st.booleans()) else rfc), canonical


@st.composite
def valid_batches(draw: st.DrawFn) -> StateBatch:
    first = draw(st.integers(0, INT64[1]))
    last = draw(st.integers(first, INT64[1]))
    return StateBatch(first, last, draw(st.sampled_from([0, 1, 2, 4])), draw(ints((0, INT16[1]))))


PARTITION = st.integers(0, INT32[1])
EPOCH = st.integers(-1, INT32[1])
REQUEST_PARTITIONS: dict[Rpc, st.SearchStrategy[Any]] = {
    Rpc.INITIALIZE: st.builds(InitializePartition, PARTITION, EPOCH, st.integers(-1, INT64[1])),
    Rpc.READ: st.builds(ReadPartition, PARTITION, EPOCH),
    Rpc.WRITE: st.builds(
        WritePartition,
        PARTITION,
        EPOCH,
        EPOCH,
        st.integers(-1, INT64[1]),
        st.lists(valid_batches(), max_size=4),
        EPOCH,
    ),
    Rpc.DELETE: st.builds(DeletePartition, PARTITION),
    Rpc.READ_SUMMARY: st.builds(ReadSummaryPartition, PARTITION, EPOCH),
}


def within_group_id_limit(text: str) -> bool:
    return len(text.encode("utf-8")) <= DEFAULT_LIMITS.max_group_id_bytes


def key_within_group_id_limit(key: str) -> bool:
    """A coordinator key's group id part is what precedes its last two ':' (trailing ':'
    dropped, as the key's parsing does)."""
    return within_group_id_limit(key.rstrip(":").rsplit(":", 2)[0])


GROUP_IDS = st.text(min_size=1).filter(within_group_id_limit)


@st.composite
def requests(draw: st.DrawFn, rpc: Rpc) -> ShareGroupStateRequest[Any]:
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        spelled, canonical = draw(topic_ids())
        partitions = draw(st.lists(REQUEST_PARTITIONS[rpc], max_size=3))
        topic = TopicRequest(spelled, partitions)
        topic.key_topic_id = canonical
        topics.append(topic)
    return ShareGroupStateRequest(draw(GROUP_IDS), topics)


any_batches = st.lists(
    st.builds(StateBatch, ints(INT64), ints(INT64), ints(INT8), ints(INT16)), max_size=4
)
messages = st.none() | st.text()
RESULTS: dict[Rpc, st.SearchStrategy[Any]] = {
    Rpc.INITIALIZE: st.builds(PartitionResult, ints(INT32), ints(INT16), messages),
    Rpc.READ: st.builds(
        ReadPartitionResult,
        ints(INT32),
        ints(INT16),
        messages,
        ints(INT32),
        ints(INT64),
        any_batches,
    ),
    Rpc.WRITE: st.builds(PartitionResult, ints(INT32), ints(INT16), messages),
    Rpc.DELETE: st.builds(PartitionResult, ints(INT32), ints(INT16), messages),
    Rpc.READ_SUMMARY: st.builds(
        ReadSummaryPartitionResult,
        ints(INT32),
        ints(INT16),
        messages,
        ints(INT32),
        ints(INT32),
        ints(INT64),
        ints(INT32),
    ),
}


@st.composite
def responses(draw: st.DrawFn, rpc: Rpc) -> ShareGroupStateResponse[Any]:
    results = draw(
        st.lists(st.builds(TopicResult, st.text(), st.lists(RESULTS[rpc], max_size=3)), max_size=3)
    )
    return ShareGroupStateResponse(results)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rpc", list(Rpc))
@given(data=st.data())
def test_request_round_trip(rpc: Rpc, fmt: Format, data: st.DataObject) -> None:
    request = data.draw(requests(rpc))
    assert decode_request(rpc, encode_request(request, fmt), fmt) == request


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rpc", list(Rpc))
@given(data=st.data())
def test_response_round_trip(rpc: Rpc, fmt: Format, data: st.DataObject) -> None:
    response = data.draw(responses(rpc))
    assert decode_response(rpc, encode_response(response, fmt), fmt) == response


@pytest.mark.parametrize("fmt", FORMATS)
@given(keys=st.lists(st.text().filter(key_within_group_id_limit)))
def test_find_coordinator_round_trip(fmt: Format, keys: list[str]) -> None:
    request = FindCoordinatorRequest(keys)
    assert decode_find_coordinator(encode_find_coordinator(request, fmt), fmt) == request


@pytest.mark.parametrize("fmt", FORMATS)
@given(
    coordinators=st.lists(
        st.builds(
            CoordinatorResult,
            st.text(),
            ints(INT32),
            ints(INT32),
            st.text(),
            ints(INT32),
            ints(INT16),
            messages,
        )
    )
)
def test_find_coordinator_response_round_trip(
    fmt: Format, coordinators: list[CoordinatorResult]
) -> None:
    response = FindCoordinatorResponse(coordinators)
    assert (
        decode_find_coordinator_response(encode_find_coordinator_response(response, fmt), fmt)
        == response
    )


@pytest.mark.parametrize("fmt", FORMATS)
@given(
    state=st.builds(
        AdminState,
        st.text(min_size=1),
        st.text(),
        ints(INT32),
        ints(INT32),
        ints(INT32),
        ints(INT32),
        ints(INT64),
        ints(INT32),
        any_batches,
        st.builds(Fencing, st.none() | ints(INT32), ints(INT32)),
    )
)
def test_admin_state_round_trip(fmt: Format, state: AdminState) -> None:
    assert decode_admin_state(encode_admin_state(state, fmt), fmt) == state


@pytest.mark.parametrize("fmt", FORMATS)
@given(code=ints(INT16), message=st.text())
def test_error_body_round_trip(fmt: Format, code: int, message: str) -> None:
    assert decode_error(encode_error(code, message, fmt), fmt) == ErrorBody(code, message)


# --- exact response shapes (docs/api.md) ---------------------------------------------------


def shape(obj: Any) -> Any:
    """Keys in order, recursively: what a reader of docs/api.md sees."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(v) for v in obj]
    return obj


BASE_RESULT = {"partition": 3, "error_code": 0, "error_message": None}


@pytest.mark.parametrize(
    ("rpc", "result", "expected"),
    [
        (Rpc.INITIALIZE, PartitionResult(3, 0, None), BASE_RESULT),
        (Rpc.WRITE, PartitionResult(3, 0, None), BASE_RESULT),
        (Rpc.DELETE, PartitionResult(3, 0, None), BASE_RESULT),
        (
            Rpc.READ,
            ReadPartitionResult(3, 0, None, 2, 100, [StateBatch(100, 109, 2, 1)]),
            {
                **BASE_RESULT,
                "state_epoch": 2,
                "start_offset": 100,
                "state_batches": [batch(100, 109, 2, 1)],
            },
        ),
        (
            Rpc.READ_SUMMARY,
            ReadSummaryPartitionResult(3, 0, None, 2, 5, 100, 7),
            {
                **BASE_RESULT,
                "state_epoch": 2,
                "leader_epoch": 5,
                "start_offset": 100,
                "delivery_complete_count": 7,
            },
        ),
    ],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_response_has_exactly_api_md_shape(
    rpc: Rpc, result: Any, expected: dict[str, Any], fmt: Format
) -> None:
    response = ShareGroupStateResponse([TopicResult(TOPIC_RFC4122, [result])])
    encoded = encode_response(response, fmt)
    obj = msgpack.unpackb(encoded) if fmt is MSGPACK else json.loads(encoded)
    assert shape(obj) == shape({"results": [{"topic_id": TOPIC_RFC4122, "partitions": [expected]}]})


def test_error_results_carry_kafkas_schema_defaults() -> None:
    read = ShareGroupStateResponse(
        [TopicResult(TOPIC, [ReadPartitionResult(1, 42, "x", 0, 0, [])])]
    )
    summary = ShareGroupStateResponse(
        [TopicResult(TOPIC, [ReadSummaryPartitionResult(1, 42, "x", 0, 0, 0, -1)])]
    )
    assert json.loads(encode_response(read, JSON))["results"][0]["partitions"][0] == {
        "partition": 1,
        "error_code": 42,
        "error_message": "x",
        "state_epoch": 0,
        "start_offset": 0,
        "state_batches": [],
    }
    assert json.loads(encode_response(summary, JSON))["results"][0]["partitions"][0] == {
        "partition": 1,
        "error_code": 42,
        "error_message": "x",
        "state_epoch": 0,
        "leader_epoch": 0,
        "start_offset": 0,
        "delivery_complete_count": -1,
    }


def test_admin_state_has_the_shape_of_spec_a1_point_10() -> None:
    state = AdminState(
        "g", TOPIC_RFC4122, 0, 3, 1, 2, 100, -1, [StateBatch(100, 101, 0, 1)], Fencing(None, 4)
    )
    assert shape(json.loads(encode_admin_state(state, JSON))) == shape(
        {
            "group_id": "g",
            "topic_id": TOPIC_RFC4122,
            "partition": 0,
            "snapshot_epoch": 3,
            "state_epoch": 1,
            "leader_epoch": 2,
            "start_offset": 100,
            "delivery_complete_count": -1,
            "state_batches": [batch(100, 101, 0, 1)],
            "fencing": {"state_epoch": None, "leader_epoch": 4},
        }
    )


def test_find_coordinator_response_has_exactly_api_md_shape() -> None:
    response = FindCoordinatorResponse(
        [
            CoordinatorResult("g:t:0", 20, 0, "127.0.0.1", 9095, 0, None),
            CoordinatorResult("bad", -1, -1, "", -1, 42, "x"),
        ]
    )
    assert shape(json.loads(encode_find_coordinator_response(response, JSON))) == shape(
        {
            "coordinators": [
                {
                    "key": "g:t:0",
                    "state_partition": 20,
                    "node_id": 0,
                    "host": "127.0.0.1",
                    "port": 9095,
                    "error_code": 0,
                    "error_message": None,
                },
                {
                    "key": "bad",
                    "state_partition": -1,
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                    "error_code": 42,
                    "error_message": "x",
                },
            ]
        }
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_error_and_admin_bodies_are_plain_maps(fmt: Format) -> None:
    load = msgpack.unpackb if fmt is MSGPACK else json.loads
    assert shape(load(encode_error(42, "bad", fmt))) == [
        ("error_code", 42),
        ("error_message", "bad"),
    ]
    assert load(encode_object({"error_code": 0, "deleted_share_partitions": 2}, fmt)) == {
        "error_code": 0,
        "deleted_share_partitions": 2,
    }


def test_json_output_is_compact_ascii_safe_utf8() -> None:
    encoded = encode_error(42, "é \ud800", JSON)
    assert encoded == b'{"error_code":42,"error_message":"\\u00e9 \\ud800"}'


@pytest.mark.parametrize("rpc", list(Rpc))
def test_request_is_spelled_per_rpc_as_api_md(rpc: Rpc) -> None:
    bodies: dict[Rpc, Any] = {
        Rpc.INITIALIZE: InitializePartition(1, 2, 3),
        Rpc.READ: ReadPartition(1, 2),
        Rpc.WRITE: WritePartition(1, 2, 3, 4, [StateBatch(5, 6, 0, 1)], 7),
        Rpc.DELETE: DeletePartition(1),
        Rpc.READ_SUMMARY: ReadSummaryPartition(1, 2),
    }
    bodies[Rpc.WRITE].invalid = "never sent"
    request = ShareGroupStateRequest("g", [TopicRequest(TOPIC_RFC4122, [bodies[rpc]])])
    sent = json.loads(encode_request(request, JSON))
    expected = {
        Rpc.INITIALIZE: {"partition": 1, "state_epoch": 2, "start_offset": 3},
        Rpc.READ: {"partition": 1, "leader_epoch": 2},
        Rpc.WRITE: {
            "partition": 1,
            "state_epoch": 2,
            "leader_epoch": 3,
            "start_offset": 4,
            "delivery_complete_count": 7,
            "state_batches": [batch(5, 6, 0, 1)],
        },
        Rpc.DELETE: {"partition": 1},
        Rpc.READ_SUMMARY: {"partition": 1, "leader_epoch": 2},
    }
    assert sent == {
        "group_id": "g",
        "topics": [{"topic_id": TOPIC_RFC4122, "partitions": [expected[rpc]]}],
    }


# --- bodies that do not parse ---------------------------------------------------------


NESTED = (
    "the body nests lists and maps too deeply to be decoded (hundreds of levels); "
    "no body of the API nests more than 7"
)
NOT_JSON = "the body is not valid JSON: "
NOT_MSGPACK = "the body is not valid msgpack: "


# Each says what is wrong in the API's words, never the parser's (no "FormatError", no
# "Expecting value: line 1 column 1 (char 0)", no "maximum recursion depth").
@pytest.mark.parametrize(
    ("fmt", "raw", "problem"),
    [
        (MSGPACK, b"", "the body is empty: expected a msgpack map"),
        (MSGPACK, b"\xc1", NOT_MSGPACK + "byte 0xc1 at offset 0, which msgpack never uses"),
        (
            MSGPACK,
            b"\x81\xa8group_id\xc1",
            NOT_MSGPACK + "byte 0xc1 at offset 10, which msgpack never uses",
        ),
        (MSGPACK, b"\x81\xa1a", NOT_MSGPACK + "it ends in the middle of a value (cut short)"),
        (
            MSGPACK,
            msgpack.packb({}) + b"\x00",
            NOT_MSGPACK
            + "1 more byte after its first value (a body is one msgpack map, and nothing after it)",
        ),
        (MSGPACK, b"\x81\x01\x02", NOT_MSGPACK + "a map key that is not a string"),
        (MSGPACK, b"\x91" * 5000 + b"\x90", NESTED),
        (
            MSGPACK,
            b"\xc7\x03\xff\x00\x00\x00",
            NOT_MSGPACK + "a timestamp (extension type -1) whose data is not 4, 8 or 12 bytes",
        ),
        (
            MSGPACK,
            b"\xef\xbb\xbf" + msgpack.packb({"group_id": "g", "topics": []}),
            "the body starts with a UTF-8 byte order mark (EF BB BF), which is no part of "
            "msgpack: send the map alone",
        ),
        (JSON, b"", "the body is empty: expected a JSON object"),
        (JSON, b" \r\n", "the body is empty: expected a JSON object"),
        (JSON, b"x", NOT_JSON + "expected a JSON object (line 1, column 1)"),
        (JSON, b"{", NOT_JSON + "expected a field name in double quotes (line 1, column 2)"),
        (JSON, b"{'a': 1}", NOT_JSON + "expected a field name in double quotes (line 1, column 2)"),
        (JSON, b'{"a" 1}', NOT_JSON + "expected ':' after a field name (line 1, column 6)"),
        (
            JSON,
            b'{"a": [1 2]}',
            NOT_JSON + "expected ',' or the end of a list or map (line 1, column 10)",
        ),
        (JSON, b'{"a": "b', NOT_JSON + "a string that is never closed (line 1, column 7)"),
        (JSON, b"{} x", NOT_JSON + "more after the end of the JSON value (line 1, column 4)"),
        (JSON, b"{}\n{}", NOT_JSON + "more after the end of the JSON value (line 2, column 1)"),
        (
            JSON,
            b'{"a": "\\x"}',
            NOT_JSON + 'an escape JSON does not have (it has \\", \\\\, \\/, \\b, \\f, \\n, \\r, '
            "\\t and \\uXXXX) (line 1, column 8)",
        ),
        (
            JSON,
            b'{"a": "\\u12"}',
            NOT_JSON + "a \\u escape without four hexadecimal digits (line 1, column 9)",
        ),
        (
            JSON,
            b'{"a":\n "x\ny"}',
            NOT_JSON + "a raw newline (U+000A) in a string; JSON carries it escaped, as \\n "
            "(line 2, column 4)",
        ),
        (
            JSON,
            b'{"group_id": "g", "topics": [], "a": "\x00"}',  # in a field nobody reads
            NOT_JSON + "a raw control character (U+0000), which JSON allows nowhere (in a "
            "string it is escaped, as \\u0000) (line 1, column 39)",
        ),
        (
            JSON,
            b'{"group_id": "g", "topics": []}\x00',
            NOT_JSON + "a control character (U+0000) outside any string (line 1, column 32)",
        ),
        (
            JSON,
            b'{"group_id": "g", "topics": []}\xff',
            NOT_JSON + "bytes that are not UTF-8 (ff); JSON is UTF-8 text (line 1, column 32)",
        ),
        (
            JSON,
            "{}".encode("utf-16"),
            "the body is UTF-16 (it starts with a UTF-16 byte order mark): send it in UTF-8",
        ),
        (
            JSON,
            b'\xef\xbb\xbf{"group_id": "g", "topics": []}',
            "the body starts with a byte order mark (EF BB BF): send the JSON text without it",
        ),
        (
            JSON,
            b'{"a": NaN}',
            NOT_JSON + "NaN is not a JSON number (JSON has no NaN, Infinity or -Infinity)",
        ),
        (
            JSON,
            b'{"a": -Infinity}',
            NOT_JSON + "-Infinity is not a JSON number (JSON has no NaN, Infinity or -Infinity)",
        ),
        (JSON, b"[" * 100_000, NESTED),
        (JSON, b"[" * 100_000 + b"]" * 100_000, NESTED),
        (JSON, b'{"group_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", NESTED),
    ],
)
def test_a_body_that_does_not_parse_is_a_body_error_saying_why(
    fmt: Format, raw: bytes, problem: str
) -> None:
    exc = body_error(lambda: decode_request(Rpc.WRITE, raw, fmt), "")
    assert exc.problem == problem


def test_an_over_long_json_int_literal_is_a_body_error_naming_its_field() -> None:
    # Python (3.11+) refuses to convert it: the message names the field, not Python's limit.
    raw = json.dumps(body(Rpc.DELETE, entry(Rpc.DELETE, partition=0))).replace(
        '"partition": 0', '"partition": ' + "9" * 5001
    )
    exc = body_error(lambda: decode_request(Rpc.DELETE, raw.encode(), JSON), f"{ENTRY}.partition")
    assert exc.problem == "expected an integer in int32 range, got an integer of 5001 digits"


def test_an_over_long_json_int_literal_in_a_field_nobody_reads_is_ignored() -> None:
    raw = b'{"group_id": "g", "topics": [], "extra": -' + b"9" * 5001 + b"}"
    assert decode_request(Rpc.DELETE, raw, JSON).group_id == "g"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("top", [[], "x", 1, None, True, 1.5, [{"group_id": "g"}]])
@pytest.mark.parametrize(("name", "decode"), DECODERS, ids=[n for n, _ in DECODERS])
def test_the_top_level_must_be_a_map(
    name: str, decode: Callable[[bytes, Format], object], fmt: Format, top: object
) -> None:
    exc = body_error(lambda: decode(encode(top, fmt), fmt), "")
    assert exc.problem.startswith("expected the body to be a map, got ")


# --- wrong types and widths -----------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [True, False, 1.0, 0.5, "1", None, [1], {"a": 1}])
@pytest.mark.parametrize(("rpc", "path", "width"), INT_FIELDS, ids=INT_FIELD_IDS)
def test_a_non_integer_where_an_integer_belongs_is_a_body_error(
    rpc: Rpc, path: str, width: tuple[int, int], bad: object, fmt: Format
) -> None:
    obj = body(rpc)
    set_path(obj, f"{ENTRY}.{path}", bad)
    exc = body_error(lambda: decode_request(rpc, encode(obj, fmt), fmt), f"{ENTRY}.{path}")
    assert "expected an integer in int" in exc.problem


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("rpc", "path", "width"), INT_FIELDS, ids=INT_FIELD_IDS)
def test_each_integer_width_bound_is_accepted_and_one_past_it_is_a_body_error(
    rpc: Rpc, path: str, width: tuple[int, int], fmt: Format
) -> None:
    lo, hi = width
    for ok in (lo, hi):
        obj = body(rpc)
        set_path(obj, f"{ENTRY}.{path}", ok)
        decode_request(rpc, encode(obj, fmt), fmt)  # edge checks may flag it; no raise
    # msgpack cannot even carry an integer below int64's minimum.
    outside = [hi + 1] + ([lo - 1] if fmt is JSON or lo > INT64[0] else [])
    for bad in outside:
        obj = body(rpc)
        set_path(obj, f"{ENTRY}.{path}", bad)
        exc = body_error(partial(decode_request, rpc, encode(obj, fmt), fmt), f"{ENTRY}.{path}")
        assert exc.problem == f"expected an integer in int{width_bits(width)} range, got {bad}"


def width_bits(width: tuple[int, int]) -> int:
    return width[1].bit_length() + 1


def test_message_names_the_field_what_was_wrong_and_what_was_expected() -> None:
    obj = body(
        Rpc.WRITE,
        entry(Rpc.WRITE),
        entry(Rpc.WRITE),
        entry(Rpc.WRITE, state_batches=[batch(), batch(count=40000)]),
    )
    with pytest.raises(BodyError) as info:
        decode_write(obj)
    assert str(info.value) == (
        "topics[0].partitions[2].state_batches[1].delivery_count: "
        "expected an integer in int16 range, got 40000"
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("topics", {"topic_id": TOPIC}, "topics"),
        ("topics", "abc", "topics"),
        ("topics[0]", [TOPIC], "topics[0]"),
        ("topics[0].partitions", {"partition": 0}, "topics[0].partitions"),
        ("topics[0].partitions", None, "topics[0].partitions"),
        ("topics[0].partitions[0]", 0, "topics[0].partitions[0]"),
        (f"{ENTRY}.state_batches", {}, f"{ENTRY}.state_batches"),
        (f"{ENTRY}.state_batches", None, f"{ENTRY}.state_batches"),
        (f"{ENTRY}.state_batches[0]", [0, 9, 0, 1], f"{ENTRY}.state_batches[0]"),
    ],
)
def test_lists_must_be_lists_and_maps_must_be_maps(
    path: str, value: object, field: str, fmt: Format
) -> None:
    obj = body(Rpc.WRITE)
    set_path(obj, path, value)
    exc = body_error(lambda: decode_write(obj, fmt), field)
    assert exc.problem.startswith("expected a ")


REQUIRED = {
    Rpc.INITIALIZE: ["partition", "state_epoch", "start_offset"],
    Rpc.READ: ["partition", "leader_epoch"],
    Rpc.WRITE: [
        "partition",
        "state_epoch",
        "leader_epoch",
        "start_offset",
        "state_batches",
        "state_batches[0].first_offset",
        "state_batches[0].last_offset",
        "state_batches[0].delivery_state",
        "state_batches[0].delivery_count",
    ],
    Rpc.DELETE: ["partition"],
    Rpc.READ_SUMMARY: ["partition"],
}
MISSING_CASES = [
    (rpc, path)
    for rpc in Rpc
    for path in ["group_id", "topics", "topics[0].topic_id", "topics[0].partitions"]
    + [f"{ENTRY}.{f}" for f in REQUIRED[rpc]]
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("rpc", "path"), MISSING_CASES, ids=[f"{r.value}:{p}" for r, p in MISSING_CASES]
)
def test_a_missing_required_field_is_a_body_error(rpc: Rpc, path: str, fmt: Format) -> None:
    obj = body(rpc)
    set_path(obj, path, DELETE)
    exc = body_error(lambda: decode_request(rpc, encode(obj, fmt), fmt), path)
    assert exc.problem.startswith("missing required field, expected ")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("group_id", ["", 0, None, ["g"], True])
def test_group_id_must_be_a_non_empty_string(group_id: object, fmt: Format) -> None:
    obj = body(Rpc.READ)
    obj["group_id"] = group_id
    exc = body_error(lambda: decode_request(Rpc.READ, encode(obj, fmt), fmt), "group_id")
    assert exc.problem.startswith("expected a non-empty string, got ")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "topic_id",
    [
        "",
        "WwwvDo06T2ueIXxNGis8T",  # 21 chars
        "WwwvDo06T2ueIXxNGis8TQ==",  # padded: only find-coordinator keys accept it
        "WwwvDo06T2ueIXxNGis8T+",  # not base64url
        "5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4g",
        "5b0c2f0e8d3a4f6b9e217c4d1a2b3c4d",
        "{5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d}",
        " WwwvDo06T2ueIXxNGis8TQ",
        "ＷwwvDo06T2ueIXxNGis8TQ",  # a fullwidth letter
        22,
        None,
    ],
)
def test_topic_id_must_be_a_kafka_uuid(topic_id: object, fmt: Format) -> None:
    obj = body(Rpc.DELETE)
    obj["topics"][0]["topic_id"] = topic_id
    exc = body_error(
        lambda: decode_request(Rpc.DELETE, encode(obj, fmt), fmt), "topics[0].topic_id"
    )
    assert "a Kafka topic id" in exc.problem


@pytest.mark.parametrize(
    ("path", "field"),
    [("group_id", "group_id"), ("topics[0].topic_id", "topics[0].topic_id")],
)
def test_a_lone_surrogate_in_a_stored_string_is_a_body_error(path: str, field: str) -> None:
    obj = body(Rpc.READ)
    set_path(obj, path, "g\ud800")
    raw = json.dumps(obj).encode()
    assert b"\\ud800" in raw
    exc = body_error(lambda: decode_request(Rpc.READ, raw, JSON), field)
    assert exc.problem == (
        "expected valid Unicode text, got a lone surrogate (\\ud800) at character 1 of the string"
    )


# --- hostile bytes in strings ---------------------------------------------------------------

# Every string field of every request body, as (decoder, a valid body, the field).
STRING_FIELDS: list[tuple[str, Callable[[bytes, Format], object], Callable[[], Any], str]] = [
    *[
        (f"{r.value} {field}", partial(decode_request, r), partial(body, r), field)
        for r in Rpc
        for field in ("group_id", "topics[0].topic_id")
    ],
    *[
        (
            f"find-coordinator {field}",
            decode_find_coordinator,
            lambda: {"keys": [f"g:{TOPIC}:0", f"h:{TOPIC}:1"]},
            field,
        )
        for field in ("keys[0]", "keys[1]")
    ],
    (
        "topic registration topic_id",
        decode_topic_registration,
        lambda: {"topic_id": TOPIC, "partition_count": 3},
        "topic_id",
    ),
]


def hostile_cases(fmt: Format) -> list[Any]:
    return [
        pytest.param(decode, make, field, raw, problem, id=f"{name}-{kind}")
        for name, decode, make, field in STRING_FIELDS
        for kind, (raw, problem) in hostile_strings(fmt).items()
    ]


def with_raw_string(obj: Any, field: str, raw: bytes, fmt: Format) -> bytes:
    """``obj`` encoded with the string at ``field`` made of exactly the bytes ``raw``."""
    set_path(obj, field, PLACEHOLDER)
    return encode_with(obj, raw, fmt)


@pytest.mark.parametrize(
    ("fmt", "decode", "make", "field", "raw", "problem"),
    [
        pytest.param(fmt, *case.values, id=f"{fmt.name}-{case.id}")
        for fmt in FORMATS
        for case in hostile_cases(fmt)
    ],
)
def test_hostile_bytes_at_every_string_field_are_a_body_error_naming_it(
    fmt: Format,
    decode: Callable[[bytes, Format], object],
    make: Callable[[], Any],
    field: str,
    raw: bytes,
    problem: str,
) -> None:
    encoded = with_raw_string(make(), field, raw, fmt)
    decode(encode(make(), fmt), fmt)  # the body is valid without them
    exc = body_error(lambda: decode(encoded, fmt), field)
    assert exc.problem == problem


@pytest.mark.parametrize(
    ("fmt", "raw"),
    [(MSGPACK, b"a\x00b"), (JSON, b"a\\u0000b"), (MSGPACK, b"\x00"), (JSON, b"\\u0000")],
)
def test_nul_is_a_character_like_any_other_in_a_group_id(fmt: Format, raw: bytes) -> None:
    """Kafka takes any string as a group id, NUL included; both encodings carry it (JSON
    escaped), and the Kafka listener takes it too."""
    encoded = with_raw_string(body(Rpc.READ), "group_id", raw, fmt)
    assert decode_request(Rpc.READ, encoded, fmt).group_id == raw.decode("unicode_escape")


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_that_are_not_utf8_in_a_field_nobody_reads_are_ignored(fmt: Format) -> None:
    """As msgspec skips them: unknown fields are ignored, whatever they hold."""
    obj = body(Rpc.READ)
    obj["extra"] = "x"
    encoded = with_raw_string(obj, "extra", b"\xff\xed\xa0\x80", fmt)
    assert decode_request(Rpc.READ, encoded, fmt).group_id == "g"


@pytest.mark.parametrize(
    ("path", "field"),
    [("group_id", "group_id"), ("topics[0].topic_id", "topics[0].topic_id")],
)
def test_msgpack_bin_where_a_string_belongs_is_a_body_error(path: str, field: str) -> None:
    obj = body(Rpc.READ)
    set_path(obj, path, TOPIC.encode())
    exc = body_error(lambda: decode_request(Rpc.READ, encode(obj, MSGPACK), MSGPACK), field)
    assert exc.problem.endswith("got binary data (msgpack bin)")


def test_a_msgpack_extension_where_an_integer_belongs_is_a_body_error() -> None:
    obj = body(Rpc.READ, entry(Rpc.READ, partition=msgpack.ExtType(5, b"x")))
    exc = body_error(
        lambda: decode_request(Rpc.READ, encode(obj, MSGPACK), MSGPACK), f"{ENTRY}.partition"
    )
    assert exc.problem == "expected an integer in int32 range, got a msgpack ExtType"


# --- limits ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_more_partition_entries_than_the_limit_is_a_body_error(fmt: Format) -> None:
    limits = Limits(max_entries_per_request=4)
    obj = body(Rpc.READ, entry(Rpc.READ), entry(Rpc.READ))
    obj["topics"].append({"topic_id": TOPIC, "partitions": [entry(Rpc.READ), entry(Rpc.READ)]})
    assert decode_request(Rpc.READ, encode(obj, fmt), fmt, limits).entry_count() == 4
    obj["topics"].append({"topic_id": TOPIC, "partitions": [entry(Rpc.READ)]})
    exc = body_error(lambda: decode_request(Rpc.READ, encode(obj, fmt), fmt, limits), "topics")
    assert exc.problem == (
        "5 entries (partition entries, and 1 per topic without any), more than the limit of 4"
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_topic_without_partitions_counts_as_one_entry_against_the_limit(fmt: Format) -> None:
    limits = Limits(max_entries_per_request=3)
    empty_topics = {"group_id": "g", "topics": [{"topic_id": TOPIC, "partitions": []}] * 3}
    assert len(decode_request(Rpc.READ, encode(empty_topics, fmt), fmt, limits).topics) == 3
    empty_topics["topics"] = empty_topics["topics"] * 2
    exc = body_error(
        lambda: decode_request(Rpc.READ, encode(empty_topics, fmt), fmt, limits), "topics"
    )
    assert exc.problem.startswith("6 entries")


@pytest.mark.parametrize("fmt", FORMATS)
def test_more_state_batches_than_the_limit_is_a_body_error(fmt: Format) -> None:
    limits = Limits(max_state_batches_per_entry=2)
    ok = entry(Rpc.WRITE, state_batches=[batch(0, 0), batch(1, 1)])
    decode_write(body(Rpc.WRITE, ok), fmt, limits)
    too_many = entry(Rpc.WRITE, state_batches=[batch(0, 0), batch(1, 1), batch(2, 2)])
    exc = body_error(
        lambda: decode_write(body(Rpc.WRITE, ok, too_many), fmt, limits),
        "topics[0].partitions[1].state_batches",
    )
    assert exc.problem == "3 state batches, more than the limit of 2"


def test_default_limits_are_5000_entries_10000_batches_and_255_byte_group_ids() -> None:
    assert Limits() == Limits(
        max_entries_per_request=5000, max_state_batches_per_entry=10000, max_group_id_bytes=255
    )


# A group id of exactly 255 bytes, in each width UTF-8 has: 1, 2, 3 and 4 bytes a character.
GROUP_IDS_AT_THE_LIMIT = ["g" * 255, "é" * 127 + "g", "€" * 85, "𝄞" * 63 + "ggg"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rpc", list(Rpc))
@pytest.mark.parametrize("group_id", GROUP_IDS_AT_THE_LIMIT, ids=["1", "2", "3", "4"])
def test_a_group_id_of_exactly_the_limit_in_utf8_bytes_is_accepted(
    group_id: str, rpc: Rpc, fmt: Format
) -> None:
    assert len(group_id.encode()) == 255
    obj = body(rpc)
    obj["group_id"] = group_id
    assert decode_request(rpc, encode(obj, fmt), fmt).group_id == group_id


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rpc", list(Rpc))
@pytest.mark.parametrize("group_id", GROUP_IDS_AT_THE_LIMIT, ids=["1", "2", "3", "4"])
def test_a_group_id_one_byte_over_the_limit_is_a_body_error_naming_the_limit(
    group_id: str, rpc: Rpc, fmt: Format
) -> None:
    obj = body(rpc)
    obj["group_id"] = group_id + "g"
    exc = body_error(lambda: decode_request(rpc, encode(obj, fmt), fmt), "group_id")
    assert exc.problem == "256 bytes, over the limit of 255 (max_group_id_bytes)"


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_group_id_limit_counts_utf8_bytes_not_characters(fmt: Format) -> None:
    limits = Limits(max_group_id_bytes=8)
    obj = body(Rpc.READ)
    obj["group_id"] = "€€€"  # 3 characters, 9 bytes
    exc = body_error(lambda: decode_request(Rpc.READ, encode(obj, fmt), fmt, limits), "group_id")
    assert exc.problem == "9 bytes, over the limit of 8 (max_group_id_bytes)"
    obj["group_id"] = "€€gg"  # 4 characters, 8 bytes
    assert decode_request(Rpc.READ, encode(obj, fmt), fmt, limits).group_id == "€€gg"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_group_id_over_the_limit_is_refused_even_without_topics(fmt: Format) -> None:
    obj = {"group_id": "g" * (1 << 20), "topics": []}
    exc = body_error(lambda: decode_request(Rpc.WRITE, encode(obj, fmt), fmt), "group_id")
    assert exc.problem == "1048576 bytes, over the limit of 255 (max_group_id_bytes)"


# --- edge checks: the entry fails alone with 42 ---------------------------------------


EDGE_CASES = [
    (Rpc.INITIALIZE, {"partition": -1}, MSG_NEGATIVE_PARTITION),
    (Rpc.READ, {"partition": -1}, MSG_NEGATIVE_PARTITION),
    (Rpc.WRITE, {"partition": -1}, MSG_NEGATIVE_PARTITION),
    (Rpc.DELETE, {"partition": INT32[0]}, MSG_NEGATIVE_PARTITION),
    (Rpc.READ_SUMMARY, {"partition": -1}, MSG_NEGATIVE_PARTITION),
    (Rpc.INITIALIZE, {"state_epoch": -2}, "state_epoch must be -1 or greater, got -2"),
    (Rpc.INITIALIZE, {"start_offset": -2}, "start_offset must be -1 or greater, got -2"),
    (Rpc.READ, {"leader_epoch": INT32[0]}, f"leader_epoch must be -1 or greater, got {INT32[0]}"),
    (Rpc.WRITE, {"state_epoch": -2}, "state_epoch must be -1 or greater, got -2"),
    (Rpc.WRITE, {"leader_epoch": -2}, "leader_epoch must be -1 or greater, got -2"),
    (Rpc.WRITE, {"start_offset": -2}, "start_offset must be -1 or greater, got -2"),
    (
        Rpc.WRITE,
        {"delivery_complete_count": -2},
        "delivery_complete_count must be -1 or greater, got -2",
    ),
    (Rpc.READ_SUMMARY, {"leader_epoch": -2}, "leader_epoch must be -1 or greater, got -2"),
    (
        Rpc.WRITE,
        {"state_batches": [batch(-1, 5)]},
        "state_batches[0]: first_offset must be 0 or greater, got -1",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(0, -1)]},
        "state_batches[0]: last_offset must be 0 or greater, got -1",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(0, 4), batch(10, 5)]},
        "state_batches[1]: first_offset 10 is greater than last_offset 5",
    ),
    *[
        (
            Rpc.WRITE,
            {"state_batches": [batch(state=state)]},
            f"state_batches[0]: delivery_state must be one of 0, 1, 2, 4, got {state}",
        )
        for state in (3, 5, -1, 127, -128)
    ],
    (
        Rpc.WRITE,
        {"state_batches": [batch(count=-1)]},
        "state_batches[0]: delivery_count must be 0 or greater, got -1",
    ),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("rpc", "fields", "message"), EDGE_CASES, ids=[m for _, _, m in EDGE_CASES]
)
def test_an_edge_check_fails_the_entry_alone_with_a_message(
    rpc: Rpc, fields: dict[str, Any], message: str, fmt: Format
) -> None:
    obj = body(rpc, entry(rpc), entry(rpc, **fields), entry(rpc))
    partitions = decode_request(rpc, encode(obj, fmt), fmt).topics[0].partitions
    assert [p.invalid for p in partitions] == [None, message, None]


@pytest.mark.parametrize(
    ("rpc", "fields"),
    [
        (Rpc.INITIALIZE, {"partition": 0, "state_epoch": -1, "start_offset": -1}),
        (Rpc.READ, {"leader_epoch": -1}),
        (
            Rpc.WRITE,
            {
                "state_epoch": -1,
                "leader_epoch": -1,
                "start_offset": -1,
                "delivery_complete_count": -1,
                "state_batches": [
                    batch(0, 0, 0, 0),
                    batch(1, 1, 1, 0),
                    batch(2, 2, 2, 0),
                    batch(3, 3, 4, 32767),
                ],
            },
        ),
        (Rpc.WRITE, {"state_batches": []}),
        (Rpc.READ_SUMMARY, {"leader_epoch": -1}),
    ],
)
def test_values_at_the_edge_bounds_are_valid(rpc: Rpc, fields: dict[str, Any]) -> None:
    decoded = decode_request(rpc, encode(body(rpc, entry(rpc, **fields)), JSON), JSON)
    assert decoded.topics[0].partitions[0].invalid is None


ORDER_CASES = [
    (
        Rpc.INITIALIZE,
        {"partition": -1, "state_epoch": -2, "start_offset": -2},
        MSG_NEGATIVE_PARTITION,
    ),
    (
        Rpc.INITIALIZE,
        {"state_epoch": -2, "start_offset": -2},
        "state_epoch must be -1 or greater, got -2",
    ),
    (Rpc.READ_SUMMARY, {"partition": -1, "leader_epoch": -2}, MSG_NEGATIVE_PARTITION),
    (Rpc.WRITE, {"partition": -1, "state_epoch": -2}, MSG_NEGATIVE_PARTITION),
    (
        Rpc.WRITE,
        {"state_epoch": -2, "leader_epoch": -3},
        "state_epoch must be -1 or greater, got -2",
    ),
    (
        Rpc.WRITE,
        {"leader_epoch": -3, "start_offset": -4},
        "leader_epoch must be -1 or greater, got -3",
    ),
    (
        Rpc.WRITE,
        {"start_offset": -4, "delivery_complete_count": -5},
        "start_offset must be -1 or greater, got -4",
    ),
    (
        Rpc.WRITE,
        {"delivery_complete_count": -5, "state_batches": [batch(count=-1)]},
        "delivery_complete_count must be -1 or greater, got -5",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(), batch(9, 3), batch(-1, 0)]},
        "state_batches[1]: first_offset 9 is greater than last_offset 3",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(-1, -5, 3, -1)]},
        "state_batches[0]: first_offset must be 0 or greater, got -1",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(5, -5, 3, -1)]},
        "state_batches[0]: last_offset must be 0 or greater, got -5",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(5, 4, 3, -1)]},
        "state_batches[0]: first_offset 5 is greater than last_offset 4",
    ),
    (
        Rpc.WRITE,
        {"state_batches": [batch(4, 5, 3, -1)]},
        "state_batches[0]: delivery_state must be one of 0, 1, 2, 4, got 3",
    ),
]


@pytest.mark.parametrize(
    ("rpc", "fields", "message"), ORDER_CASES, ids=[m for _, _, m in ORDER_CASES]
)
def test_edge_checks_run_in_order_and_the_first_failure_wins(
    rpc: Rpc, fields: dict[str, Any], message: str
) -> None:
    decoded = decode_request(rpc, encode(body(rpc, entry(rpc, **fields)), JSON), JSON)
    assert decoded.topics[0].partitions[0].invalid == message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"partition": -1, "leader_epoch": "1"}, f"{ENTRY}.leader_epoch"),
        ({"partition": -1, "start_offset": 2**63}, f"{ENTRY}.start_offset"),
        (
            {"state_batches": [batch(9, 3), batch(count=True)]},
            f"{ENTRY}.state_batches[1].delivery_count",
        ),
    ],
)
def test_an_invalid_entry_still_has_its_other_fields_type_checked(
    fields: dict[str, Any], field: str
) -> None:
    body_error(lambda: decode_write(body(Rpc.WRITE, entry(Rpc.WRITE, **fields))), field)


def test_an_out_of_width_value_is_a_body_error_but_a_negative_one_is_an_edge_check() -> None:
    edge = decode_write(body(Rpc.WRITE, entry(Rpc.WRITE, state_batches=[batch(count=-1)])))
    assert edge.topics[0].partitions[0].invalid is not None
    body_error(
        lambda: decode_write(
            body(Rpc.WRITE, entry(Rpc.WRITE, state_batches=[batch(count=-32769)]))
        ),
        f"{ENTRY}.state_batches[0].delivery_count",
    )


# --- defaults and echoes --------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_without_delivery_complete_count_defaults_to_minus_one(fmt: Format) -> None:
    e = entry(Rpc.WRITE)
    del e["delivery_complete_count"]
    decoded = decode_write(body(Rpc.WRITE, e), fmt)
    assert decoded.topics[0].partitions[0].delivery_complete_count == -1


@pytest.mark.parametrize("fmt", FORMATS)
def test_read_summary_without_leader_epoch_defaults_to_minus_one(fmt: Format) -> None:
    raw = encode(body(Rpc.READ_SUMMARY, {"partition": 4}), fmt)
    decoded = decode_request(Rpc.READ_SUMMARY, raw, fmt)
    assert decoded.topics[0].partitions == [ReadSummaryPartition(4, -1)]


@pytest.mark.parametrize(
    ("rpc", "path"),
    [(Rpc.WRITE, "delivery_complete_count"), (Rpc.READ_SUMMARY, "leader_epoch")],
)
def test_an_optional_field_given_as_null_is_a_body_error(rpc: Rpc, path: str) -> None:
    obj = body(rpc, entry(rpc, **{path: None}))
    exc = body_error(lambda: decode_request(rpc, encode(obj, JSON), JSON), f"{ENTRY}.{path}")
    assert exc.problem.endswith("got null")


@pytest.mark.parametrize("fmt", FORMATS)
def test_unknown_fields_are_ignored_everywhere(fmt: Format) -> None:
    obj = body(Rpc.WRITE, {**entry(Rpc.WRITE), "extra": [1, {"x": None}]})
    obj["extra"] = {"nested": True}
    obj["topics"][0]["topic_name"] = "orders"
    obj["topics"][0]["partitions"][0]["state_batches"][0]["note"] = 1.5
    expected = decode_write(body(Rpc.WRITE), fmt)
    assert decode_write(obj, fmt) == expected


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("spelled", "canonical"),
    [
        (TOPIC, TOPIC),
        ("5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d", "WwwvDo06T2ueIXxNGis8TQ"),
        ("5B0C2F0E-8D3A-4F6B-9E21-7C4D1A2B3C4D", "WwwvDo06T2ueIXxNGis8TQ"),
        ("AAAAAAAAAAAAAAAAAAAAAR", "AAAAAAAAAAAAAAAAAAAAAQ"),  # unused low bits dropped
    ],
)
def test_topic_id_is_echoed_as_spelled_and_keyed_canonically(
    spelled: str, canonical: str, fmt: Format
) -> None:
    decoded = decode_request(Rpc.DELETE, encode(body(Rpc.DELETE, topic_id=spelled), fmt), fmt)
    topic = decoded.topics[0]
    assert (topic.topic_id, topic.key_topic_id) == (spelled, canonical)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_topics_and_empty_partitions_are_fine(fmt: Format) -> None:
    raw = encode({"group_id": "g", "topics": []}, fmt)
    assert decode_request(Rpc.WRITE, raw, fmt) == ShareGroupStateRequest("g", [])
    raw = encode({"group_id": "g", "topics": [{"topic_id": TOPIC, "partitions": []}]}, fmt)
    assert decode_request(Rpc.WRITE, raw, fmt).topics == [TopicRequest(TOPIC, [])]


def test_a_duplicated_entry_is_decoded_twice_in_order() -> None:
    obj = body(Rpc.DELETE, {"partition": 1}, {"partition": 0}, {"partition": 1})
    decoded = decode_request(Rpc.DELETE, encode(obj, JSON), JSON)
    assert [p.partition for p in decoded.topics[0].partitions] == [1, 0, 1]


# --- find-coordinator and topic registration ------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_find_coordinator_keys_are_not_parsed_here(fmt: Format) -> None:
    keys = ["g:AAAAAAAAAAAAAAAAAAAAAQ:0", "", "no colons", "g:t:x:y"]
    assert decode_find_coordinator(encode({"keys": keys}, fmt), fmt).keys == keys


@pytest.mark.parametrize(
    ("fmt", "obj", "field"),
    [
        (JSON, {}, "keys"),
        (JSON, {"keys": "g:t:0"}, "keys"),
        (JSON, {"keys": ["ok", 1]}, "keys[1]"),
        (JSON, {"keys": ["ok", None]}, "keys[1]"),
        (JSON, {"keys": ["\udc80"]}, "keys[0]"),  # echoed, so must encode
        (MSGPACK, {"keys": [b"g:t:0"]}, "keys[0]"),
    ],
)
def test_find_coordinator_keys_must_be_a_list_of_strings(
    fmt: Format, obj: object, field: str
) -> None:
    body_error(lambda: decode_find_coordinator(encode(obj, fmt), fmt), field)


def test_more_find_coordinator_keys_than_the_limit_is_a_body_error() -> None:
    limits = Limits(max_entries_per_request=2)
    assert decode_find_coordinator(encode({"keys": ["a", "b"]}, JSON), JSON, limits).keys == [
        "a",
        "b",
    ]
    exc = body_error(
        lambda: decode_find_coordinator(encode({"keys": ["a", "b", "c"]}, JSON), JSON, limits),
        "keys",
    )
    assert exc.problem == "3 keys, more than the limit of 2"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_find_coordinator_key_whose_group_id_is_over_the_limit_is_a_body_error(
    fmt: Format,
) -> None:
    at_the_limit = [
        "€" * 85 + f":{TOPIC}:0",
        "g" * 255,  # no ':': all of it is the group id part
        "g" * 255 + ":" + "x" * 1000,
        "g:" * 127 + f"g:{TOPIC}:0",  # a ':' before the last two is the group id's
        "g" * 255 + f":{TOPIC}:0:::",  # trailing ':' are no part at all
    ]
    assert decode_find_coordinator(encode({"keys": at_the_limit}, fmt), fmt).keys == at_the_limit
    for over in ["€" * 85 + "g" + f":{TOPIC}:0", "g" * 256, "g:" * 128 + f":{TOPIC}:0"]:
        keys = ["g:t:0", over]
        exc = body_error(
            lambda keys=keys: decode_find_coordinator(encode({"keys": keys}, fmt), fmt), "keys[1]"
        )
        assert exc.problem.startswith("its group id: 256 bytes, over the limit of 255"), over


@pytest.mark.parametrize("fmt", FORMATS)
def test_topic_registration_returns_the_id_as_spelled_its_canonical_form_and_the_count(
    fmt: Format,
) -> None:
    raw = encode({"topic_id": TOPIC_RFC4122, "partition_count": 12, "x": 1}, fmt)
    assert decode_topic_registration(raw, fmt) == (TOPIC_RFC4122, TOPIC, 12)
    raw = encode({"topic_id": TOPIC, "partition_count": INT32[1]}, fmt)
    assert decode_topic_registration(raw, fmt) == (TOPIC, TOPIC, INT32[1])


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"partition_count": 1}, "topic_id"),
        ({"topic_id": "nope", "partition_count": 1}, "topic_id"),
        ({"topic_id": TOPIC}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": 0}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": -1}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": 2**31}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": True}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": 3.0}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": "3"}, "partition_count"),
    ],
)
def test_topic_registration_needs_a_topic_id_and_an_int32_count_of_at_least_one(
    obj: dict[str, Any], field: str
) -> None:
    body_error(lambda: decode_topic_registration(encode(obj, JSON), JSON), field)


# --- client-side decoders on malformed answers ----------------------------------------


@pytest.mark.parametrize(
    ("decode", "obj", "field"),
    [
        (partial(decode_response, Rpc.WRITE), {}, "results"),
        (
            partial(decode_response, Rpc.WRITE),
            {"results": [{"topic_id": TOPIC, "partitions": [{"partition": 0, "error_code": 0}]}]},
            "results[0].partitions[0].error_message",
        ),
        (
            partial(decode_response, Rpc.READ),
            {
                "results": [
                    {
                        "topic_id": TOPIC,
                        "partitions": [
                            {
                                **BASE_RESULT,
                                "state_epoch": 0,
                                "start_offset": 0,
                                "state_batches": [{}],
                            }
                        ],
                    }
                ]
            },
            "results[0].partitions[0].state_batches[0].first_offset",
        ),
        (
            partial(decode_response, Rpc.READ_SUMMARY),
            {"results": [{"topic_id": TOPIC, "partitions": [BASE_RESULT]}]},
            "results[0].partitions[0].state_epoch",
        ),
        (
            decode_find_coordinator_response,
            {"coordinators": [{"key": "k"}]},
            "coordinators[0].state_partition",
        ),
        (
            decode_admin_state,
            {
                "group_id": "g",
                "topic_id": TOPIC,
                "partition": 0,
                "snapshot_epoch": 0,
                "state_epoch": 0,
                "leader_epoch": 0,
                "start_offset": 0,
                "delivery_complete_count": -1,
                "state_batches": [],
            },
            "fencing",
        ),
        (decode_error, {"error_code": 42, "error_message": None}, "error_message"),
        (decode_error, {"error_code": 1.0, "error_message": "x"}, "error_code"),
        (decode_error, {"error_code": 2**15, "error_message": "x"}, "error_code"),
        (
            partial(decode_response, Rpc.DELETE),
            {
                "results": [
                    {"topic_id": TOPIC, "partitions": [{**BASE_RESULT, "error_code": -(2**15) - 1}]}
                ]
            },
            "results[0].partitions[0].error_code",
        ),
    ],
)
def test_client_decoders_name_the_field_of_a_malformed_answer(
    decode: Callable[[bytes, Format], object], obj: object, field: str
) -> None:
    body_error(lambda: decode(encode(obj, JSON), JSON), field)


def test_body_error_survives_pickling() -> None:
    exc = BodyError("topics[0].topic_id", "expected a Kafka topic id, got 1")
    copy = pickle.loads(pickle.dumps(exc))
    assert (copy.field, copy.problem, str(copy)) == (exc.field, exc.problem, str(exc))


def test_body_error_under_builds_the_field_path() -> None:
    assert BodyError("[2].partition", "x").under("topics[0].partitions").field == (
        "topics[0].partitions[2].partition"
    )
    assert BodyError("state_epoch", "x").under("topics[0]").field == "topics[0].state_epoch"
    assert BodyError("", "x").under("topics").field == "topics"


# --- fuzz: only ever BodyError or success ---------------------------------------------


WIDTH_EDGES = [
    b for w in (INT8, INT16, INT32, INT64) for lo, hi in [w] for b in (lo - 1, lo, hi, hi + 1)
]
scalar_ints = st.integers() | st.sampled_from([*WIDTH_EDGES, -2, -1, 0, 1, 3])
json_text = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters())
json_values = st.recursive(
    st.none() | st.booleans() | scalar_ints | st.floats() | json_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
    max_leaves=12,
)
msgpack_ints = st.integers(INT64[0], 2**64 - 1) | st.sampled_from(
    [b for b in WIDTH_EDGES if INT64[0] <= b < 2**64]
)
msgpack_keys = st.text() | st.binary(max_size=4) | st.integers(0, 9)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | msgpack_ints
    | st.floats()
    | st.text()
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(msgpack_keys, inner, max_size=4),
    max_leaves=12,
)


def only_body_errors(decode: Callable[[bytes, Format], object], raw: bytes, fmt: Format) -> None:
    try:
        decode(raw, fmt)
    except BodyError as exc:
        str(exc).encode("utf-8")  # the message itself can always be sent


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("name", "decode"), DECODERS, ids=[n for n, _ in DECODERS])
@given(raw=st.binary())
def test_arbitrary_bytes_give_only_body_errors(
    name: str, decode: Callable[[bytes, Format], object], fmt: Format, raw: bytes
) -> None:
    only_body_errors(decode, raw, fmt)


@pytest.mark.parametrize(("name", "decode"), DECODERS, ids=[n for n, _ in DECODERS])
@given(data=st.data())
def test_arbitrary_structures_give_only_body_errors(
    name: str, decode: Callable[[bytes, Format], object], data: st.DataObject
) -> None:
    if data.draw(st.booleans()):
        raw = json.dumps(data.draw(json_values)).encode()
        only_body_errors(decode, raw, JSON)
    else:
        only_body_errors(
            decode, msgpack.packb(data.draw(msgpack_values), use_bin_type=True), MSGPACK
        )


def valid_body(name: str) -> dict[str, Any]:
    """A rich valid body for each decoder, to be damaged at one place."""
    if name.startswith("decode_request["):
        rpc = Rpc(name[len("decode_request[") : -1])
        two = {"topic_id": TOPIC_RFC4122, "partitions": [entry(rpc), entry(rpc, partition=1)]}
        obj = body(rpc, entry(rpc), entry(rpc, partition=-1))
        obj["topics"].append(two)
        return obj
    if name == "decode_find_coordinator":
        return {"keys": ["g:AAAAAAAAAAAAAAAAAAAAAQ:0", "x"]}
    if name == "decode_topic_registration":
        return {"topic_id": TOPIC, "partition_count": 3}
    if name.startswith("decode_response["):
        rpc = Rpc(name[len("decode_response[") : -1])
        result = ShareGroupStateResponse(
            [
                TopicResult(
                    TOPIC,
                    [
                        ReadPartitionResult(0, 0, None, 1, 2, [StateBatch(2, 3, 0, 1)])
                        if rpc is Rpc.READ
                        else ReadSummaryPartitionResult(0, 42, "x", 0, 0, 0, -1)
                        if rpc is Rpc.READ_SUMMARY
                        else PartitionResult(0, 0, None)
                    ],
                )
            ],
        )
        loaded: dict[str, Any] = json.loads(encode_response(result, JSON))
        return loaded
    if name == "decode_find_coordinator_response":
        response = FindCoordinatorResponse([CoordinatorResult("k", 1, 0, "h", 9095, 0, None)])
        fc: dict[str, Any] = json.loads(encode_find_coordinator_response(response, JSON))
        return fc
    if name == "decode_admin_state":
        state = AdminState("g", TOPIC, 0, 0, 0, 0, 0, -1, [StateBatch(0, 1, 0, 1)], Fencing(0, 0))
        admin: dict[str, Any] = json.loads(encode_admin_state(state, JSON))
        return admin
    assert name == "decode_error"
    return {"error_code": 42, "error_message": "x"}


def slots(obj: Any) -> list[tuple[Any, Any]]:
    """Every place in ``obj`` where a value can be replaced, deleted or added."""
    found: list[tuple[Any, Any]] = []
    if isinstance(obj, dict):
        found.append((obj, "unknown_field"))
        for key, value in obj.items():
            found.append((obj, key))
            found.extend(slots(value))
    elif isinstance(obj, list):
        found.append((obj, len(obj)))
        for i, value in enumerate(obj):
            found.append((obj, i))
            found.extend(slots(value))
    return found


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("name", "decode"), DECODERS, ids=[n for n, _ in DECODERS])
@given(data=st.data())
def test_arbitrary_values_inside_valid_bodies_give_only_body_errors(
    name: str, decode: Callable[[bytes, Format], object], fmt: Format, data: st.DataObject
) -> None:
    obj = valid_body(name)
    only_body_errors(decode, encode(obj, fmt), fmt)
    decode(encode(obj, fmt), fmt)  # the undamaged body is valid
    container, where = data.draw(st.sampled_from(slots(obj)))
    if data.draw(st.booleans()) and where != len(container) and where != "unknown_field":
        del container[where]
    else:
        value = data.draw(json_values if fmt is JSON else msgpack_values)
        if isinstance(container, list) and where == len(container):
            container.append(value)
        else:
            container[where] = value
    only_body_errors(decode, encode(obj, fmt), fmt)


@settings(max_examples=50)
@given(request=requests(Rpc.WRITE), junk=st.binary(min_size=1, max_size=4))
def test_a_valid_body_with_trailing_bytes_is_a_body_error(
    request: ShareGroupStateRequest[Any], junk: bytes
) -> None:
    raw = encode_request(request, MSGPACK) + junk
    body_error(lambda: decode_request(Rpc.WRITE, raw, MSGPACK), "")


@pytest.mark.parametrize("fmt", FORMATS)
def test_nesting_too_deep_in_an_unknown_field_is_a_body_error_or_ignored(fmt: Format) -> None:
    depth = 5000  # deeper than any parser here recurses
    if fmt is MSGPACK:
        head = b"\x83" + b"".join(msgpack.packb(x) for x in ("group_id", "g", "topics", []))
        raw = head + msgpack.packb("extra") + b"\x91" * depth + b"\x90"
    else:
        raw = b'{"group_id": "g", "topics": [], "extra": ' + b"[" * depth + b"]" * depth + b"}"
    only_body_errors(partial(decode_request, Rpc.DELETE), raw, fmt)


@pytest.mark.parametrize(
    ("raw", "fmt"),
    [
        # Ill-typed: the walk of the parse finds the problem.
        (msgpack.packb({"group_id": 7, "topics": []}), MSGPACK),
        (b'{"group_id": 7, "topics": []}', JSON),
        # Well-typed but not JSON (a raw control character in a string).
        (b'{"group_id": "g\x01", "topics": []}', JSON),
        # Not JSON at all.
        (b'{"group_id": ', JSON),
    ],
    ids=["msgpack-ill-typed", "json-ill-typed", "json-raw-control", "json-cut"],
)
def test_a_refused_body_leaves_no_garbage_cycle(raw: bytes, fmt: Format) -> None:
    """A refusal is freed by reference counting, with the body and its parse: a cycle
    (the exception in a local of the frame its traceback holds) would wait for the
    collector, and under a flood of bad bodies so would the memory they hold."""
    with pytest.raises(BodyError):  # the first refusal fills the caches of the walk
        decode_request(Rpc.WRITE, raw, fmt)
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(BodyError):
            decode_request(Rpc.WRITE, raw, fmt)
        assert gc.collect() == 0
    finally:
        gc.enable()
