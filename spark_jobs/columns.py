"""Records as columns: the one row layout of the history's Parquet files and of the
``sharecoord`` Spark data source, and the bulk decoding that fills it.

Decoding a value at a time costs a Python call, a ``ShareSnapshot``/``ShareUpdate`` and a
``StateBatch`` per batch. Here the values of a run of records are decoded by one
msgspec call per record type (the layouts of ``protocol.records``, so exactly the checks
loading makes), and the columns are built from those structs with numpy: the history
export of every folded record costs about a microsecond a record.

A row, in this order (nullable where the record type has no such field):

    state_partition          int       (the data source only: the history's files are
                                        partitioned by it, Spark reads it from the path)
    log_offset               bigint
    timestamp                timestamp  UTC; when the record was appended
    record_type              string     ShareSnapshot, ShareUpdate or ShareTombstone
    group_id, topic_id       string
    partition                int
    snapshot_epoch           int        snapshots and updates
    state_epoch              int        snapshots
    leader_epoch             int        snapshots and updates (-1 in an update: unchanged)
    start_offset             bigint     snapshots and updates (-1 in an update: unchanged)
    create_timestamp         bigint     ms, snapshots
    write_timestamp          bigint     ms, snapshots
    delivery_complete_count  int        snapshots and updates
    fence_leader_epoch       int        snapshots, may be null
    fence_state_epoch        int        snapshots, may be null
    batches                  array<struct<first_offset bigint, last_offset bigint,
                                          delivery_state int, delivery_count int>>
                                        null for a tombstone

These are the fields ``sharecoord log dump --json`` prints, by the same names.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    RecordDecodeError,
    RecordDecoder,
    SnapshotValue,
    UpdateValue,
    decode_snapshot_value,
    decode_update_value,
)
from spark_jobs.sealed import RawRecord

Value = SnapshotValue | UpdateValue | None

SNAPSHOT, UPDATE, TOMBSTONE = "ShareSnapshot", "ShareUpdate", "ShareTombstone"

BATCH_TYPE = pa.struct(
    [
        pa.field("first_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("delivery_state", pa.int32(), nullable=False),
        pa.field("delivery_count", pa.int32(), nullable=False),
    ]
)
RECORD_FIELDS = [
    pa.field("log_offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("record_type", pa.string(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("topic_id", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("snapshot_epoch", pa.int32()),
    pa.field("state_epoch", pa.int32()),
    pa.field("leader_epoch", pa.int32()),
    pa.field("start_offset", pa.int64()),
    pa.field("create_timestamp", pa.int64()),
    pa.field("write_timestamp", pa.int64()),
    pa.field("delivery_complete_count", pa.int32()),
    pa.field("fence_leader_epoch", pa.int32()),
    pa.field("fence_state_epoch", pa.int32()),
    pa.field("batches", pa.list_(pa.field("element", BATCH_TYPE, nullable=False))),
]
# The history's files: the partition columns live in the directory names.
HISTORY_SCHEMA = pa.schema(RECORD_FIELDS)
# The data source's rows.
SOURCE_SCHEMA = pa.schema([pa.field("state_partition", pa.int32(), nullable=False), *RECORD_FIELDS])
SOURCE_DDL = (
    "state_partition int, log_offset bigint, timestamp timestamp, record_type string, "
    "group_id string, topic_id string, partition int, snapshot_epoch int, state_epoch int, "
    "leader_epoch int, start_offset bigint, create_timestamp bigint, write_timestamp bigint, "
    "delivery_complete_count int, fence_leader_epoch int, fence_state_epoch int, "
    "batches array<struct<first_offset: bigint, last_offset: bigint, delivery_state: int, "
    "delivery_count: int>>"
)

_decode_updates = msgspec.msgpack.Decoder(list[UpdateValue]).decode
_decode_snapshots = msgspec.msgpack.Decoder(list[SnapshotValue]).decode
_split_raw = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_BATCHES = attrgetter("state_batches")

# Fields by record type, for the columns (snapshots, updates): None where it has none.
_COLUMNS: tuple[tuple[str, str | None, str | None, Any], ...] = (
    ("snapshot_epoch", "snapshot_epoch", "snapshot_epoch", pa.int32()),
    ("state_epoch", "state_epoch", None, pa.int32()),
    ("leader_epoch", "leader_epoch", "leader_epoch", pa.int32()),
    ("start_offset", "start_offset", "start_offset", pa.int64()),
    ("create_timestamp", "create_timestamp", None, pa.int64()),
    ("write_timestamp", "write_timestamp", None, pa.int64()),
    ("delivery_complete_count", "delivery_complete_count", "delivery_complete_count", pa.int32()),
    ("fence_leader_epoch", "fence_leader_epoch", None, pa.int32()),
    ("fence_state_epoch", "fence_state_epoch", None, pa.int32()),
)


class DecodedValues:
    """The values of a run of records, decoded by record type. ``values[i]`` is record
    i's value (None for a tombstone)."""

    __slots__ = ("snapshot_at", "snapshots", "update_at", "updates", "values")

    def __init__(
        self,
        size: int,
        update_at: np.ndarray[Any, Any],
        updates: list[UpdateValue],
        snapshot_at: np.ndarray[Any, Any],
        snapshots: list[SnapshotValue],
    ) -> None:
        self.update_at, self.updates = update_at, updates
        self.snapshot_at, self.snapshots = snapshot_at, snapshots
        values = np.full(size, None, dtype=object)
        values[update_at] = updates
        values[snapshot_at] = snapshots
        self.values: list[Value] = values.tolist()


