"""The records of the state log and their msgpack encoding (docs/semantics.md §3, §A).

Three records, as in Kafka's ``__share_group_state`` topic:

* ``ShareSnapshot``: the whole state of a share-partition; replaces what was there.
* ``ShareUpdate``: a delta merged into the state (docs/semantics.md §4).
* ``ShareTombstone``: the share-partition's state is deleted (a ShareSnapshot key with a
  null value).

On disk a record is a frame (see ``persistence``) holding a record type, a key and a
value. This module owns the last three.

Record type (one byte in the frame)::

    0  ShareSnapshot key type: a ShareSnapshot value, or a tombstone when the value is null
    1  ShareUpdate

Key: a msgpack array ``[group_id: str, topic_id: str, partition: int]``, the topic id in
its canonical 22-character form. The same bytes for all three record kinds.

ShareSnapshot value: a msgpack array, fields by position::

    0 snapshot_epoch            int32
    1 state_epoch               int32
    2 leader_epoch              int32
    3 start_offset              int64
    4 create_timestamp          int64, ms
    5 write_timestamp           int64, ms
    6 state_batches             flat array, 4 ints per batch:
                                first_offset, last_offset, delivery_state, delivery_count
    7 delivery_complete_count   int32, -1 = unknown (KIP-1226)
    8 fence_leader_epoch        int32 or nil: highest leader epoch seen for the key when
                                the snapshot was written (docs/semantics.md §A)
    9 fence_state_epoch         int32 or nil: highest state epoch seen likewise

ShareUpdate value: a msgpack array::

    0 snapshot_epoch            int32 (ignored by replay, as in Kafka)
    1 leader_epoch              int32, -1 = unchanged
    2 start_offset              int64, -1 = unchanged
    3 state_batches             flat array as above
    4 delivery_complete_count   int32, -1 = unchanged

The layouts are declared once below as array-like msgspec Structs (``KeyLayout``,
``SnapshotValue``, ``UpdateValue``), with the widths above; decoding checks them.
Decoders accept extra trailing fields, so a later version can add some.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from protocol.batches import StateBatch
from protocol.widths import Int32, Int64

SNAPSHOT_RECORD_TYPE = 0
UPDATE_RECORD_TYPE = 1
# Every record type a log frame may carry; the frame reader takes any other as damage.
RECORD_TYPES = (SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE)


class ShareKey(msgspec.Struct, frozen=True, order=True, array_like=True, gc=False):
    """A share-partition: (group id, canonical topic id, partition) (docs/semantics.md §1.1).

    The daemon holds one per share-partition it knows, for as long as it runs. Not
    tracked by the garbage collector (``gc=False``; it holds two strings and an int,
    so it can never be part of a reference cycle): a full collection walks every
    tracked object with the loop stopped, and a NamedTuple key (a tuple subclass,
    which CPython never untracks) was one such object per share-partition (with the
    list of batches ShareGroupOffset no longer keeps, 365 ms at a million loaded).
    Ordered and hashed by its fields; msgspec writes it as an array.
    """

    group_id: str
    topic_id: str
    partition: int


class ShareSnapshot(NamedTuple):
    key: ShareKey
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp: int
    write_timestamp: int
    state_batches: list[StateBatch]
    delivery_complete_count: int = -1
    fence_leader_epoch: int | None = None
    fence_state_epoch: int | None = None


class ShareUpdate(NamedTuple):
    key: ShareKey
    snapshot_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: list[StateBatch]
    delivery_complete_count: int = -1


class ShareTombstone(NamedTuple):
    key: ShareKey


Record = ShareSnapshot | ShareUpdate | ShareTombstone


class RecordDecodeError(ValueError):
    """A frame whose checksum holds but whose key or value is not a valid record."""


# --- the value layouts, as the log stores them (see the table above) -------------------


class KeyLayout(msgspec.Struct, array_like=True, gc=False):
    group_id: str
    topic_id: str
    partition: Int32


class SnapshotValue(msgspec.Struct, array_like=True, gc=False):
    snapshot_epoch: Int32
    state_epoch: Int32
    leader_epoch: Int32
    start_offset: Int64
    create_timestamp: Int64
    write_timestamp: Int64
    state_batches: list[int]  # flat: first_offset, last_offset, delivery_state, count
    delivery_complete_count: Int32
    fence_leader_epoch: Int32 | None
    fence_state_epoch: Int32 | None


class UpdateValue(msgspec.Struct, array_like=True, gc=False):
    snapshot_epoch: Int32
    leader_epoch: Int32
    start_offset: Int64
    state_batches: list[int]
    delivery_complete_count: Int32


_encode = msgspec.msgpack.Encoder().encode
_decode_key_layout = msgspec.msgpack.Decoder(KeyLayout).decode
_decode_snapshot_value = msgspec.msgpack.Decoder(SnapshotValue).decode
_decode_update_value = msgspec.msgpack.Decoder(UpdateValue).decode


def record_type(record: Record) -> int:
    return UPDATE_RECORD_TYPE if type(record) is ShareUpdate else SNAPSHOT_RECORD_TYPE


def encode_key(key: ShareKey) -> bytes:
    return _encode(key)


def flatten(batches: list[StateBatch]) -> list[int]:
    """Batches as the log stores them: four integers each, one flat array."""
    return [
        n
        for b in batches
        for n in (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
    ]


def encode_value(record: Record) -> bytes | None:
    """The value bytes of a record; None for a tombstone."""
    if type(record) is ShareUpdate:
        return encode_update_value(record)
    if type(record) is ShareSnapshot:
        return _encode(
            (
                record.snapshot_epoch,
                record.state_epoch,
                record.leader_epoch,
                record.start_offset,
                record.create_timestamp,
                record.write_timestamp,
                flatten(record.state_batches),
                record.delivery_complete_count,
                record.fence_leader_epoch,
                record.fence_state_epoch,
            )
        )
    return None


def encode_update_value(record: ShareUpdate) -> bytes:
    """The value of a ShareUpdate, the record nearly every write appends."""
    batches = record.state_batches
    if len(batches) == 1:
        b = batches[0]
        flat = [b.first_offset, b.last_offset, b.delivery_state, b.delivery_count]
    else:
        flat = flatten(batches)
    return _encode(
        (
            record.snapshot_epoch,
            record.leader_epoch,
            record.start_offset,
            flat,
            record.delivery_complete_count,
        )
    )


def encode_record(record: Record) -> tuple[int, bytes, bytes | None]:
    """(record type, key bytes, value bytes or None) ready for a log frame."""
    return record_type(record), encode_key(record.key), encode_value(record)


class RecordDecoder:
    """Decodes records, sharing one ``ShareKey`` object per distinct key bytes.

    A log holds each key many times; decoding it once keeps loading fast and makes
    every state of that key point at the same strings.
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: dict[bytes, ShareKey] = {}

    def decode_key(self, key: bytes) -> ShareKey:
        share_key = self._keys.get(key)
        if share_key is None:
            share_key = _decode_key(key)
            self._keys[key] = share_key
        return share_key

    def decode(self, record_type: int, key: bytes, value: bytes | None) -> Record:
        share_key = self.decode_key(key)
        if record_type == SNAPSHOT_RECORD_TYPE:
            if value is None:
                return ShareTombstone(share_key)
            return decode_snapshot(share_key, value)
        if record_type == UPDATE_RECORD_TYPE:
            if value is None:
                raise RecordDecodeError("a ShareUpdate record has a null value")
            return decode_update(share_key, value)
        raise RecordDecodeError(f"unknown record type {record_type}")


