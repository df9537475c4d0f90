"""Records as columns: the one row layout of the history's Parquet files and of the
``sharecoord`` Spark data source, and the bulk decoding that fills it.

Decoding a value at a time costs a Python call, a ``ShareSnapshot``/``ShareUpdate`` and a
``StateBatch`` per batch. Here the values of a run of records are decoded by one
msgspec call per record type (the layouts of ``protocol.records``, so exactly the checks
loading makes), and the columns are built from those structs with numpy: the history
export of every folded record costs about a microsecond a record.

A row holds the fields ``protocol.records.FIELDS`` declares, by their names and in their
order: the fields ``sharecoord log dump --json`` prints. A field a record's kind has
not is null. The Arrow and Spark types come from the declared ones:

    int32 -> int, int64 -> bigint, string -> string, timestamp -> timestamp (UTC),
    state_batches -> array<struct<first_offset bigint, last_offset bigint,
                                   delivery_state int, delivery_count int>>

The history's files hold the same columns but ``state_partition`` (Spark reads it from
their directory names), each under its ``history_name`` where it has one: the files
keep the names they were first written with.
"""

from __future__ import annotations

import functools
import gc
import itertools
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from types import GenericAlias
from typing import Any, ParamSpec, TypeAlias, TypeVar

import msgspec
import numpy as np
import pyarrow as pa

from protocol.records import (
    FIELDS,
    LOG_OFFSET,
    RECORD_TYPE,
    SNAPSHOT,
    SNAPSHOT_RECORD_TYPE,
    STATE_BATCHES,
    STATE_PARTITION,
    TIMESTAMP,
    TOMBSTONE,
    UPDATE,
    UPDATE_RECORD_TYPE,
    FieldType,
    Part,
    RecordDecodeError,
    RecordDecoder,
    RecordField,
    SnapshotValue,
    UpdateValue,
    decode_snapshot_value,
    decode_update_value,
)
from protocol.state_batch import StateBatch
from spark_jobs.sealed import RawRecord

# A record's decoded value: a SnapshotValue, an UpdateValue, or None for a tombstone.
Value: TypeAlias = "msgspec.Struct | None"


def _integer_type(annotation: Any) -> Any:
    """int64 for a field wider than 32 bits, else int32 (Spark's int)."""
    return pa.int64() if annotation.__metadata__[0].le >= 2**31 else pa.int32()


# The batches of a row, by StateBatch's own fields.
BATCH_TYPE = pa.struct(
    [
        pa.field(f.name, _integer_type(f.type), nullable=False)
        for f in msgspec.structs.fields(StateBatch)
    ]
)
ARROW_TYPES: dict[FieldType, Any] = {
    FieldType.INT32: pa.int32(),
    FieldType.INT64: pa.int64(),
    FieldType.STRING: pa.string(),
    FieldType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    FieldType.STATE_BATCHES: pa.list_(pa.field("element", BATCH_TYPE, nullable=False)),
}


def _arrow_field(field: RecordField, name: str | None = None) -> pa.Field:
    return pa.field(name or field.name, ARROW_TYPES[field.type], nullable=field.nullable)


# The data source's rows.
SOURCE_SCHEMA = pa.schema([_arrow_field(f) for f in FIELDS])
# The history's files: the partition column lives in the directory names.
HISTORY_FIELDS = tuple(f for f in FIELDS if f is not STATE_PARTITION)
HISTORY_SCHEMA = pa.schema([_arrow_field(f, f.history_name) for f in HISTORY_FIELDS])


def _spark_type(arrow_type: Any) -> str:
    if pa.types.is_list(arrow_type):
        return f"array<{_spark_type(arrow_type.value_type)}>"
    if pa.types.is_struct(arrow_type):
        inner = ", ".join(f"{f.name}: {_spark_type(f.type)}" for f in arrow_type)
        return f"struct<{inner}>"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    return {pa.int32(): "int", pa.int64(): "bigint", pa.string(): "string"}[arrow_type]


SOURCE_DDL = ", ".join(f"{f.name} {_spark_type(f.type)}" for f in SOURCE_SCHEMA)

# list[UpdateValue], list[SnapshotValue]: the layouts are built at run time from FIELDS.
_decode_updates = msgspec.msgpack.Decoder(GenericAlias(list, (UpdateValue,))).decode
_decode_snapshots = msgspec.msgpack.Decoder(GenericAlias(list, (SnapshotValue,))).decode
_split_raw = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_BATCHES = attrgetter(STATE_BATCHES.name)
_TYPE = itemgetter(2)  # a RawRecord's record type


_P = ParamSpec("_P")
_R = TypeVar("_R")


