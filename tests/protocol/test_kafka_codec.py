"""The generic Kafka codec (protocol/kafka_codec.py) where no independent encoder goes:
tags a newer Kafka adds, hostile tag counts and sizes, nullable bytes and arrays (none of
the listener's messages has them), the budget of batches, and the declarations and
shapes it refuses. Its agreement with Kafka's own layouts is test_kafka_specs.py's."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol import kafka_messages as km
from protocol import kafka_wire as wire
from protocol.kafka_codec import MessageCodec, compile_decoder, compile_encoder
from protocol.kafka_schema import MESSAGES, FieldSpec, MessageSpec, Shape, SpecError, load_messages
from protocol.kafka_wire import Reader, WireError
from protocol.messages import (
    FindCoordinatorRequest,
    Rpc,
    ShareGroupStateRequest,
    TopicRequest,
    WritePartition,
)
from protocol.state_batch import StateBatch

TOPIC = "WwwvDo06T2ueIXxNGis8TQ"


def write_request(batches: int = 2) -> ShareGroupStateRequest[WritePartition]:
    parts = [
        WritePartition(
            p, 3, 5, 100, [StateBatch(100 + i, 109 + i, 2, 1) for i in range(batches)], 7
        )
        for p in range(2)
    ]
    return ShareGroupStateRequest("g", [TopicRequest(TOPIC, parts)])


def as_dict(request: ShareGroupStateRequest[WritePartition]) -> dict[str, Any]:
    """The request as a dict-shaped encoder takes it (topic ids as their 16 bytes)."""
    value: dict[str, Any] = msgspec.to_builtins(request)
    for topic in value["topics"]:
        topic["topic_id"] = km.topic_raw(topic["topic_id"])
    return value


# --- tagged fields --------------------------------------------------------------------------


def with_future_tags(fields: list[FieldSpec]) -> None:
    """A tagged field a later Kafka might add, in this structure and every one in it."""
    fields.append(
        {"name": "Future", "type": "string", "versions": "0+", "taggedVersions": "0+",
         "tag": 9, "about": "A field this codec does not know."}
    )  # fmt: skip
    for field in fields:
        if "fields" in field:
            with_future_tags(field["fields"])


def test_tags_a_newer_kafka_adds_are_skipped_in_every_structure():
    newer = copy.deepcopy(MESSAGES["WriteShareGroupStateRequest"])
    with_future_tags(newer["fields"])
    request = write_request()
    value = as_dict(request)
    value["future"] = "top"
    for topic in value["topics"]:
        topic["future"] = "topic"
        for p in topic["partitions"]:
            p["future"] = "partition"
            for b in p["state_batches"]:
                b["future"] = "batch"
    out = bytearray()
    compile_encoder(newer, 1)(out, value)
    plain = km.encode_state_request(Rpc.WRITE, 1, request)
    # Every structure carries its tag (a tag byte, a size byte, the string) in its count.
    assert len(out) == len(plain) + 2 + 4 + 2 + 6 + 2 * (2 + 10) + 4 * (2 + 6)
    decoded = km.decode_state_request(Rpc.WRITE, 1, Reader(bytes(out)), km.Budget(100, 100))
    assert decoded == request


def api_versions_v3(tags: bytes) -> bytes:
    """An ApiVersions v3 response body: no error, no APIs, no throttling, then ``tags``."""
    return b"\x00\x00" + b"\x01" + b"\x00\x00\x00\x00" + tags


def test_a_known_tagged_field_is_read_from_exactly_its_size():
    codec = MessageCodec("ApiVersionsResponse", versions=[3])
    epoch = struct.pack(">q", 42)
    body = api_versions_v3(b"\x01" + b"\x01\x08" + epoch)
    assert codec.decode(3, Reader(body))["finalized_features_epoch"] == 42
    for size, payload in ((9, epoch + b"\x00"), (7, epoch[:7])):
        with pytest.raises(WireError):
            codec.decode(3, Reader(api_versions_v3(b"\x01\x01" + bytes([size]) + payload)))


def test_a_tag_count_beyond_the_bytes_left_is_refused_before_any_is_read():
    codec = MessageCodec("ApiVersionsResponse", versions=[3])
    with pytest.raises(WireError, match="elements in 3 bytes"):
        codec.decode(3, Reader(api_versions_v3(wire.uvarint(10**6) + b"\x05\x00\x00")))


def test_tagged_fields_at_their_defaults_are_not_written():
    codec = MessageCodec("ApiVersionsResponse", versions=[3])
    value = {"error_code": 0, "api_keys": [], "throttle_time_ms": 0,
             "finalized_features_epoch": -1, "zk_migration_ready": False}  # fmt: skip
    assert codec.encode(3, value) == api_versions_v3(b"\x00")
    value["zk_migration_ready"] = True
    assert codec.encode(3, value) == api_versions_v3(b"\x01\x03\x01\x01")


# --- budgets, the hot path's header -----------------------------------------------------------


def test_state_batches_over_the_budget_are_refused_while_decoding():
    body = km.encode_state_request(Rpc.WRITE, 1, write_request(batches=3))
    decoded = km.decode_state_request(Rpc.WRITE, 1, Reader(body), km.Budget(2, 3))
    assert len(decoded.topics[0].partitions[1].state_batches) == 3
    with pytest.raises(WireError, match="state batches"):
        km.decode_state_request(Rpc.WRITE, 1, Reader(body), km.Budget(2, 2))


def test_the_hot_path_checks_the_client_id_length_and_leaves_its_bytes_unread():
    header = b"\x00\x55\x00\x01\x00\x00\x10\x92" + b"\x00\x02\xff\xfe" + b"\x00"
    assert wire.skip_request_header(Reader(header), 2) == 0x1092
    # The full read takes what is not UTF-8 as Kafka does (a label, never refused).
    assert wire.read_request_header(Reader(header), 2).client_id == "\ufffd\ufffd"
    with pytest.raises(WireError, match="truncated"):
        wire.skip_request_header(Reader(header[:9]), 2)


# --- nullable bytes and arrays ----------------------------------------------------------------

NULLABLES: MessageSpec = {
    "type": "header", "name": "Nullables", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "Token", "type": "bytes", "versions": "0+", "nullableVersions": "0+",
         "about": "Nullable in every version."},
        {"name": "Ids", "type": "[]int32", "versions": "0+", "nullableVersions": "0+",
         "about": "Nullable in every version."},
        {"name": "Names", "type": "[]string", "versions": "0+", "nullableVersions": "1+",
         "about": "Nullable once flexible."},
    ],
}  # fmt: skip
NULL_BYTES = NULL_ARRAY = b"\xff\xff\xff\xff"


@pytest.mark.parametrize(
    ("version", "value", "encoded"),
    [
        (0, {"token": None, "ids": [7], "names": []},
         NULL_BYTES + b"\x00\x00\x00\x01\x00\x00\x00\x07" + b"\x00\x00\x00\x00"),
        (0, {"token": b"ab", "ids": None, "names": ["x"]},
         b"\x00\x00\x00\x02ab" + NULL_ARRAY + b"\x00\x00\x00\x01\x00\x01x"),
        (1, {"token": None, "ids": None, "names": None}, b"\x00" + b"\x00" + b"\x00" + b"\x00"),
        (1, {"token": b"", "ids": [1], "names": ["x"]},
         b"\x01" + b"\x02\x00\x00\x00\x01" + b"\x02\x02x" + b"\x00"),
    ],
)  # fmt: skip
def test_nullable_bytes_and_arrays_in_both_encodings(version, value, encoded):
    out = bytearray()
    compile_encoder(NULLABLES, version)(out, value)
    assert bytes(out) == encoded
    reader = Reader(encoded)
    assert compile_decoder(NULLABLES, version)(reader, None) == value
    reader.expect_end()


def test_a_null_where_the_version_allows_none_is_refused():
    body = NULL_BYTES + NULL_ARRAY + NULL_ARRAY
    with pytest.raises(WireError, match="null where an array"):
        compile_decoder(NULLABLES, 0)(Reader(body), None)


# --- what the codec refuses to compile ----------------------------------------------------------


def test_every_declaration_compiles_at_every_valid_version():
    for name in MESSAGES:
        MessageCodec(name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["fields"][0].update(size=4), "unknown keys"),
        (lambda s: s["fields"][0].update(type="int128"), "unknown type"),
        (lambda s: s["fields"][0].update(tag=3), "taggedVersions"),
        (lambda s: s["fields"][0].update(versions="1.."), "not a version range"),
        (lambda s: s.update(name="Other"), "declares 'Other'"),
        (lambda s: s["fields"][1].pop("fields"), "arrays of structures"),
        (lambda s: s["fields"][0].update(type="int32", nullableVersions="0+"), "cannot be null"),
    ],
)
def test_a_malformed_declaration_is_refused_when_loaded(tmp_path: Path, change, message):
    spec = copy.deepcopy(MESSAGES["WriteShareGroupStateRequest"])
    change(spec)
    (tmp_path / "WriteShareGroupStateRequest.json").write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=message):
        load_messages(tmp_path)


@pytest.mark.parametrize(
    "shapes",
    [
        {"topics": Shape(limits={"partition": "take_entries"})},  # misspelt: no limit
        {"topic": Shape(TopicRequest)},  # no such structure
        {"": Shape(FindCoordinatorRequest)},  # no field for group_id and topics
        {"topics.partitions": Shape(StateBatch)},  # neither for the partition's fields
    ],
    ids=str,
)
def test_a_shape_that_would_not_apply_is_refused(shapes):
    spec = MESSAGES["WriteShareGroupStateRequest"]
    with pytest.raises(SpecError):
        compile_decoder(spec, 1, shapes)
