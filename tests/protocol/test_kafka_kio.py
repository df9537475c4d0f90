"""Our Kafka codec (protocol/kafka_*.py) against an independent implementation of the
wire format: ``kio``, whose message classes are generated from Kafka's own message JSON
files (it carries apiKeys 83-87 at every version we serve, Write and ReadSummary v1
included, and ReadSummary v0 with LeaderEpoch).

For every message and version, with values hypothesis draws:

* requests: kio encodes, we decode, the fields agree; we encode the same value and
  the bytes are kio's, byte for byte;
* responses: we encode, kio decodes, the fields agree; kio encodes the same value and
  the bytes are ours;
* headers and varints likewise.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

kio = pytest.importorskip("kio", reason="kio needs Python 3.11+")

import importlib  # noqa: E402
import io  # noqa: E402

import msgspec  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.serial import entity_reader, entity_writer, readers, writers  # noqa: E402

from protocol import kafka_control as control  # noqa: E402
from protocol import kafka_messages as km  # noqa: E402
from protocol import kafka_wire as wire  # noqa: E402
from protocol.batches import StateBatch  # noqa: E402
from protocol.messages import (  # noqa: E402
    DeletePartition,
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

EXAMPLES = settings(max_examples=60, deadline=None)
MODULES = {
    Rpc.INITIALIZE: "initialize_share_group_state",
    Rpc.READ: "read_share_group_state",
    Rpc.WRITE: "write_share_group_state",
    Rpc.DELETE: "delete_share_group_state",
    Rpc.READ_SUMMARY: "read_share_group_state_summary",
}
VERSIONS = [(rpc, v) for rpc in Rpc for v in range(km.SUPPORTED[rpc.api_key][1] + 1)]


def schema(name: str, version: int, kind: str) -> Any:
    return importlib.import_module(f"kio.schema.{name}.v{version}.{kind}")


def kio_bytes(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def kio_read(cls: type, data: bytes) -> Any:
    entity, size = entity_reader(cls)(data, 0)
    assert size == len(data)
    return entity


INT8 = st.integers(-(2**7), 2**7 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
TOPIC = st.binary(min_size=16, max_size=16)
BATCH = st.builds(StateBatch, INT64, INT64, INT8, INT16)
CODES = st.sampled_from([int(c) for c in ErrorCode])

ENTRIES = {
    Rpc.INITIALIZE: st.builds(InitializePartition, INT32, INT32, INT64),
    Rpc.READ: st.builds(ReadPartition, INT32, INT32),
    Rpc.DELETE: st.builds(DeletePartition, INT32),
    Rpc.READ_SUMMARY: st.builds(ReadSummaryPartition, INT32, INT32),
}


def entries(rpc: Rpc, version: int) -> st.SearchStrategy[Any]:
    if rpc is Rpc.WRITE:
        complete = INT32 if version >= 1 else st.just(-1)
        return st.builds(
            WritePartition, INT32, INT32, INT32, INT64, st.lists(BATCH, max_size=4), complete
        )
    return ENTRIES[rpc]


def requests(rpc: Rpc, version: int) -> st.SearchStrategy[ShareGroupStateRequest[Any]]:
    topic = st.builds(
        lambda raw, parts: TopicRequest(km.topic_text(raw), parts),
        TOPIC,
        st.lists(entries(rpc, version), max_size=4),
    )
    return st.builds(ShareGroupStateRequest, TEXT, st.lists(topic, max_size=3))


# --- share-group state requests -------------------------------------------------------


def to_kio_request(rpc: Rpc, version: int, request: ShareGroupStateRequest[Any]) -> Any:
    mod = schema(MODULES[rpc], version, "request")
    names = [n for n in dir(mod) if n.endswith("Request")]
    (top_name,) = [n for n in names if n != "RequestHeader"]
    top = getattr(mod, top_name)
    topic_cls = top.__dataclass_fields__["topics"].type
    topic_cls = _element(mod, topic_cls)
    part_cls = _element(mod, topic_cls.__dataclass_fields__["partitions"].type)
    topics = []
    for topic in request.topics:
        parts = []
        for e in topic.partitions:
            fields: dict[str, Any] = {"partition": e.partition}
            for name in ("state_epoch", "leader_epoch", "start_offset"):
                if name in part_cls.__dataclass_fields__:
                    fields[name] = getattr(e, name)
            if "state_batches" in part_cls.__dataclass_fields__:
                batch_cls = _element(mod, part_cls.__dataclass_fields__["state_batches"].type)
                fields["state_batches"] = tuple(
                    batch_cls(
                        first_offset=b.first_offset,
                        last_offset=b.last_offset,
                        delivery_state=b.delivery_state,
                        delivery_count=b.delivery_count,
                    )
                    for b in e.state_batches
                )
            if "delivery_complete_count" in part_cls.__dataclass_fields__:
                fields["delivery_complete_count"] = e.delivery_complete_count
            parts.append(part_cls(**fields))
        raw = km.topic_raw(topic.topic_id)
        topics.append(topic_cls(topic_id=uuid.UUID(bytes=raw), partitions=tuple(parts)))
    return top(group_id=request.group_id, topics=tuple(topics))


def _element(mod: Any, annotation: Any) -> Any:
    """The element class of a ``tuple[X, ...]`` field annotation (a string under
    ``from __future__`` or a type)."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    name = text.split("[", 1)[1].split(",", 1)[0].strip().rsplit(".", 1)[-1]
    return getattr(mod, name)


@pytest.mark.parametrize(("rpc", "version"), VERSIONS, ids=str)
@EXAMPLES
@given(data=st.data())
def test_requests_kio_encodes_we_decode_and_we_encode_the_same_bytes(rpc, version, data):
    request = data.draw(requests(rpc, version))
    encoded = kio_bytes(to_kio_request(rpc, version, request))
    decoded = km.decode_state_request(rpc, version, wire.Reader(encoded), km.Budget(10**6, 10**6))
    assert decoded == request
    assert km.encode_state_request(rpc, version, request) == encoded


# --- share-group state responses ------------------------------------------------------


def results(rpc: Rpc, version: int) -> st.SearchStrategy[Any]:
    message = st.one_of(st.none(), TEXT)
    if rpc is Rpc.READ:
        return st.builds(
            ReadPartitionResult, INT32, CODES, message, INT32, INT64, st.lists(BATCH, max_size=4)
        )
    if rpc is Rpc.READ_SUMMARY:
        complete = INT32 if version >= 1 else st.just(-1)
        return st.builds(
            ReadSummaryPartitionResult, INT32, CODES, message, INT32, INT32, INT64, complete
        )
    return st.builds(PartitionResult, INT32, CODES, message)


def responses(rpc: Rpc, version: int) -> st.SearchStrategy[ShareGroupStateResponse[Any]]:
    topic = st.builds(
        lambda raw, parts: TopicResult(km.topic_text(raw), parts),
        TOPIC,
        st.lists(results(rpc, version), max_size=4),
    )
    return st.builds(ShareGroupStateResponse, st.lists(topic, max_size=3))


def from_kio_response(entity: Any) -> list[tuple[bytes, list[dict[str, Any]]]]:
    out = []
    for topic in entity.results:
        parts = []
        for p in topic.partitions:
            fields = {
                name: getattr(p, name)
                for name in p.__dataclass_fields__
                if not name.startswith("__")
            }
            fields["error_code"] = int(fields["error_code"])
            if "state_batches" in fields:
                fields["state_batches"] = [
                    StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                    for b in fields["state_batches"]
                ]
            parts.append(fields)
        # kio reads the all-zero Uuid as None (Kafka's Uuid.ZERO_UUID).
        raw = bytes(16) if topic.topic_id is None else topic.topic_id.bytes
        out.append((raw, parts))
    return out


def ours_as_fields(response: ShareGroupStateResponse[Any], rpc: Rpc, version: int) -> Any:
    out = []
    for topic in response.results:
        parts = []
        for p in topic.partitions:
            fields = msgspec.structs.asdict(p)
            if rpc is Rpc.READ_SUMMARY and version == 0:
                del fields["delivery_complete_count"]
            parts.append(fields)
        out.append((km.topic_raw(topic.topic_id), parts))
    return out


@pytest.mark.parametrize(("rpc", "version"), VERSIONS, ids=str)
@EXAMPLES
@given(data=st.data())
def test_responses_we_encode_kio_decodes_and_encodes_the_same_bytes(rpc, version, data):
    response = data.draw(responses(rpc, version))
    correlation = data.draw(INT32)
    frame = km.encode_state_response(rpc, version, correlation, response)
    mod = schema(MODULES[rpc], version, "response")
    (top_name,) = [n for n in dir(mod) if n.endswith("Response") and n != "ResponseHeader"]
    top = getattr(mod, top_name)
    header_cls = top.__header_schema__
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    header, size = entity_reader(header_cls)(frame[4:], 0)
    assert header.correlation_id == correlation
    body = frame[4 + size :]
    entity = kio_read(top, body)
    assert from_kio_response(entity) == ours_as_fields(response, rpc, version)
    assert kio_bytes(header) + kio_bytes(entity) == frame[4:]


# --- headers and primitives -----------------------------------------------------------


@EXAMPLES
@given(key=INT16, version=INT16, correlation=INT32, client=st.one_of(st.none(), TEXT))
@pytest.mark.parametrize("header_version", [1, 2])
def test_request_headers(header_version, key, version, correlation, client):
    mod = schema("request_header", header_version, "header")
    header = mod.RequestHeader(
        request_api_key=key, request_api_version=version, correlation_id=correlation,
        client_id=client,
    )  # fmt: skip
    data = kio_bytes(header)
    assert wire.request_header(key, version, correlation, client, header_version) == data
    parsed = wire.read_request_header(wire.Reader(data), header_version)
    assert parsed == wire.RequestHeader(key, version, correlation, client)


@EXAMPLES
@given(correlation=INT32)
@pytest.mark.parametrize("header_version", [0, 1])
def test_response_headers(header_version, correlation):
    mod = schema("response_header", header_version, "header")
    expected = kio_bytes(mod.ResponseHeader(correlation_id=correlation))
    assert wire.response_header(correlation, header_version) == expected


@EXAMPLES
@given(n=st.integers(0, 2**32 - 1), s=INT32)
def test_varints_agree_with_kio(n, s):
    out = io.BytesIO()
    writers.write_unsigned_varint(out, n)
    assert wire.uvarint(n) == out.getvalue()
    assert wire.Reader(out.getvalue()).uvarint() == n
    assert readers.read_unsigned_varint(wire.uvarint(n), 0)[0] == n
    zigzag = wire.varint(s)
    assert wire.Reader(zigzag).varint() == s


# --- ApiVersions, FindCoordinator, SASL --------------------------------------------------

SOFTWARE = st.from_regex(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]{0,10}[a-zA-Z0-9])?", fullmatch=True)


