"""Log records: the documented msgpack encoding round-trips and refuses garbage."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.batches import StateBatch
from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    decode_record,
    encode_record,
)

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
