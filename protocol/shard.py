"""The share coordinator shard: the pure state machine of one state partition.

Every rule of the state lives here and in ``protocol.replay`` (as h11 keeps its state
rules in one place). Two kinds of entry points, as in Kafka's coordinator runtime:

* the operations validate against the current state and say which records to append
  and what to answer; they change nothing. The five RPCs take the decoded request entry
  itself (``protocol.messages``) and return at most one record and the entry's result;
  the maintenance jobs (topic deletion, state retention, cold snapshots) return lists
  of records.
* ``replay(offset, record)`` applies a record, whether just appended or loaded from the
  log. State changes only there, so loading and live writes share one code path.

No I/O and no clock of its own (the clock is injected): the runtime appends the records,
replays them and answers once the log says they are durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

from protocol import errors
from protocol.batches import is_clean, merge_batches, prune_batches
from protocol.key_state import KeyState, ShareGroupOffset, key_fields
from protocol.loading import LazyKeyState
from protocol.messages import (
    AdminState,
    DeletePartition,
    Fencing,
    InitializePartition,
    PartitionResult,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    ReadSummaryPartitionResult,
    WriteFields,
    WritePartition,
)
from protocol.records import Record, ShareKey, ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, MAX_RECORDS_PER_SNAPSHOT, ShareStateMap
from protocol.state_batch import StateBatch

# Kafka's share.coordinator.cold.partition.snapshot.interval.ms.
DEFAULT_COLD_PARTITION_SNAPSHOT_INTERVAL_MS = 300_000
# The most state batches a share-partition's state may hold (sharecoord's own bound; see
# ShardConfig). A share-partition leader keeps at most its record locks in flight
# (Kafka's group.share.partition.max.record.locks, 2,000 by default), and a batch covers
# one record at least: this leaves it room fifty times over.
DEFAULT_MAX_STATE_BATCHES = 100_000


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """``max_state_batches``: a write that would leave a share-partition's state with
    more batches than this is refused (42). Kafka has no such bound, but nothing else
    would bound what a key holds: each write may add 10,000 batches, and a snapshot
    writes the whole state, so one small write could write megabytes, and a state past
    a frame's 64 MiB could never be snapshotted again."""

    records_per_snapshot: int = DEFAULT_RECORDS_PER_SNAPSHOT
    cold_partition_snapshot_interval_ms: int = DEFAULT_COLD_PARTITION_SNAPSHOT_INTERVAL_MS
    max_state_batches: int = DEFAULT_MAX_STATE_BATCHES

    def __post_init__(self) -> None:
        if not 0 <= self.records_per_snapshot <= MAX_RECORDS_PER_SNAPSHOT:
            raise ValueError(
                "snapshot_update_records_per_snapshot must be between 0 and "
                f"{MAX_RECORDS_PER_SNAPSHOT}, got {self.records_per_snapshot}"
            )
        if self.cold_partition_snapshot_interval_ms < 1:
            raise ValueError("cold_partition_snapshot_interval_ms must be at least 1")
        if self.max_state_batches < 1:
            raise ValueError("max_state_batches must be at least 1")


class TopicMetadata(Protocol):
    """What the shard needs of the topic catalog (docs/semantics.md §A): a topic's partition count,
    or None for a topic it does not know."""

    def partition_count(self, topic_id: str) -> int | None: ...


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _max_state_fence(entry: KeyState, state_epoch: int) -> int:
    fence = entry.state_fence
    return state_epoch if fence is None or fence < state_epoch else fence