@pytest.mark.parametrize("version", range(5))
@EXAMPLES
@given(name=SOFTWARE, software_version=SOFTWARE, code=CODES)
def test_api_versions(version, name, software_version, code):
    request_mod = schema("api_versions", version, "request")
    fields = (
        {"client_software_name": name, "client_software_version": software_version}
        if version >= 3
        else {}
    )
    data = kio_bytes(request_mod.ApiVersionsRequest(**fields))
    assert control.decode_api_versions(version, wire.Reader(data)) is True
    body = control.encode_api_versions(version, code)
    response_mod = schema("api_versions", version, "response")
    entity = kio_read(response_mod.ApiVersionsResponse, body)
    assert int(entity.error_code) == code
    assert [(a.api_key, a.min_version, a.max_version) for a in entity.api_keys] == sorted(
        (k, lo, hi) for k, (lo, hi) in km.SUPPORTED.items()
    )
    assert kio_bytes(entity) == body


def test_unsupported_api_versions_is_a_v0_body_with_its_own_range():
    mod = schema("api_versions", 0, "response")
    entity = kio_read(mod.ApiVersionsResponse, control.unsupported_api_versions())
    assert int(entity.error_code) == 35
    assert [(a.api_key, a.min_version, a.max_version) for a in entity.api_keys] == [(18, 0, 4)]


