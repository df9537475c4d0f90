"""Log records: the documented msgpack encoding round-trips and refuses garbage."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import protocol.records
from protocol.records import (
    FIELDS,
    SNAPSHOT,
    SNAPSHOT_RECORD_TYPE,
    TOMBSTONE,
    UPDATE,
    UPDATE_RECORD_TYPE,
    VALUE_FIELDS,
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    decode_record,
    encode_record,
    record_row,
)
from protocol.state_batch import StateBatch
from protocol.update_value import encode_update_value

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
keys = st.builds(
    ShareKey, st.text(min_size=1, max_size=20), st.just("AAAAAAAAAAAAAAAAAAAAAQ"), int32
)
batches = st.lists(
    st.builds(StateBatch, int64, int64, st.integers(-128, 127), st.integers(-(2**15), 2**15 - 1)),
    max_size=5,
)
snapshots = st.builds(
    ShareSnapshot,
    keys,
    int32,
    int32,
    int32,
    int64,
    int64,
    int64,
    batches,
    int32,
    st.none() | int32,
    st.none() | int32,
)
updates = st.builds(ShareUpdate, keys, int32, int32, int64, batches, int32)
tombstones = st.builds(ShareTombstone, keys)


@given(st.one_of(snapshots, updates, tombstones))
def test_3_records_round_trip(record):
    record_type, key, value = encode_record(record)
    assert decode_record(record_type, key, value) == record
    assert type(decode_record(record_type, key, value)) is type(record)


def test_3_1_tombstone_uses_the_snapshot_key_type_and_a_null_value():
    record_type, _, value = encode_record(
        ShareTombstone(ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0))
    )
    assert record_type == SNAPSHOT_RECORD_TYPE
    assert value is None


def test_3_1_update_has_its_own_record_type():
    update = ShareUpdate(ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0), 0, 1, -1, [])
    assert encode_record(update)[0] == UPDATE_RECORD_TYPE


def test_records_value_layout_is_the_documented_positional_array():
    snap = ShareSnapshot(
        ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 3),
        1,
        2,
        3,
        10,
        111,
        222,
        [StateBatch(10, 12, 2, 1)],
        5,
        7,
        8,
    )
    _, key, value = encode_record(snap)
    assert msgpack.unpackb(key) == ["g", "AAAAAAAAAAAAAAAAAAAAAQ", 3]
    assert msgpack.unpackb(value) == [1, 2, 3, 10, 111, 222, [10, 12, 2, 1], 5, 7, 8]


def test_records_update_value_is_the_documented_positional_array():
    """protocol/update_value.py writes the update value by hand (for the compiled mode):
    the layout FIELDS declares, batches flattened, one batch or many."""
    key = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 3)
    one = ShareUpdate(key, 1, 2, 10, [StateBatch(10, 12, 2, 1)], 5)
    many = ShareUpdate(key, 1, -1, -1, [StateBatch(0, 4, 0, 1), StateBatch(5, 9, 4, 3)], -1)
    assert msgpack.unpackb(encode_record(one)[2]) == [1, 2, 10, [10, 12, 2, 1], 5]
    assert msgpack.unpackb(encode_record(many)[2]) == [1, -1, -1, [0, 4, 0, 1, 5, 9, 4, 3], -1]
    assert msgpack.unpackb(encode_record(ShareUpdate(key, 0, 0, -1, [], -1))[2]) == [
        0,
        0,
        -1,
        [],
        -1,
    ]


def test_records_refuse_to_load_when_the_update_writer_differs_from_the_declaration(
    monkeypatch,
):
    order = list(protocol.records.UPDATE_VALUE_ORDER)
    order[1], order[2] = order[2], order[1]
    monkeypatch.setattr(protocol.records, "UPDATE_VALUE_ORDER", tuple(order))
    with pytest.raises(TypeError, match=r"update_value\.py"):
        protocol.records._check_declaration()


def test_records_refuse_to_load_when_the_update_record_moves_a_field_the_writer_reads(
    monkeypatch,
):
    """encode_update_value reads a ShareUpdate's fields by position: a record class whose
    fields moved would write one field's value as another's."""
    fields = list(protocol.records.UPDATE_RECORD_FIELDS)
    fields[2], fields[3] = fields[3], fields[2]
    monkeypatch.setattr(protocol.records, "UPDATE_RECORD_FIELDS", tuple(fields))
    with pytest.raises(TypeError, match=r"update_value\.py reads its fields"):
        protocol.records._check_declaration()


def test_the_update_value_holds_each_field_of_the_record_where_the_declaration_says():
    update = ShareUpdate(
        ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0), 7, 11, 13, [StateBatch(20, 29, 2, 3)], 17
    )
    value = msgpack.unpackb(encode_update_value(update))
    assert value == [7, 11, 13, [20, 29, 2, 3], 17]
    assert value[:3] + value[4:] == [
        getattr(update, name)
        for name in protocol.records.UPDATE_VALUE_ORDER
        if name != "state_batches"
    ]


def test_records_decoder_accepts_extra_trailing_fields():
    key = msgpack.packb(["g", "AAAAAAAAAAAAAAAAAAAAAQ", 0])
    value = msgpack.packb([0, 1, -1, [], -1, "a future field"])
    assert decode_record(UPDATE_RECORD_TYPE, key, value) == ShareUpdate(
        ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0), 0, 1, -1, [], -1
    )


def test_records_decoder_shares_one_key_object_per_key():
    decoder = RecordDecoder()
    key = msgpack.packb(["g", "AAAAAAAAAAAAAAAAAAAAAQ", 0])
    first = decoder.decode(SNAPSHOT_RECORD_TYPE, key, None)
    second = decoder.decode(SNAPSHOT_RECORD_TYPE, key, None)
    assert first.key is second.key


@pytest.mark.parametrize(
    ("record_type", "key", "value"),
    [
        (7, msgpack.packb(["g", "t", 0]), None),
        (UPDATE_RECORD_TYPE, msgpack.packb(["g", "t", 0]), None),
        (SNAPSHOT_RECORD_TYPE, b"\xc1", None),
        (SNAPSHOT_RECORD_TYPE, msgpack.packb(["g", 5, 0]), None),
        (SNAPSHOT_RECORD_TYPE, msgpack.packb(["g"]), None),
        (SNAPSHOT_RECORD_TYPE, msgpack.packb(["g", "t", 0]), msgpack.packb([1, 2])),
        (SNAPSHOT_RECORD_TYPE, msgpack.packb(["g", "t", 0]), b"\xc1"),
        (
            UPDATE_RECORD_TYPE,
            msgpack.packb(["g", "t", 0]),
            msgpack.packb([0, 1, -1, [1, 2, 3], -1]),
        ),
    ],
)
def test_records_garbage_raises_record_decode_error(record_type, key, value):
    with pytest.raises(RecordDecodeError):
        decode_record(record_type, key, value)


def test_records_fields_are_the_row_that_log_dump_and_the_data_source_share():
    # The one list of the names outside FIELDS: what the declaration must say.
    assert [f.name for f in FIELDS] == [
        "state_partition", "log_offset", "timestamp", "record_type",
        "group_id", "topic_id", "partition",
        "snapshot_epoch", "state_epoch", "leader_epoch", "start_offset",
        "create_timestamp", "write_timestamp", "delivery_complete_count",
        "fence_leader_epoch", "fence_state_epoch", "state_batches",
    ]  # fmt: skip
    assert {kind: [f.name for f in fields] for kind, fields in VALUE_FIELDS.items()} == {
        SNAPSHOT: list(ShareSnapshot._fields[1:]),
        UPDATE: list(ShareUpdate._fields[1:]),
        TOMBSTONE: [],
    }


def test_records_refuse_to_load_when_a_record_class_differs_from_the_declaration(monkeypatch):
    swapped = list(VALUE_FIELDS[UPDATE])
    swapped[1], swapped[2] = swapped[2], swapped[1]
    monkeypatch.setitem(protocol.records.VALUE_FIELDS, UPDATE, tuple(swapped))
    with pytest.raises(TypeError, match="ShareUpdate"):
        protocol.records._check_declaration()


def test_records_row_holds_every_field_and_null_where_the_kind_has_none():
    key = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 3)
    update = record_row(1, 40, 1_000, ShareUpdate(key, 0, 5, -1, [StateBatch(10, 12, 2, 1)], -1))
    assert list(update) == [f.name for f in FIELDS]
    assert (update["record_type"], update["group_id"], update["partition"]) == (
        "ShareUpdate",
        "g",
        3,
    )
    assert (update["state_partition"], update["log_offset"], update["timestamp"]) == (1, 40, 1_000)
    assert (update["leader_epoch"], update["state_epoch"], update["fence_state_epoch"]) == (
        5,
        None,
        None,
    )
    assert update["state_batches"] == [
        {"first_offset": 10, "last_offset": 12, "delivery_state": 2, "delivery_count": 1}
    ]
    tombstone = record_row(1, 41, 1_001, ShareTombstone(key))
    assert list(tombstone) == list(update)
    assert tombstone["record_type"] == "ShareTombstone" and tombstone["state_batches"] is None


def test_records_fields_are_the_rows_that_docs_api_md_lists():
    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    section = api.split("### A record as a row", 1)[1].split("\n#", 1)[0]
    table = section.split("| field | type | kinds | what it is |", 1)[1].split("\n\n", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert documented == [f.name for f in FIELDS]
