"""The records of the state log: their fields, declared once, and their msgpack encoding
(docs/semantics.md §3, §A).

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

Key: a msgpack array of the key fields below, in their order (the topic id in its
canonical 22-character form). The same bytes for all three record kinds.

Value: a msgpack array of the record kind's value fields, each at the position its
declaration gives for that kind (``snapshot_at``, ``update_at``); ``state_batches`` is
one flat array of four integers per batch: first_offset, last_offset, delivery_state,
delivery_count. Decoders accept extra trailing fields, so a later version can add some.

``FIELDS`` below declares every field of a record once: its name, its type (which gives
its width in the log), which record kinds have it and where, and what it means. It is
the row a record becomes in ``sharecoord log dump --json`` and in the ``sharecoord``
Spark data source (same names, same order), and everything that names a record's fields
(the value layouts and codecs here, the dump, the Spark columns, the audit) takes them
from it. The record classes (``ShareSnapshot``, ``ShareUpdate``) name their fields for
the type checker; this module refuses to load if they differ from the declaration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import msgspec

from protocol.state_batch import StateBatch
from protocol.update_value import (
    UPDATE_RECORD_FIELDS,
    UPDATE_VALUE_ORDER,
    encode_update_value,
    flatten,
)
from protocol.widths import Int32, Int64

SNAPSHOT_RECORD_TYPE = 0
UPDATE_RECORD_TYPE = 1
# Every record type a log frame may carry; the frame reader takes any other as damage.
RECORD_TYPES = (SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE)

# The record kinds, as the record_type field names them (their classes' names).
SNAPSHOT, UPDATE, TOMBSTONE = "ShareSnapshot", "ShareUpdate", "ShareTombstone"
RECORD_KINDS = (SNAPSHOT, UPDATE, TOMBSTONE)


class FieldType(enum.Enum):
    """What a field holds; each reader shows a type its own way (columns.py for Spark)."""

    INT32 = "int32"
    INT64 = "int64"
    STRING = "string"
    # Milliseconds since the epoch: a number in the log and in JSON, a UTC timestamp in Spark.
    TIMESTAMP = "timestamp"
    # A list of StateBatch (objects of its four fields in JSON, structs in Spark).
    STATE_BATCHES = "state_batches"


class Part(enum.Enum):
    """Where a field lives: the log frame around the record, the key, or the value."""

    FRAME = "frame"
    KEY = "key"
    VALUE = "value"


class RecordField(NamedTuple):
    """One field of a record as readers see it."""

    name: str
    type: FieldType
    part: Part
    doc: str  # what it means and how its values read
    snapshot_at: int | None = None  # a value field: its position in a ShareSnapshot value
    update_at: int | None = None  # ... and in a ShareUpdate value
    optional: bool = False  # may be nil in the log itself
    # Its column in the history's Parquet files where that differs from `name`: files
    # written before the dump and the data source shared their names keep theirs.
    history_name: str | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The record kinds that have this field."""
        if self.part is not Part.VALUE:
            return RECORD_KINDS
        return tuple(kind for kind in (SNAPSHOT, UPDATE) if self.position(kind) is not None)

    @property
    def nullable(self) -> bool:
        """Whether a row may hold null here: nil in the log, or a kind without it."""
        return self.optional or len(self.kinds) < len(RECORD_KINDS)

    def position(self, kind: str) -> int | None:
        """Its position in the value of a record of `kind`; None if that kind has none."""
        return {SNAPSHOT: self.snapshot_at, UPDATE: self.update_at}.get(kind)


_INT32, _INT64, _STRING = FieldType.INT32, FieldType.INT64, FieldType.STRING
_FRAME, _KEY, _VALUE = Part.FRAME, Part.KEY, Part.VALUE