@pytest.mark.parametrize("version", range(7))
@EXAMPLES
@given(
    keys=st.lists(TEXT, min_size=1, max_size=4),
    key_type=st.sampled_from([0, 1, 2]),
    coordinators=st.lists(
        st.builds(control.Coordinator, TEXT, INT32, TEXT, INT32, CODES, st.one_of(st.none(), TEXT)),
        min_size=1,
        max_size=4,
    ),
)
def test_find_coordinator(version, keys, key_type, coordinators):
    request_mod = schema("find_coordinator", version, "request")
    if version >= 4:
        fields: dict[str, Any] = {"key_type": key_type, "coordinator_keys": tuple(keys)}
    else:
        keys, coordinators = keys[:1], coordinators[:1]
        fields = {"key": keys[0]} | ({"key_type": key_type} if version >= 1 else {})
        key_type = key_type if version >= 1 else 0
    data = kio_bytes(request_mod.FindCoordinatorRequest(**fields))
    query = control.decode_find_coordinator(version, wire.Reader(data))
    assert query == control.FindCoordinatorQuery(key_type, keys)
    body = control.encode_find_coordinator(version, coordinators)
    response_mod = schema("find_coordinator", version, "response")
    entity = kio_read(response_mod.FindCoordinatorResponse, body)
    if version >= 4:
        got = [
            (c.key, c.node_id, c.host, c.port, int(c.error_code), c.error_message)
            for c in entity.coordinators
        ]
    else:
        message = entity.error_message if version >= 1 else coordinators[0].error_message
        key = coordinators[0].key
        got = [(key, entity.node_id, entity.host, entity.port, int(entity.error_code), message)]
    assert got == [
        (c.key, c.node_id, c.host, c.port, c.error_code, c.error_message) for c in coordinators
    ]
    assert kio_bytes(entity) == body


