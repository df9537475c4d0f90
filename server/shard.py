"""The share coordinator shard: the pure state machine of one state partition.

Two entry points, as in Kafka's coordinator runtime:

* ``handle(op) -> (records, response)`` validates an operation against the current
  state and says which records to append and what to answer. It changes nothing.
* ``replay(offset, record)`` applies a record, whether just appended or loaded from
  the log. State changes only here, so loading and live writes share one code path.

No I/O and no clock of its own (the clock is injected): the runtime appends the records,
replays them and answers once the log says they are durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from protocol import errors
from protocol.batches import StateBatch, combine_state_batches
from protocol.messages import (
    AdminState,
    Fencing,
    PartitionResult,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
)
from protocol.records import Record, ShareKey, ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.replay import KeyState, ShareStateMap

# Kafka's share.coordinator.snapshot.update.records.per.snapshot: default and bound.
DEFAULT_RECORDS_PER_SNAPSHOT = 500
MAX_RECORDS_PER_SNAPSHOT = 500
# Kafka's share.coordinator.cold.partition.snapshot.interval.ms.
DEFAULT_COLD_PARTITION_SNAPSHOT_INTERVAL_MS = 300_000


@dataclass(frozen=True, slots=True)
class ShardConfig:
    records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT
    cold_partition_snapshot_interval_ms: int = DEFAULT_COLD_PARTITION_SNAPSHOT_INTERVAL_MS

    def __post_init__(self) -> None:
        if not 0 <= self.records_per_snapshot <= MAX_RECORDS_PER_SNAPSHOT:
            raise ValueError(
                "snapshot_update_records_per_snapshot must be between 0 and "
                f"{MAX_RECORDS_PER_SNAPSHOT}, got {self.records_per_snapshot}"
            )
        if self.cold_partition_snapshot_interval_ms < 1:
            raise ValueError("cold_partition_snapshot_interval_ms must be at least 1")


class TopicMetadata(Protocol):
    """What the shard needs of the topic catalog (SPEC §A): a topic's partition count,
    or None for a topic it does not know."""

    def partition_count(self, topic_id: str) -> int | None: ...


# --- operations -----------------------------------------------------------------------
# Immutable and cheap to build: one is made per partition entry of every request.


class InitializeOp(NamedTuple):
    key: ShareKey
    state_epoch: int
    start_offset: int


class ReadOp(NamedTuple):
    key: ShareKey
    leader_epoch: int


class WriteOp(NamedTuple):
    key: ShareKey
    state_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: list[StateBatch]
    delivery_complete_count: int = -1


class DeleteOp(NamedTuple):
    key: ShareKey


class ReadSummaryOp(NamedTuple):
    key: ShareKey


class AdminReadOp(NamedTuple):
    key: ShareKey


class DeleteTopicsOp(NamedTuple):
    """Kafka's onTopicsDeleted: tombstone every key of these topics, any group."""

    topic_ids: frozenset[str]


class ExpireGroupsOp(NamedTuple):
    """State retention (SPEC §A): tombstone every key of these groups."""

    group_ids: frozenset[str]


class ColdSnapshotOp(NamedTuple):
    """The cold-partition snapshot job's pass over this shard (SPEC §10)."""


Op = (
    InitializeOp
    | ReadOp
    | WriteOp
    | DeleteOp
    | ReadSummaryOp
    | AdminReadOp
    | DeleteTopicsOp
    | ExpireGroupsOp
    | ColdSnapshotOp
)
# handle()'s answer: AdminState | None for AdminReadOp, the number of tombstoned keys for
# DeleteTopicsOp / ExpireGroupsOp, the number of snapshots for ColdSnapshotOp.
Response = (
    PartitionResult | ReadPartitionResult | ReadSummaryPartitionResult | AdminState | None | int
)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _max_state_fence(entry: KeyState, state_epoch: int) -> int:
    fence = entry.state_fence
    return state_epoch if fence is None or fence < state_epoch else fence