STATE_PARTITION = RecordField(
    "state_partition", _INT32, _FRAME, "the state partition whose log holds the record"
)
LOG_OFFSET = RecordField("log_offset", _INT64, _FRAME, "the record's offset in that log")
TIMESTAMP = RecordField(
    "timestamp", FieldType.TIMESTAMP, _FRAME, "when the record was appended (UTC)"
)
RECORD_TYPE = RecordField("record_type", _STRING, _FRAME, ", ".join(RECORD_KINDS))
GROUP_ID = RecordField("group_id", _STRING, _KEY, "the share group")
TOPIC_ID = RecordField("topic_id", _STRING, _KEY, "the topic, in its 22-character form")
PARTITION = RecordField("partition", _INT32, _KEY, "the topic's partition")
SNAPSHOT_EPOCH = RecordField(
    "snapshot_epoch",
    _INT32,
    _VALUE,
    "+1 with every snapshot of the key; in an update, the snapshot's it follows",
    snapshot_at=0,
    update_at=0,
)
STATE_EPOCH = RecordField("state_epoch", _INT32, _VALUE, "", snapshot_at=1)
LEADER_EPOCH = RecordField(
    "leader_epoch", _INT32, _VALUE, "-1 in an update: unchanged", snapshot_at=2, update_at=1
)
START_OFFSET = RecordField(
    "start_offset",
    _INT64,
    _VALUE,
    "-1: not set (in an update: unchanged)",
    snapshot_at=3,
    update_at=2,
)
CREATE_TIMESTAMP = RecordField("create_timestamp", _INT64, _VALUE, "ms", snapshot_at=4)
WRITE_TIMESTAMP = RecordField("write_timestamp", _INT64, _VALUE, "ms", snapshot_at=5)
DELIVERY_COMPLETE_COUNT = RecordField(
    "delivery_complete_count",
    _INT32,
    _VALUE,
    "-1: unknown (KIP-1226; in an update: unchanged)",
    snapshot_at=7,
    update_at=4,
)
FENCE_LEADER_EPOCH = RecordField(
    "fence_leader_epoch",
    _INT32,
    _VALUE,
    "sharecoord's: the key's highest leader epoch when the snapshot was written (§A)",
    snapshot_at=8,
    optional=True,
)
FENCE_STATE_EPOCH = RecordField(
    "fence_state_epoch",
    _INT32,
    _VALUE,
    "sharecoord's: the key's highest state epoch when the snapshot was written (§A)",
    snapshot_at=9,
    optional=True,
)
STATE_BATCHES = RecordField(
    "state_batches",
    FieldType.STATE_BATCHES,
    _VALUE,
    "first_offset, last_offset, delivery_state, delivery_count per batch",
    snapshot_at=6,
    update_at=3,
    history_name="batches",
)

# A record's row, in this order: what `log dump --json` prints and the data source's columns.
FIELDS = (
    STATE_PARTITION,
    LOG_OFFSET,
    TIMESTAMP,
    RECORD_TYPE,
    GROUP_ID,
    TOPIC_ID,
    PARTITION,
    SNAPSHOT_EPOCH,
    STATE_EPOCH,
    LEADER_EPOCH,
    START_OFFSET,
    CREATE_TIMESTAMP,
    WRITE_TIMESTAMP,
    DELIVERY_COMPLETE_COUNT,
    FENCE_LEADER_EPOCH,
    FENCE_STATE_EPOCH,
    STATE_BATCHES,
)
KEY_FIELDS = tuple(f for f in FIELDS if f.part is Part.KEY)


def _in_log_order(kind: str) -> tuple[RecordField, ...]:
    at = {f: f.position(kind) for f in FIELDS}
    return tuple(sorted((f for f in FIELDS if at[f] is not None), key=lambda f: at[f] or 0))


# Each record kind's value fields, in the log's order (none for a tombstone).
VALUE_FIELDS: Mapping[str, tuple[RecordField, ...]] = {
    kind: _in_log_order(kind) for kind in RECORD_KINDS
}


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
RECORD_CLASSES: Mapping[str, type[ShareSnapshot] | type[ShareUpdate] | type[ShareTombstone]] = {
    SNAPSHOT: ShareSnapshot,
    UPDATE: ShareUpdate,
    TOMBSTONE: ShareTombstone,
}


class RecordDecodeError(ValueError):
    """A frame whose checksum holds but whose key or value is not a valid record."""