@EXAMPLES
@given(mechanism=TEXT, mechanisms=st.lists(TEXT, max_size=3), code=CODES)
def test_sasl_handshake(mechanism, mechanisms, code):
    request_mod = schema("sasl_handshake", 1, "request")
    data = kio_bytes(request_mod.SaslHandshakeRequest(mechanism=mechanism))
    assert control.decode_sasl_handshake(1, wire.Reader(data)) == mechanism
    body = control.encode_sasl_handshake(code, mechanisms)
    entity = kio_read(schema("sasl_handshake", 1, "response").SaslHandshakeResponse, body)
    assert (int(entity.error_code), list(entity.mechanisms)) == (code, mechanisms)
    assert kio_bytes(entity) == body


@pytest.mark.parametrize("version", range(3))
@EXAMPLES
@given(token=st.binary(max_size=100), code=CODES, message=st.one_of(st.none(), TEXT))
def test_sasl_authenticate(version, token, code, message):
    request_mod = schema("sasl_authenticate", version, "request")
    data = kio_bytes(request_mod.SaslAuthenticateRequest(auth_bytes=token))
    assert control.decode_sasl_authenticate(version, wire.Reader(data)) == token
    body = control.encode_sasl_authenticate(version, code, message, token)
    response_cls = schema("sasl_authenticate", version, "response").SaslAuthenticateResponse
    entity = kio_read(response_cls, body)
    assert (int(entity.error_code), entity.error_message, entity.auth_bytes) == (
        code,
        message,
        token,
    )
    assert kio_bytes(entity) == body
