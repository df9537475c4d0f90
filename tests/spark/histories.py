"""Random state-log histories for the compaction and audit tests.

Two sources of records:

* RPC histories: random Initialize / Read / Write / Delete (and cold snapshots) run
  through ``protocol.shard.ShareCoordinatorShard`` exactly as the runtime runs them
  (handle, append, replay), so the log is one the daemon could have written;
* hand-made records: any sequence of snapshots, updates and tombstones with any epochs
  and fence fields, as a log migrated or written by another tool could hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from persistence import StateLog, partition_dir, read_meta, read_partition
from protocol.messages import AdminState
from protocol.records import (
    Record,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    encode_record,
)
from protocol.routing import partition_for
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch
from spark_jobs.sealed import RawRecord
from tests.shard.ops import ColdSnapshotOp, DeleteOp, InitializeOp, Op, ReadOp, WriteOp, handle

TOPICS = ("AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg")
KEYS = tuple(ShareKey(g, t, p) for g in ("g1", "g2") for t in TOPICS for p in (0, 1))
BASE_TIME_MS = 1_700_000_000_000

epochs = st.integers(-1, 4)
batch_lists = st.lists(
    st.builds(
        lambda first, length, state, count: StateBatch(first, first + length, state, count),
        st.integers(0, 40),
        st.integers(0, 8),
        st.sampled_from([0, 1, 2, 4]),
        st.integers(0, 7),
    ),
    max_size=4,
)
keys = st.sampled_from(KEYS)

operations = st.one_of(
    st.builds(InitializeOp, keys, epochs, st.integers(-1, 30)),
    st.builds(ReadOp, keys, epochs),
    st.builds(WriteOp, keys, epochs, epochs, st.integers(-1, 30), batch_lists, epochs),
    # Every field given: builds() would fill a defaulted NamedTuple field from its
    # annotation (any int at all) rather than use the default.
    st.builds(
        WriteOp, keys, st.just(-1), st.just(-1), st.integers(-1, 30), batch_lists, st.just(-1)
    ),
    st.builds(DeleteOp, keys),
    st.just(ColdSnapshotOp()),
)
# Initialize often, so most writes find their key.
rpc_histories = st.lists(
    st.one_of(st.builds(InitializeOp, keys, epochs, st.integers(-1, 30)), operations),
    min_size=1,
    max_size=120,
)


class Clock:
    def __init__(self) -> None:
        self.now = BASE_TIME_MS

    def __call__(self) -> int:
        self.now += 7
        return self.now


@dataclass
class Appended:
    """A record as the log holds it."""

    state_partition: int
    offset: int
    timestamp: int
    record: Record


def run_rpcs(ops: Iterable[Op], num_partitions: int, records_per_snapshot: int) -> list[Appended]:
    """Run `ops` against one shard per state partition (handle, append, replay) and
    return the records appended, in order."""
    clock = Clock()
    config = ShardConfig(records_per_snapshot=records_per_snapshot)
    shards = [ShareCoordinatorShard(config, now_ms=clock) for _ in range(num_partitions)]
    next_offset = [0] * num_partitions
    appended = []
    for op in ops:
        targets = (
            range(num_partitions)
            if isinstance(op, ColdSnapshotOp)
            else [state_partition_of(op.key, num_partitions)]  # type: ignore[union-attr]
        )
        for p in targets:
            records, _ = handle(shards[p], op)
            for record in records:
                offset = next_offset[p]
                next_offset[p] += 1
                shards[p].replay(offset, record)
                appended.append(Appended(p, offset, clock(), record))
    return appended


def state_partition_of(key: ShareKey, num_partitions: int) -> int:
    return partition_for(key.group_id, key.topic_id, key.partition, num_partitions)


def write_log(
    data_dir: str, appended: Sequence[Appended], num_partitions: int, segment_bytes: int
) -> None:
    """Append the records to a real data directory (offsets as given: gaps allowed)."""
    log = StateLog.open(data_dir, num_partitions, segment_bytes=segment_bytes)
    try:
        for p in range(num_partitions):
            log.partition(p).open()
        for item in appended:
            part = log.partition(item.state_partition)
            record_type, key, value = encode_record(item.record)
            assert part.log_end_offset == item.offset, "write_log appends offsets in order"
            part.append(record_type, key, value, item.timestamp)
        for p in range(num_partitions):
            log.partition(p).commit()
    finally:
        log.close()


def raw_records(appended: Iterable[Appended]) -> list[RawRecord]:
    """The records as compaction reads them: (offset, timestamp, type, key, value)."""
    out = []
    for item in appended:
        record_type, key, value = encode_record(item.record)
        out.append((item.offset, item.timestamp, record_type, key, value))
    return out


def replayed_shard(records: Iterable[tuple[int, Record]]) -> ShareCoordinatorShard:
    shard = ShareCoordinatorShard(ShardConfig())
    for offset, record in records:
        shard.replay(offset, record)
    return shard


def admin_states(shard: ShareCoordinatorShard) -> dict[ShareKey, AdminState | None]:
    """The admin state (docs/semantics.md §A.1 point 10: stored state and fencing maxima)
    per key."""
    return {key: shard.admin_state(key) for key in sorted(shard)}


def decoded(records: Iterable[RawRecord]) -> list[tuple[int, Record]]:
    decoder = RecordDecoder()
    return [(r[0], decoder.decode(r[2], r[3], r[4])) for r in records]


def states_on_disk(data_dir: str) -> dict[int, dict[ShareKey, AdminState | None]]:
    """Replay every partition of a data directory as the daemon loads it."""
    num_partitions = int(read_meta(data_dir)["num_partitions"])
    out = {}
    for p in range(num_partitions):
        frames = read_partition(partition_dir(data_dir, p))
        out[p] = admin_states(replayed_shard(decoded(_raw(frames))))
    return out


def _raw(frames: Iterable[object]) -> Iterable[RawRecord]:
    for f in frames:
        yield (f.offset, f.timestamp, f.record_type, f.key, f.value)  # type: ignore[attr-defined]


def log_bytes(data_dir: str, partition: int) -> list[tuple[str, int]]:
    directory = partition_dir(data_dir, partition)
    return sorted(
        (name, os.path.getsize(os.path.join(directory, name)))
        for name in os.listdir(directory)
        if name.endswith(".log")
    )


# -- hand-made records -----------------------------------------------------------------

optional_epochs = st.one_of(st.none(), st.integers(-1, 6))


@st.composite
def hand_made_records(draw: st.DrawFn) -> list[RawRecord]:
    """Any sequence of snapshots, updates and tombstones over a few keys, with offset
    gaps and timestamps around the tombstone cutoff used by the tests."""
    records = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 60))):
        key = draw(keys)
        kind = draw(st.sampled_from(["snapshot", "update", "update", "tombstone"]))
        record: Record
        if kind == "snapshot":
            record = ShareSnapshot(
                key,
                draw(st.integers(0, 3)),
                draw(epochs),
                draw(epochs),
                draw(st.integers(-1, 30)),
                draw(st.integers(0, 99)),
                draw(st.integers(0, 99)),
                draw(batch_lists),
                draw(st.integers(-1, 9)),
                draw(optional_epochs),
                draw(optional_epochs),
            )
        elif kind == "update":
            record = ShareUpdate(
                key,
                draw(st.integers(0, 3)),
                draw(epochs),
                draw(st.integers(-1, 30)),
                draw(batch_lists),
                draw(st.integers(-1, 9)),
            )
        else:
            record = ShareTombstone(key)
        timestamp = BASE_TIME_MS + draw(st.integers(-2000, 2000))
        record_type, key_bytes, value = encode_record(record)
        records.append((offset, timestamp, record_type, key_bytes, value))
        offset += draw(st.integers(1, 3))
    return records