def _check_declaration() -> None:
    """The record classes hold the declared fields, in the log's order and with the
    declared types; each kind's value positions run 0, 1, 2, ... without a hole."""
    python_types = {FieldType.STATE_BATCHES: "list[StateBatch]", FieldType.STRING: "str"}
    for kind, record_class in RECORD_CLASSES.items():
        fields = VALUE_FIELDS[kind]
        declared = {"key": "ShareKey"} | {
            f.name: python_types.get(f.type, "int") + (" | None" if f.optional else "")
            for f in fields
        }
        annotations = {  # strings, or ForwardRefs of them
            name: getattr(hint, "__forward_arg__", hint)
            for name, hint in record_class.__annotations__.items()
        }
        positions = [f.position(kind) for f in fields]
        if (
            record_class.__name__ != kind
            or annotations != declared
            or positions != list(range(len(fields)))
        ):
            raise TypeError(
                f"{record_class.__name__} {annotations} differs from FIELDS: "
                f"{declared} at {positions}"
            )
    if ShareKey.__struct_fields__ != tuple(f.name for f in KEY_FIELDS):
        raise TypeError(f"ShareKey {ShareKey.__struct_fields__} differs from FIELDS")
    if ShareUpdate._fields != UPDATE_RECORD_FIELDS:
        raise TypeError(
            f"ShareUpdate {ShareUpdate._fields}; protocol/update_value.py reads its "
            f"fields at the positions of {UPDATE_RECORD_FIELDS}"
        )
    update_order = tuple(f.name for f in VALUE_FIELDS[UPDATE])
    if update_order != UPDATE_VALUE_ORDER:
        raise TypeError(
            f"FIELDS lays an update value out as {update_order}; protocol/update_value.py "
            f"writes {UPDATE_VALUE_ORDER}"
        )


_check_declaration()


# --- the layouts, as the log stores them (from FIELDS) ----------------------------------

_LAYOUT_TYPES: Mapping[FieldType, Any] = {
    FieldType.INT32: Int32,
    FieldType.INT64: Int64,
    FieldType.STRING: str,
    FieldType.STATE_BATCHES: list[int],  # flat: four integers per batch
}


def _layout(name: str, fields: tuple[RecordField, ...]) -> type[msgspec.Struct]:
    """An array-like Struct of `fields`, which msgspec decodes with the widths checked."""
    return msgspec.defstruct(
        name,
        [
            (f.name, _LAYOUT_TYPES[f.type] | None if f.optional else _LAYOUT_TYPES[f.type])
            for f in fields
        ],
        array_like=True,
        gc=False,
        module=__name__,
    )


KeyLayout = _layout("KeyLayout", KEY_FIELDS)
SnapshotValue = _layout("SnapshotValue", VALUE_FIELDS[SNAPSHOT])
UpdateValue = _layout("UpdateValue", VALUE_FIELDS[UPDATE])


_BOTH_PARTS = ("value_of", "record_of")


def _compile_codec(kind: str, parts: tuple[str, ...] = _BOTH_PARTS) -> dict[str, Any]:
    """A kind's value codec, compiled from FIELDS (the ``parts`` asked for):
    ``value_of(record)``, the tuple the log stores, and ``record_of(key, value)``, the
    record a decoded value stands for. Written out field by field as the stdlib's namedtuple
    writes its methods: a loop over the fields at run time cost half as much again per
    update decoded or encoded (the loading path), measured against this."""
    record_class = RECORD_CLASSES[kind]
    batches = FieldType.STATE_BATCHES
    stored = ", ".join(
        f"flatten(record.{f.name})" if f.type is batches else f"record.{f.name}"
        for f in VALUE_FIELDS[kind]
    )
    loaded = ", ".join(
        f"unflatten(value.{f.name})" if f.type is batches else f"value.{f.name}"
        for f in VALUE_FIELDS[kind]
    )
    sources = {
        "value_of": f"def value_of(record):\n    return ({stored},)\n",
        "record_of": (
            f"def record_of(key, value):\n    return {record_class.__name__}(key, {loaded})\n"
        ),
    }
    namespace = {"flatten": flatten, "unflatten": unflatten, record_class.__name__: record_class}
    # The source names nothing but FIELDS' identifiers.
    exec("".join(sources[part] for part in parts), namespace)
    return namespace