class ShareCoordinatorShard:
    """The state of one state partition and the rules of every RPC on it (SPEC §5)."""

    def __init__(
        self,
        config: ShardConfig | None = None,
        *,
        metadata: TopicMetadata | None = None,
        now_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.config = config or ShardConfig()
        # None: no topic catalog, so no metadata checks at all (SPEC §A).
        self.metadata = metadata
        self._now_ms = now_ms
        self._state = ShareStateMap(self.config.records_per_snapshot)

    # --- replay -----------------------------------------------------------------------

    def replay(self, offset: int, record: Record) -> None:
        self._state.replay(offset, record)

    def last_redundant_offset(self) -> int | None:
        return self._state.last_redundant_offset()

    def __len__(self) -> int:
        return len(self._state)

    def __iter__(self) -> Iterator[ShareKey]:
        """The keys that have state."""
        return iter(self._state.keys)

    def key_state(self, key: ShareKey) -> KeyState | None:
        return self._state.keys.get(key)

    def group_ids(self) -> set[str]:
        return {key.group_id for key in self._state.keys}

    # --- handle -----------------------------------------------------------------------

    def handle(self, op: Op) -> tuple[list[Record], Response]:
        """Validate ``op`` against the current state: the records to append and the
        response to give once they are durable. Changes nothing; see ``replay``."""
        if isinstance(op, WriteOp):
            return self.write(
                op.key,
                op.state_epoch,
                op.leader_epoch,
                op.start_offset,
                op.state_batches,
                op.delivery_complete_count,
            )
        if isinstance(op, ReadOp):
            return self.read(op.key, op.leader_epoch)
        if isinstance(op, InitializeOp):
            return self.initialize(op.key, op.state_epoch, op.start_offset)
        if isinstance(op, DeleteOp):
            return self.delete(op.key)
        if isinstance(op, ReadSummaryOp):
            return [], self.read_summary(op.key)
        if isinstance(op, AdminReadOp):
            return [], self.admin_state(op.key)
        if isinstance(op, DeleteTopicsOp):
            records = self.delete_topics(op.topic_ids)
            return records, len(records)
        if isinstance(op, ExpireGroupsOp):
            records = self.expire_groups(op.group_ids)
            return records, len(records)
        if isinstance(op, ColdSnapshotOp):
            snapshots = self.cold_snapshots()
            return snapshots, len(snapshots)
        raise TypeError(f"not a shard operation: {op!r}")

    def initialize(
        self, key: ShareKey, state_epoch: int, start_offset: int
    ) -> tuple[list[Record], PartitionResult]:
        """SPEC §5.1: fence the state epoch (-1 skips), check metadata, then snapshot."""
        entry = self._state.keys.get(key)
        if (
            state_epoch != -1
            and entry is not None
            and entry.state_fence is not None
            and entry.state_fence > state_epoch
        ):
            return [], _failed(key, errors.FENCED_STATE_EPOCH)
        if self._unknown_topic_partition(key):
            return [], _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        now = self._now_ms()
        if entry is None:
            snapshot_epoch, fence_leader, fence_state = 0, 0, state_epoch
        else:
            snapshot_epoch = entry.state.snapshot_epoch + 1
            fence_leader = max(entry.leader_fence, 0)
            fence_state = _max_state_fence(entry, state_epoch)
        snapshot = ShareSnapshot(
            key,
            snapshot_epoch,
            state_epoch,
            0,
            start_offset,
            now,
            now,
            [],
            -1 if start_offset == -1 else 0,
            fence_leader,
            fence_state,
        )
        return [snapshot], PartitionResult(key.partition)

    def read(self, key: ShareKey, leader_epoch: int) -> tuple[list[Record], ReadPartitionResult]:
        """SPEC §5.2: the stored state; a higher leader epoch is written down first."""
        entry = self._state.keys.get(key)
        if entry is None:
            return [], ReadPartitionResult(
                key.partition, errors.INVALID_REQUEST, errors.MSG_READ_UNINITIALIZED
            )
        # No -1 exemption on read: -1 is fenced by any stored epoch >= 0 (SPEC §16.7).
        if entry.leader_fence > leader_epoch:
            return [], _failed_read(key, errors.FENCED_LEADER_EPOCH)
        if self._unknown_topic_partition(key):
            return [], _failed_read(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        state = entry.state
        result = ReadPartitionResult(
            key.partition, 0, None, state.state_epoch, state.start_offset, state.state_batches
        )
        if leader_epoch in (-1, entry.leader_fence):
            return [], result
        # The answer shows the state before this record (SPEC §5.2).
        record = self._write_record(key, entry, leader_epoch, state.start_offset, [], -1, True)
        return [record], result

    def write(
        self,
        key: ShareKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        state_batches: list[StateBatch],
        delivery_complete_count: int = -1,
    ) -> tuple[list[Record], PartitionResult]:
        """SPEC §5.3: fence both epochs (-1 exempt), then exactly one record (§6)."""
        entry = self._state.keys.get(key)
        if entry is None:
            return [], PartitionResult(
                key.partition, errors.INVALID_REQUEST, errors.MSG_WRITE_UNINITIALIZED
            )
        if leader_epoch != -1 and entry.leader_fence > leader_epoch:
            return [], _failed(key, errors.FENCED_LEADER_EPOCH)
        if state_epoch != -1 and entry.state_fence is not None and entry.state_fence > state_epoch:
            return [], _failed(key, errors.FENCED_STATE_EPOCH)
        if self._unknown_topic_partition(key):
            return [], _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        record = self._write_record(
            key, entry, leader_epoch, start_offset, state_batches, delivery_complete_count, False
        )
        return [record], PartitionResult(key.partition)

    def delete(self, key: ShareKey) -> tuple[list[Record], PartitionResult]:
        """SPEC §5.4: metadata first, then a tombstone if there is state; no fencing."""
        if self._unknown_topic_partition(key):
            return [], _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        if key not in self._state.keys:
            return [], PartitionResult(key.partition)
        return [ShareTombstone(key)], PartitionResult(key.partition)

    def read_summary(self, key: ShareKey) -> ReadSummaryPartitionResult:
        """SPEC §5.5: metadata check only; a key without state is a success."""
        if self._unknown_topic_partition(key):
            return ReadSummaryPartitionResult(
                key.partition,
                errors.UNKNOWN_TOPIC_OR_PARTITION,
                errors.default_message(errors.UNKNOWN_TOPIC_OR_PARTITION),
            )
        entry = self._state.keys.get(key)
        if entry is None:
            return ReadSummaryPartitionResult(key.partition, 0, None, 0, 0, -1, -1)
        state = entry.state
        return ReadSummaryPartitionResult(
            key.partition,
            0,
            None,
            state.state_epoch,
            state.leader_epoch,
            state.start_offset,
            state.delivery_complete_count,
        )

    def admin_state(self, key: ShareKey) -> AdminState | None:
        """The stored state and fencing maxima of one key (SPEC §A.1 point 10)."""
        entry = self._state.keys.get(key)
        if entry is None:
            return None
        state = entry.state
        return AdminState(
            key.group_id,
            key.topic_id,
            key.partition,
            state.snapshot_epoch,
            state.state_epoch,
            state.leader_epoch,
            state.start_offset,
            state.delivery_complete_count,
            state.state_batches,
            Fencing(entry.state_fence, entry.leader_fence),
        )

    def delete_topics(self, topic_ids: frozenset[str]) -> list[Record]:
        return [ShareTombstone(key) for key in self._state.keys if key.topic_id in topic_ids]

    def expire_groups(self, group_ids: frozenset[str]) -> list[Record]:
        return [ShareTombstone(key) for key in self._state.keys if key.group_id in group_ids]

    def cold_snapshots(self) -> list[Record]:
        """SPEC §10: re-snapshot states untouched for the cold interval, unless every
        state was already cold-snapshotted (create != write) since its last snapshot."""
        entries = self._state.keys
        already_cold = sum(
            1 for e in entries.values() if e.state.create_timestamp != e.state.write_timestamp
        )
        if already_cold == len(entries):
            return []
        now = self._now_ms()
        interval = self.config.cold_partition_snapshot_interval_ms
        snapshots: list[Record] = []
        for key, entry in entries.items():
            state = entry.state
            if now - state.write_timestamp >= interval:
                snapshots.append(
                    ShareSnapshot(
                        key,
                        state.snapshot_epoch + 1,
                        state.state_epoch,
                        state.leader_epoch,
                        state.start_offset,
                        state.create_timestamp,
                        now,
                        state.state_batches,
                        state.delivery_complete_count,
                        entry.leader_fence,
                        _max_state_fence(entry, state.state_epoch),
                    )
                )
        return snapshots

    # --- internals --------------------------------------------------------------------

    def _unknown_topic_partition(self, key: ShareKey) -> bool:
        if self.metadata is None:
            return False
        count = self.metadata.partition_count(key.topic_id)
        return count is None or count <= key.partition

    def _write_record(
        self,
        key: ShareKey,
        entry: KeyState,
        leader_epoch: int,
        start_offset: int,
        state_batches: list[StateBatch],
        delivery_complete_count: int,
        update_leader_epoch: bool,
    ) -> Record:
        """SPEC §6: a snapshot once the key has had enough updates, else an update.

        A write never moves the epochs: the record keeps the stored leader epoch unless
        this is a read's leader-epoch bump, and a snapshot keeps the stored state epoch.
        """
        current = entry.state
        leader = current.leader_epoch
        if update_leader_epoch and leader_epoch != -1:
            leader = leader_epoch
        count = entry.update_count
        if (0 if count is None else count) >= self.config.records_per_snapshot:
            start = current.start_offset if start_offset == -1 else start_offset
            now = self._now_ms()
            return ShareSnapshot(
                key,
                current.snapshot_epoch + 1,
                current.state_epoch,
                leader,
                start,
                now,
                now,
                combine_state_batches(current.state_batches, state_batches, start),
                current.delivery_complete_count
                if delivery_complete_count == -1
                else delivery_complete_count,
                max(entry.leader_fence, leader),
                _max_state_fence(entry, current.state_epoch),
            )
        return ShareUpdate(
            key,
            current.snapshot_epoch,
            leader,
            start_offset,
            combine_state_batches([], state_batches, start_offset),
            delivery_complete_count,
        )


def _failed(key: ShareKey, code: int) -> PartitionResult:
    return PartitionResult(key.partition, code, errors.default_message(code))


def _failed_read(key: ShareKey, code: int) -> ReadPartitionResult:
    return ReadPartitionResult(key.partition, code, errors.default_message(code))