def decode_values(records: Sequence[RawRecord]) -> DecodedValues:
    """Decode every value of `records` (checked as ``protocol.records`` checks a value:
    a RecordDecodeError names the first bad record's offset)."""
    types = [r[2] for r in records]
    update_at = [i for i, t in enumerate(types) if t == UPDATE_RECORD_TYPE]
    snapshot_at = [i for i, t in enumerate(types) if t == SNAPSHOT_RECORD_TYPE]
    if len(update_at) + len(snapshot_at) != len(records):
        bad = next(r for r in records if r[2] not in (SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE))
        raise RecordDecodeError(f"offset {bad[0]}: unknown record type {bad[2]}")
    tombstone_at = [i for i in snapshot_at if records[i][4] is None]
    if tombstone_at:
        gone = set(tombstone_at)
        snapshot_at = [i for i in snapshot_at if i not in gone]
    for i in update_at:
        if records[i][4] is None:
            raise RecordDecodeError(
                f"offset {records[i][0]}: a ShareUpdate record has a null value"
            )
    updates = _bulk(records, update_at, _decode_updates, decode_update_value)
    snapshots = _bulk(records, snapshot_at, _decode_snapshots, decode_snapshot_value)
    return DecodedValues(
        len(records),
        np.array(update_at, dtype=np.int64),
        updates,
        np.array(snapshot_at, dtype=np.int64),
        snapshots,
    )


def _bulk(records: Sequence[RawRecord], at: list[int], decode: Any, decode_one: Any) -> Any:
    """One msgspec call for many values: their bytes back to back as one msgpack array.
    The split into raw elements must give back each value's own bytes, or one value
    spilled into the next (a value with trailing bytes, or cut short): then each value
    is decoded alone, which names the bad one."""
    if not at:
        return []
    values = [records[i][4] for i in at]
    payload = b"\xdd" + len(values).to_bytes(4, "big") + b"".join(values)  # type: ignore[arg-type]
    try:
        raw = _split_raw(payload)
        if list(map(len, raw)) == list(map(len, values)):  # type: ignore[arg-type]
            decoded = decode(payload)
            lengths = np.fromiter(map(len, map(_BATCHES, decoded)), np.int64, len(decoded))
            if not (lengths % 4).any():
                return decoded
    except (msgspec.MsgspecError, ValueError):
        pass
    for i in at:  # find the culprit, and say where it is
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
    key_bytes = [r[3] for r in records]
    distinct = {k: decoder.decode_key(k) for k in set(key_bytes)}
    keys = [distinct[k] for k in key_bytes]
    types = np.full(size, TOMBSTONE, dtype=object)
    types[decoded.update_at] = UPDATE
    types[decoded.snapshot_at] = SNAPSHOT
    columns: list[pa.Array] = [
        pa.array([r[0] for r in records], pa.int64()),
        pa.array(np.array([r[1] for r in records], dtype=np.int64) * 1000).cast(
            pa.timestamp("us", tz="UTC")
        ),
        pa.array(types, pa.string()),
        pa.array([k.group_id for k in keys], pa.string()),
        pa.array([k.topic_id for k in keys], pa.string()),
        pa.array([k.partition for k in keys], pa.int32()),
    ]
    for _, snapshot_field, update_field, arrow_type in _COLUMNS:
        columns.append(_scatter(size, decoded, snapshot_field, update_field, arrow_type))
    columns.append(_batches(size, decoded))
    if state_partition is None:
        return pa.RecordBatch.from_arrays(columns, schema=HISTORY_SCHEMA)
    partition_column = pa.array(np.full(size, state_partition, dtype=np.int32))
    return pa.RecordBatch.from_arrays([partition_column, *columns], schema=SOURCE_SCHEMA)


def _scatter(
    size: int,
    decoded: DecodedValues,
    snapshot_field: str | None,
    update_field: str | None,
    arrow_type: Any,
) -> pa.Array:
    """One column: each record type's field put at its records' positions; null where a
    record has no such field (or holds nil in it)."""
    data = np.zeros(size, dtype=np.int64)
    valid = np.zeros(size, dtype=bool)
    for at, values, name in (
        (decoded.snapshot_at, decoded.snapshots, snapshot_field),
        (decoded.update_at, decoded.updates, update_field),
    ):
        if name is None or not values:
            continue
        column = list(map(attrgetter(name), values))
        if None in column:
            present = np.array([c is not None for c in column], dtype=bool)
            data[at[present]] = [c for c in column if c is not None]
            valid[at[present]] = True
        else:
            data[at] = column
            valid[at] = True
    return pa.array(data, mask=~valid).cast(arrow_type)


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
        [
            pa.array(grid[:, 0]),
            pa.array(grid[:, 1]),
            pa.array(grid[:, 2]).cast(pa.int32()),
            pa.array(grid[:, 3]).cast(pa.int32()),
        ],
        fields=list(BATCH_TYPE),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets), batches, type=RECORD_FIELDS[-1].type, mask=pa.array(~present)
    )


def rows_as_records(table: pa.Table | pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows as plain dicts (timestamps back to ms): for tests and small reports."""
    rows: list[dict[str, Any]] = table.to_pylist()
    for row in rows:
        row["timestamp"] = int(row["timestamp"].timestamp() * 1000)
    return rows