_encode = msgspec.msgpack.Encoder().encode
_decode_key_layout = msgspec.msgpack.Decoder(KeyLayout).decode
_decode_snapshot_value = msgspec.msgpack.Decoder(SnapshotValue).decode
_decode_update_value = msgspec.msgpack.Decoder(UpdateValue).decode


def record_type(record: Record) -> int:
    return UPDATE_RECORD_TYPE if type(record) is ShareUpdate else SNAPSHOT_RECORD_TYPE


def encode_key(key: ShareKey) -> bytes:
    return _encode(key)


def encode_value(record: Record) -> bytes | None:
    """The value bytes of a record; None for a tombstone."""
    if type(record) is ShareUpdate:
        return encode_update_value(record)
    if type(record) is ShareSnapshot:
        return _encode(_snapshot_value_of(record))
    return None


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
    return ShareKey(*msgspec.structs.astuple(layout))


def unflatten(flat: list[int]) -> list[StateBatch]:
    if len(flat) % 4:
        raise RecordDecodeError("state_batches is not a flat array of 4-tuples")
    fields = iter(flat)
    return list(map(StateBatch, fields, fields, fields, fields))


def decode_snapshot_value(value: bytes) -> msgspec.Struct:
    """A ShareSnapshot value as a ``SnapshotValue``."""
    try:
        return _decode_snapshot_value(value)
    except msgspec.MsgspecError as exc:
        raise RecordDecodeError(f"undecodable record value: {exc}") from None


def decode_update_value(value: bytes) -> msgspec.Struct:
    """A ShareUpdate value as an ``UpdateValue``."""
    try:
        return _decode_update_value(value)
    except msgspec.MsgspecError as exc:
        raise RecordDecodeError(f"undecodable record value: {exc}") from None


def decode_snapshot(key: ShareKey, value: bytes) -> ShareSnapshot:
    return snapshot_from_value(key, decode_snapshot_value(value))


def decode_update(key: ShareKey, value: bytes) -> ShareUpdate:
    return update_from_value(key, decode_update_value(value))


def snapshot_from_value(key: ShareKey, value: msgspec.Struct) -> ShareSnapshot:
    """The record a decoded ``SnapshotValue`` stands for (values decoded in bulk, as the
    compaction job decodes them, become records here)."""
    return _snapshot_of(key, value)


def update_from_value(key: ShareKey, value: msgspec.Struct) -> ShareUpdate:
    """The record a decoded ``UpdateValue`` stands for."""
    return _update_of(key, value)


_SNAPSHOT_CODEC = _compile_codec(SNAPSHOT)
# An update's value is written by protocol/update_value.py, which the compiled mode compiles.
_UPDATE_CODEC = _compile_codec(UPDATE, ("record_of",))
_snapshot_value_of: Callable[[ShareSnapshot], tuple[Any, ...]] = _SNAPSHOT_CODEC["value_of"]
_snapshot_of: Callable[[ShareKey, msgspec.Struct], ShareSnapshot] = _SNAPSHOT_CODEC["record_of"]
_update_of: Callable[[ShareKey, msgspec.Struct], ShareUpdate] = _UPDATE_CODEC["record_of"]


# --- a record as a row ------------------------------------------------------------------


def record_row(
    state_partition: int, log_offset: int, timestamp: int, record: Record
) -> dict[str, Any]:
    """A record as its row: every field of FIELDS by name, None where the record's kind
    has no such field, the batches as objects of their four fields. What ``log dump
    --json`` prints for a record; the data source's rows hold the same."""
    kind = type(record).__name__
    row: dict[str, Any] = dict.fromkeys(f.name for f in FIELDS)
    row[STATE_PARTITION.name] = state_partition
    row[LOG_OFFSET.name] = log_offset
    row[TIMESTAMP.name] = timestamp
    row[RECORD_TYPE.name] = kind
    for f, key_value in zip(KEY_FIELDS, msgspec.structs.astuple(record.key), strict=True):
        row[f.name] = key_value
    values: tuple[Any, ...] = record[1:]
    for f, value in zip(VALUE_FIELDS[kind], values, strict=True):
        if f.type is FieldType.STATE_BATCHES:
            row[f.name] = [msgspec.structs.asdict(b) for b in value]
        else:
            row[f.name] = value
    return row