def collector_paused(task: Callable[_P, _R]) -> Callable[_P, _R]:
    """`task` (bulk work in an executor: one partition's compaction, a chunk of data
    source rows) run with Python's cyclic garbage collector off. Such work holds many
    records alive (a tuple and its bytes each) while it makes about as many objects
    again (decoded values, their lists, the fold's per-key state); the collections
    those allocations set off walk them all, again and again, and find nothing: none
    of it forms cycles, and reference counting frees it when the task returns. On the
    bench's 10M-record log, in one process: four partitions' compaction 0.85-0.88x the
    time (3 interleaved pairs), the fold alone 0.82x (what the PostgreSQL store's task
    runs after its read), the whole job on local[2] 0.86x; reading its segments into
    data source rows 0.76-0.92x (3 interleaved pairs). The collector is on again
    after, if it was on before.
    """

    @functools.wraps(task)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return task(*args, **kwargs)
        gc.disable()
        try:
            return task(*args, **kwargs)
        finally:
            gc.enable()

    return paused


class DecodedValues:
    """The values of a run of records, decoded by record type. ``values[i]`` is record
    i's value (None for a tombstone)."""

    __slots__ = ("snapshot_at", "snapshots", "update_at", "updates", "values")

    def __init__(
        self,
        size: int,
        update_at: np.ndarray[Any, Any],
        updates: list[Any],
        snapshot_at: np.ndarray[Any, Any],
        snapshots: list[Any],
    ) -> None:
        self.update_at, self.updates = update_at, updates
        self.snapshot_at, self.snapshots = snapshot_at, snapshots
        self.values: list[Value]
        if len(updates) == size:  # a segment of updates alone: they are in record order
            self.values = list(updates)
        else:
            values = np.full(size, None, dtype=object)
            values[update_at] = updates
            values[snapshot_at] = snapshots
            self.values = values.tolist()


def decode_values(records: Sequence[RawRecord]) -> DecodedValues:
    """Decode every value of `records` (checked as ``protocol.records`` checks a value:
    a RecordDecodeError names the first bad record's offset)."""
    # The records' types and values in C-level passes: a segment holds ~20,000 records.
    types = np.fromiter(map(_TYPE, records), np.int64, len(records))
    update_at = np.flatnonzero(types == UPDATE_RECORD_TYPE)
    snapshot_at = np.flatnonzero(types == SNAPSHOT_RECORD_TYPE)
    if len(update_at) + len(snapshot_at) != len(records):
        bad = next(r for r in records if r[2] not in (SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE))
        raise RecordDecodeError(f"offset {bad[0]}: unknown record type {bad[2]}")
    if len(snapshot_at):
        tombstone = np.fromiter(
            (records[i][4] is None for i in snapshot_at.tolist()), bool, len(snapshot_at)
        )
        snapshot_at = snapshot_at[~tombstone]
    update_values = [records[i][4] for i in update_at.tolist()]
    if None in update_values:
        at = update_at[update_values.index(None)]
        raise RecordDecodeError(f"offset {records[at][0]}: a ShareUpdate record has a null value")
    updates = _bulk(records, update_at, update_values, _decode_updates, decode_update_value)
    snapshot_values = [records[i][4] for i in snapshot_at.tolist()]
    snapshots = _bulk(
        records, snapshot_at, snapshot_values, _decode_snapshots, decode_snapshot_value
    )
    return DecodedValues(len(records), update_at, updates, snapshot_at, snapshots)


def _bulk(
    records: Sequence[RawRecord],
    at: np.ndarray[Any, Any],
    values: list[bytes],
    decode: Any,
    decode_one: Any,
) -> Any:
    """One msgspec call for many values (``values``, the bytes of ``records`` at ``at``):
    their bytes back to back as one msgpack array. The split into raw elements must give
    back each value's own bytes, or one value spilled into the next (a value with
    trailing bytes, or cut short): then each value is decoded alone, which names the bad
    one."""
    if not values:
        return []
    payload = b"\xdd" + len(values).to_bytes(4, "big") + b"".join(values)
    try:
        raw = _split_raw(payload)
        if list(map(len, raw)) == list(map(len, values)):
            decoded = decode(payload)
            lengths = np.fromiter(map(len, map(_BATCHES, decoded)), np.int64, len(decoded))
            if not (lengths % 4).any():
                return decoded
    except (msgspec.MsgspecError, ValueError):
        pass
    for i in at.tolist():  # find the culprit, and say where it is
        try:
            value = decode_one(records[i][4])
            if len(value.state_batches) % 4:
                raise RecordDecodeError("state_batches is not a flat array of 4-tuples")
        except RecordDecodeError as exc:
            raise RecordDecodeError(f"offset {records[i][0]}: {exc}") from None
    raise RecordDecodeError("values that decode one by one do not decode together")