def decode_record(record_type: int, key: bytes, value: bytes | None) -> Record:
    """Decode one record (without key sharing; see ``RecordDecoder`` for bulk use)."""
    return RecordDecoder().decode(record_type, key, value)


def _decode_key(key: bytes) -> ShareKey:
    try:
        layout = _decode_key_layout(key)
    except msgspec.MsgspecError as exc:
        raise RecordDecodeError(f"undecodable record key: {exc}") from None
    return ShareKey(layout.group_id, layout.topic_id, layout.partition)


def unflatten(flat: list[int]) -> list[StateBatch]:
    if len(flat) % 4:
        raise RecordDecodeError("state_batches is not a flat array of 4-tuples")
    fields = iter(flat)
    return list(map(StateBatch, fields, fields, fields, fields))


def decode_snapshot_value(value: bytes) -> SnapshotValue:
    try:
        return _decode_snapshot_value(value)
    except msgspec.MsgspecError as exc:
        raise RecordDecodeError(f"undecodable record value: {exc}") from None


def decode_update_value(value: bytes) -> UpdateValue:
    try:
        return _decode_update_value(value)
    except msgspec.MsgspecError as exc:
        raise RecordDecodeError(f"undecodable record value: {exc}") from None


def decode_snapshot(key: ShareKey, value: bytes) -> ShareSnapshot:
    return snapshot_from_value(key, decode_snapshot_value(value))


def decode_update(key: ShareKey, value: bytes) -> ShareUpdate:
    return update_from_value(key, decode_update_value(value))


def snapshot_from_value(key: ShareKey, v: SnapshotValue) -> ShareSnapshot:
    """The record a decoded value stands for (values decoded in bulk, as the compaction
    job decodes them, become records here)."""
    return ShareSnapshot(
        key,
        v.snapshot_epoch,
        v.state_epoch,
        v.leader_epoch,
        v.start_offset,
        v.create_timestamp,
        v.write_timestamp,
        unflatten(v.state_batches),
        v.delivery_complete_count,
        v.fence_leader_epoch,
        v.fence_state_epoch,
    )


def update_from_value(key: ShareKey, v: UpdateValue) -> ShareUpdate:
    return ShareUpdate(
        key,
        v.snapshot_epoch,
        v.leader_epoch,
        v.start_offset,
        unflatten(v.state_batches),
        v.delivery_complete_count,
    )