class ShareCoordinatorShard:
    """The state of one state partition and the rules of every RPC on it (docs/semantics.md §5)."""

    def __init__(
        self,
        config: ShardConfig | None = None,
        *,
        metadata: TopicMetadata | None = None,
        now_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.config = config or ShardConfig()
        # None: no topic catalog, so no metadata checks at all (docs/semantics.md §A).
        self.metadata = metadata
        self._now_ms = now_ms
        self._state = ShareStateMap(self.config.records_per_snapshot)
        self._keys = self._state.keys

    # --- replay -----------------------------------------------------------------------

    def replay(
        self,
        offset: int,
        record: Record,
        key_bytes: bytes | None = None,
        merged: tuple[list[StateBatch], bool] | None = None,
        state: KeyState | None = None,
    ) -> None:
        """``ShareStateMap.replay``; ``state``: the record's key's, when the caller
        looked it up already."""
        self._state.replay(offset, record, key_bytes, merged, state)

    def loaded(
        self, entries: Iterable[tuple[ShareKey, KeyState]], tombstone_offset: int | None
    ) -> None:
        """Take a loaded state instead of replaying its records (``ShareStateMap.loaded``)."""
        self._state.loaded(entries, tombstone_offset)

    def merged_update(self, record: ShareUpdate) -> tuple[list[StateBatch], bool] | None:
        """What replaying ``record`` would make of its key's batches (see
        ``ShareStateMap.merged_update``); changes nothing."""
        return self._state.merged_update(record)

    def last_redundant_offset(self) -> int | None:
        return self._state.last_redundant_offset()

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[ShareKey]:
        """The keys that have state."""
        return iter(self._keys)

    def key_state(self, key: ShareKey) -> KeyState | None:
        return self._keys.get(key)

    def unfolded(self) -> list[KeyState]:
        """The keys a lazy load left unfolded (protocol/loading.py), in the map's order."""
        return [state for state in self._keys.values() if state.__class__ is LazyKeyState]

    def group_ids(self) -> set[str]:
        return {key.group_id for key in self._keys}

    # --- the five RPCs (docs/semantics.md §5) ------------------------------------------

    def initialize(
        self, key: ShareKey, entry: InitializePartition
    ) -> tuple[Record | None, PartitionResult]:
        """docs/semantics.md §5.1: fence the state epoch (-1 skips), check metadata,
        then snapshot."""
        state = self._keys.get(key)
        state_epoch, start_offset = entry.state_epoch, entry.start_offset
        if (
            state_epoch != -1
            and state is not None
            and state.state_fence is not None
            and state.state_fence > state_epoch
        ):
            return None, _failed(key, errors.FENCED_STATE_EPOCH)
        if self._unknown_topic_partition(key):
            return None, _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        now = self._now_ms()
        if state is None:
            snapshot_epoch, fence_leader, fence_state = 0, 0, state_epoch
        else:
            snapshot_epoch = state.state.snapshot_epoch + 1
            fence_leader = max(state.leader_fence, 0)
            fence_state = _max_state_fence(state, state_epoch)
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
        return snapshot, PartitionResult(key.partition, 0, None)

    def read(
        self, key: ShareKey, entry: ReadPartition
    ) -> tuple[Record | None, ReadPartitionResult]:
        """docs/semantics.md §5.2: the stored state; a higher leader epoch is written down first."""
        state = self._keys.get(key)
        if state is None:
            return None, ReadPartitionResult(
                key.partition, errors.INVALID_REQUEST, errors.MSG_READ_UNINITIALIZED, 0, 0, []
            )
        leader_epoch = entry.leader_epoch
        # No -1 exemption on read: -1 is fenced by any stored epoch >= 0 (docs/semantics.md §16.7).
        if state.leader_fence > leader_epoch:
            return None, _failed_read(key, errors.FENCED_LEADER_EPOCH)
        if self._unknown_topic_partition(key):
            return None, _failed_read(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        stored = state.state
        result = ReadPartitionResult(
            key.partition,
            0,
            None,
            stored.state_epoch,
            stored.start_offset,
            list(stored.state_batches),
        )
        if leader_epoch in (-1, state.leader_fence):
            return None, result
        # The answer shows the state before this record (docs/semantics.md §5.2).
        count = state.update_count
        record = self._write_record(
            key, state, leader_epoch, stored.start_offset, [], -1, True, False, stored, count
        )
        return record, result

    def write(
        self, key: ShareKey, entry: WritePartition, state: KeyState | None = None
    ) -> tuple[Record | None, PartitionResult]:
        """docs/semantics.md §5.3: fence both epochs (-1 exempt), then exactly one record (§6).
        ``state``: the key's, when the caller looked it up already."""
        if state is None:
            state = self._keys.get(key)
        if state is None:
            return None, PartitionResult(
                key.partition, errors.INVALID_REQUEST, errors.MSG_WRITE_UNINITIALIZED
            )
        _, state_epoch, leader_epoch, start_offset, batches, complete = _WRITE_FIELDS(entry)
        if type(state) is not _KEY_STATE:
            _ = state.state  # a lazily loaded key folds first (protocol/loading.py)
        stored, leader_fence, state_fence, _, _, count, _ = _KEY_FIELDS(state)
        if leader_epoch != -1 and leader_fence > leader_epoch:
            return None, _failed(key, errors.FENCED_LEADER_EPOCH)
        if state_epoch != -1 and state_fence is not None and state_fence > state_epoch:
            return None, _failed(key, errors.FENCED_STATE_EPOCH)
        if self.metadata is not None and self._unknown_topic_partition(key):
            return None, _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        record = self._write_record(
            key,
            state,
            leader_epoch,
            start_offset,
            batches,
            complete,
            False,
            len(batches) < 2 or entry.batches_combined,
            stored,
            count,
        )
        # Every batch of a merge's output starts where an input batch starts or just after
        # one ends, so the key will hold at most twice the stored and the record's batches
        # together: within the limit (nearly always), there is no merge to count.
        limit = self.config.max_state_batches
        if 2 * (len(stored.state_batches) + len(record.state_batches)) <= limit:
            return record, _PARTITION_RESULT(key.partition, 0, None)
        held = self._over_the_batch_limit(record)
        if held is not None:
            message = (
                f"the share-partition's state would hold {held} state batches, over the "
                f"limit of {self.config.max_state_batches} (max_state_batches_per_share_partition)"
            )
            return None, PartitionResult(key.partition, errors.INVALID_REQUEST, message)
        return record, PartitionResult(key.partition, 0, None)

    def delete(
        self, key: ShareKey, entry: DeletePartition | None = None
    ) -> tuple[Record | None, PartitionResult]:
        """docs/semantics.md §5.4: metadata first, then a tombstone if there is state;
        no fencing."""
        if self._unknown_topic_partition(key):
            return None, _failed(key, errors.UNKNOWN_TOPIC_OR_PARTITION)
        if key not in self._keys:
            return None, PartitionResult(key.partition, 0, None)
        return ShareTombstone(key), PartitionResult(key.partition, 0, None)

    def read_summary(
        self, key: ShareKey, entry: ReadSummaryPartition | None = None
    ) -> tuple[Record | None, ReadSummaryPartitionResult]:
        """docs/semantics.md §5.5: metadata check only; a key without state is a success."""
        if self._unknown_topic_partition(key):
            code = errors.UNKNOWN_TOPIC_OR_PARTITION
            return None, ReadSummaryPartitionResult(
                key.partition, code, errors.default_message(code), 0, 0, 0, -1
            )
        state = self._keys.get(key)
        if state is None:
            return None, ReadSummaryPartitionResult(key.partition, 0, None, 0, 0, -1, -1)
        stored = state.state
        return None, ReadSummaryPartitionResult(
            key.partition,
            0,
            None,
            stored.state_epoch,
            stored.leader_epoch,
            stored.start_offset,
            stored.delivery_complete_count,
        )

    def admin_state(self, key: ShareKey) -> AdminState | None:
        """The stored state and fencing maxima of one key (docs/semantics.md §A.1 point 10)."""
        state = self._keys.get(key)
        if state is None:
            return None
        stored = state.state
        return AdminState(
            key.group_id,
            key.topic_id,
            key.partition,
            stored.snapshot_epoch,
            stored.state_epoch,
            stored.leader_epoch,
            stored.start_offset,
            stored.delivery_complete_count,
            list(stored.state_batches),
            Fencing(state.state_fence, state.leader_fence),
        )

    # --- maintenance ------------------------------------------------------------------

    def delete_topics(self, topic_ids: frozenset[str]) -> list[Record]:
        """Kafka's onTopicsDeleted: tombstone every key of these topics, any group."""
        return [ShareTombstone(key) for key in self._keys if key.topic_id in topic_ids]

    def expire_groups(self, group_ids: frozenset[str]) -> list[Record]:
        """State retention (docs/semantics.md §A): tombstone every key of these groups."""
        return [ShareTombstone(key) for key in self._keys if key.group_id in group_ids]

    def cold_snapshots(self) -> list[Record]:
        """docs/semantics.md §10: re-snapshot states untouched for the cold interval, unless every
        state was already cold-snapshotted (create != write) since its last snapshot."""
        states = self._keys
        already_cold = sum(
            1 for s in states.values() if s.state.create_timestamp != s.state.write_timestamp
        )
        if already_cold == len(states):
            return []
        now = self._now_ms()
        interval = self.config.cold_partition_snapshot_interval_ms
        snapshots: list[Record] = []
        for key, state in states.items():
            stored = state.state
            if now - stored.write_timestamp >= interval:
                snapshots.append(
                    ShareSnapshot(
                        key,
                        stored.snapshot_epoch + 1,
                        stored.state_epoch,
                        stored.leader_epoch,
                        stored.start_offset,
                        stored.create_timestamp,
                        now,
                        list(stored.state_batches),
                        stored.delivery_complete_count,
                        state.leader_fence,
                        _max_state_fence(state, stored.state_epoch),
                    )
                )
        return snapshots

    # --- internals --------------------------------------------------------------------

    def _over_the_batch_limit(self, record: ShareSnapshot | ShareUpdate) -> int | None:
        """How many batches the key's state would hold once ``record`` is replayed, if
        that is more than the limit; None if not. Exact, so an update's merge is worked
        out: ``write`` asks only when its cheap bound did not settle it."""
        if isinstance(record, ShareSnapshot):
            held = len(record.state_batches)
        else:
            merged = self._state.merged_update(record)
            held = len(record.state_batches) if merged is None else len(merged[0])
        return held if held > self.config.max_state_batches else None

    def _unknown_topic_partition(self, key: ShareKey) -> bool:
        if self.metadata is None:
            return False
        count = self.metadata.partition_count(key.topic_id)
        return count is None or count <= key.partition

    def _write_record(
        self,
        key: ShareKey,
        state: KeyState,
        leader_epoch: int,
        start_offset: int,
        state_batches: list[StateBatch],
        delivery_complete_count: int,
        update_leader_epoch: bool,
        batches_combined: bool,
        current: ShareGroupOffset,
        count: int | None,
    ) -> ShareSnapshot | ShareUpdate:
        """docs/semantics.md §6: a snapshot once the key has had enough updates, else an update.

        A write never moves the epochs: the record keeps the stored leader epoch unless
        this is a read's leader-epoch bump, and a snapshot keeps the stored state epoch.
        ``batches_combined``: the batches are already what combining them with nothing
        gives (sorted, disjoint, no same-info neighbours), so only pruning is left.
        ``current`` and ``count``: the key's ``state`` and ``update_count``, which the
        caller read already.
        """
        leader = current.leader_epoch
        if update_leader_epoch and leader_epoch != -1:
            leader = leader_epoch
        if (0 if count is None else count) >= self.config.records_per_snapshot:
            start = current.start_offset if start_offset == -1 else start_offset
            now = self._now_ms()
            clean = state.batches_clean
            if clean is None:
                clean = is_clean(current.state_batches)
            return ShareSnapshot(
                key,
                current.snapshot_epoch + 1,
                current.state_epoch,
                leader,
                start,
                now,
                now,
                merge_batches(current.state_batches, clean, state_batches, start)[0],
                current.delivery_complete_count
                if delivery_complete_count == -1
                else delivery_complete_count,
                max(state.leader_fence, leader),
                _max_state_fence(state, current.state_epoch),
            )
        if batches_combined:
            batches = (
                state_batches if start_offset == -1 else prune_batches(state_batches, start_offset)
            )
        else:
            batches = merge_batches([], True, state_batches, start_offset)[0]
        return _new_update(
            (key, current.snapshot_epoch, leader, start_offset, batches, delivery_complete_count)
        )


def _new_update(fields: tuple[ShareKey, int, int, int, list[StateBatch], int]) -> ShareUpdate:
    """``ShareUpdate(*fields)`` without the ``__new__`` a NamedTuple class gets, which is
    Python source: run by the interpreter on every write, even from compiled code."""
    update: ShareUpdate = _TUPLE_NEW(_SHARE_UPDATE, fields)
    return update


_TUPLE_NEW: Final[Callable[..., Any]] = tuple.__new__
# Statics of the compiled module for the classes every write uses: from compiled code, a
# class imported from a module Python runs is a lookup in this module's dict at each use.
_SHARE_UPDATE: Final = ShareUpdate
_PARTITION_RESULT: Final = PartitionResult
# A write entry's fields in one C call (protocol/messages.py, WriteFields): from compiled
# code, each field read is otherwise a generic attribute lookup.
_WRITE_FIELDS: Final[Callable[[WritePartition], WriteFields]] = msgspec.structs.astuple
_KEY_STATE: Final = KeyState
_KEY_FIELDS: Final = key_fields


def _failed(key: ShareKey, code: int) -> PartitionResult:
    return PartitionResult(key.partition, code, errors.default_message(code))


def _failed_read(key: ShareKey, code: int) -> ReadPartitionResult:
    return ReadPartitionResult(key.partition, code, errors.default_message(code), 0, 0, [])