def record_batch(
    records: Sequence[RawRecord],
    decoded: DecodedValues,
    decoder: RecordDecoder,
    state_partition: int | None = None,
) -> pa.RecordBatch:
    """The rows of `records` (HISTORY_SCHEMA, or SOURCE_SCHEMA with a state partition)."""
    size = len(records)
    # Each key field once per distinct key, then spread over the rows by their keys'
    # positions (a take in Arrow): a segment holds far fewer keys than records.
    key_bytes = [r[3] for r in records]
    position = {k: i for i, k in enumerate(dict.fromkeys(key_bytes))}
    keys = list(map(decoder.decode_key, position))
    rows_keys = pa.array(np.fromiter(map(position.__getitem__, key_bytes), np.int32, size))
    kinds = np.full(size, TOMBSTONE, dtype=object)
    kinds[decoded.update_at] = UPDATE
    kinds[decoded.snapshot_at] = SNAPSHOT
    frame = {
        LOG_OFFSET.name: lambda: pa.array([r[0] for r in records], pa.int64()),
        TIMESTAMP.name: lambda: pa.array(
            np.array([r[1] for r in records], dtype=np.int64) * 1000
        ).cast(ARROW_TYPES[TIMESTAMP.type]),
        RECORD_TYPE.name: lambda: pa.array(kinds, pa.string()),
        STATE_PARTITION.name: lambda: pa.array(np.full(size, state_partition, dtype=np.int32)),
    }
    columns: list[pa.Array] = []
    fields = HISTORY_FIELDS if state_partition is None else FIELDS
    for field in fields:
        if field.part is Part.FRAME:
            columns.append(frame[field.name]())
        elif field.part is Part.KEY:
            values = list(map(attrgetter(field.name), keys))
            columns.append(pa.array(values, ARROW_TYPES[field.type]).take(rows_keys))
        elif field.type is FieldType.STATE_BATCHES:
            columns.append(_batches(size, decoded))
        else:
            columns.append(_scatter(size, decoded, field))
    schema = HISTORY_SCHEMA if state_partition is None else SOURCE_SCHEMA
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _scatter(size: int, decoded: DecodedValues, field: RecordField) -> pa.Array:
    """One column: the field of each record kind that has it, put at its records'
    positions; null where a record has no such field (or holds nil in it)."""
    data = np.zeros(size, dtype=np.int64)
    valid = np.zeros(size, dtype=bool)
    for at, values, kind in (
        (decoded.snapshot_at, decoded.snapshots, SNAPSHOT),
        (decoded.update_at, decoded.updates, UPDATE),
    ):
        if field.position(kind) is None or not values:
            continue
        try:
            data[at] = np.fromiter(map(attrgetter(field.name), values), np.int64, len(values))
        except TypeError:  # nil in some of them
            column = list(map(attrgetter(field.name), values))
            present = np.array([c is not None for c in column], dtype=bool)
            data[at[present]] = [c for c in column if c is not None]
            valid[at[present]] = True
        else:
            valid[at] = True
    return pa.array(data, mask=~valid).cast(ARROW_TYPES[field.type])


def _batches(size: int, decoded: DecodedValues) -> pa.Array:
    """The nested batches column, from the flat arrays of four integers per batch."""
    lengths = np.zeros(size, dtype=np.int64)
    for at, values in (
        (decoded.snapshot_at, decoded.snapshots),
        (decoded.update_at, decoded.updates),
    ):
        if values:
            lengths[at] = list(map(len, map(_BATCHES, values)))
    present = np.zeros(size, dtype=bool)
    present[decoded.snapshot_at] = True
    present[decoded.update_at] = True
    # Record order: the flat arrays are concatenated as the records come.
    in_order = map(_BATCHES, filter(None, decoded.values))
    flat = np.fromiter(itertools.chain.from_iterable(in_order), dtype=np.int64)
    grid = flat.reshape(-1, 4)
    offsets = np.zeros(size + 1, dtype=np.int32)
    np.cumsum(lengths // 4, out=offsets[1:])
    batches = pa.StructArray.from_arrays(
        [pa.array(grid[:, i]).cast(f.type) for i, f in enumerate(BATCH_TYPE)],
        fields=list(BATCH_TYPE),
    )
    list_type = ARROW_TYPES[FieldType.STATE_BATCHES]
    return pa.ListArray.from_arrays(
        pa.array(offsets), batches, type=list_type, mask=pa.array(~present)
    )


def rows_as_records(table: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows as plain dicts (timestamps back to ms): for tests and small reports."""
    rows: list[dict[str, Any]] = table.to_pylist()
    for row in rows:
        row[TIMESTAMP.name] = int(row[TIMESTAMP.name].timestamp() * 1000)
    return rows
