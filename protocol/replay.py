"""Replaying records into the state of a state partition (docs/semantics.md §2, §4, §9, §A).

The one implementation of the replay rules. The daemon's shard replays every record it
appends and every record it loads through ``ShareStateMap.replay``; the Spark jobs fold
log segments through it too, so the three can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final, Protocol

import msgspec

from protocol.batches import is_clean, merge_batches
from protocol.key_state import KeyState, ShareGroupOffset, key_fields
from protocol.records import (
    Record,
    ShareKey,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
)
from protocol.state_batch import StateBatch

# Kafka's share.coordinator.snapshot.update.records.per.snapshot: default and bound. Only
# the snapshot-update counter depends on it; a replay that wants the states alone (the
# tools, the Spark jobs) may take any valid value, and takes the default.
DEFAULT_RECORDS_PER_SNAPSHOT = 500
MAX_RECORDS_PER_SNAPSHOT = 500

# Statics of the compiled module (server/native.py) for what every update uses: from
# compiled code, a class or a function imported from a module Python runs is a lookup in
# this module's dict at each use.
_SHARE_UPDATE: Final = ShareUpdate
_REPLACE: Final = msgspec.structs.replace
_KEY_STATE: Final = KeyState
_KEY_FIELDS: Final = key_fields


def _max_epoch(current: int, fence: int | None) -> int:
    """The higher of an epoch and a snapshot's fence field (None: no fence)."""
    return current if fence is None or fence < current else fence


def _max_optional_epoch(current: int | None, epoch: int, fence: int | None) -> int:
    """``_max_epoch`` folded into a maximum that may not exist yet."""
    best = _max_epoch(epoch, fence)
    return best if current is None or current < best else current


# The fence rule (docs/semantics.md §2, §4.1-2, §A): a key's fences are the maxima over its
# history since its last tombstone, which clears them. Fences of (None, None) are a key
# without state. ShareStateMap keeps them this way, and the compaction fold
# (spark_jobs/fold.py) takes the fences of the records it folds away by these same two
# functions.


class SnapshotEpochs(Protocol):
    """What the fence rule reads of a snapshot: a ShareSnapshot, or its value as the
    loader and the fold decode it (its batches unread)."""

    @property
    def leader_epoch(self) -> int: ...
    @property
    def state_epoch(self) -> int: ...
    @property
    def fence_leader_epoch(self) -> int | None: ...
    @property
    def fence_state_epoch(self) -> int | None: ...


def snapshot_fences(
    leader_fence: int | None, state_fence: int | None, snapshot: SnapshotEpochs
) -> tuple[int, int]:
    """A key's (leader fence, state fence) after a snapshot: each the highest of what it
    was, the snapshot's epoch and its fence field."""
    return (
        _max_optional_epoch(leader_fence, snapshot.leader_epoch, snapshot.fence_leader_epoch),
        _max_optional_epoch(state_fence, snapshot.state_epoch, snapshot.fence_state_epoch),
    )


def update_leader_fence(leader_fence: int | None, leader_epoch: int) -> int:
    """A key's leader fence after an update (of that leader epoch). An update leaves the
    state fence as it was: None for a key that updates alone built."""
    return leader_epoch if leader_fence is None or leader_fence < leader_epoch else leader_fence


class ShareStateMap:
    """The replayed state of one state partition: ``key -> KeyState``, plus the
    offsets manager's last redundant offset (docs/semantics.md §9)."""

    def __init__(self, records_per_snapshot: int) -> None:
        self.records_per_snapshot = records_per_snapshot
        self.keys: dict[ShareKey, KeyState] = {}
        # Offset of the latest snapshot-or-tombstone replay when it was a tombstone: the
        # tombstoned key still counts in Kafka's minimum until the next snapshot.
        self._tombstone_offset: int | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[ShareKey]:
        return iter(self.keys)

    def get(self, key: ShareKey) -> KeyState | None:
        return self.keys.get(key)

    def replay(
        self,
        offset: int,
        record: Record,
        key_bytes: bytes | None = None,
        merged: tuple[list[StateBatch], bool] | None = None,
        state: KeyState | None = None,
    ) -> None:
        """Apply one record read from (or just appended to) the log at ``offset``;
        ``key_bytes`` is its key as the log holds it, when the caller has it. ``merged``:
        an update's batches already merged into the key's state, as ``merged_update``
        gave them for the state the key still has. ``state``: the key's entry in this
        map, when the caller looked it up already (an update uses it)."""
        if isinstance(record, _SHARE_UPDATE):
            self._replay_update(record, key_bytes, merged, state)
        elif isinstance(record, ShareSnapshot):
            self._replay_snapshot(offset, record, key_bytes)
        elif isinstance(record, ShareTombstone):
            self._replay_tombstone(offset, record.key)
        else:
            raise TypeError(f"not a state record: {record!r}")

    def _replay_snapshot(self, offset: int, record: ShareSnapshot, key_bytes: bytes | None) -> None:
        state = ShareGroupOffset(
            record.snapshot_epoch,
            record.state_epoch,
            record.leader_epoch,
            record.start_offset,
            record.create_timestamp,
            record.write_timestamp,
            tuple(record.state_batches),
            record.delivery_complete_count,
        )
        # Fences are maxima over the key's history (docs/semantics.md §4.1-2); the fence fields of
        # sharecoord's snapshots carry that history across pruning and compaction (§A).
        entry = self.keys.get(record.key)
        if entry is None:
            entry = KeyState(state, *snapshot_fences(None, None, record), key_bytes)
            self.keys[record.key] = entry
        else:
            entry.leader_fence, entry.state_fence = snapshot_fences(
                entry.leader_fence, entry.state_fence, record
            )
            entry.state = state
            entry.batches_clean = None
            if key_bytes is not None:
                entry.key_bytes = key_bytes
            # A snapshot resets the counter only once it reached the limit (docs/semantics.md §4.4).
            if entry.update_count is not None and entry.update_count >= self.records_per_snapshot:
                entry.update_count = 0
        entry.snapshot_offset = offset
        self._tombstone_offset = None

    def merged_update(self, record: ShareUpdate) -> tuple[list[StateBatch], bool] | None:
        """The batches (and their clean flag) that replaying ``record`` would give its
        key, worked out without changing anything: the merge is all the cost of an
        update, so the daemon does it off the event loop for a long one and hands the
        result to ``replay``. None when the key has no state yet."""
        entry = self.keys.get(record.key)
        if entry is None:
            return None
        old = entry.state
        start = old.start_offset if record.start_offset == -1 else record.start_offset
        clean = entry.batches_clean
        if clean is None:
            clean = is_clean(old.state_batches)
        return merge_batches(old.state_batches, clean, record.state_batches, start)

    def _replay_update(
        self,
        record: ShareUpdate,
        key_bytes: bytes | None,
        merged: tuple[list[StateBatch], bool] | None = None,
        entry: KeyState | None = None,
    ) -> None:
        if entry is None:
            entry = self.keys.get(record.key)
        if entry is None:
            # Not reachable through the RPCs (they require Initialize), but a log may hold it.
            state = ShareGroupOffset(
                record.snapshot_epoch,
                0,
                record.leader_epoch,
                record.start_offset,
                0,
                0,
                tuple(record.state_batches),
                record.delivery_complete_count,
            )
            entry = KeyState(state, update_leader_fence(None, record.leader_epoch), None, key_bytes)
            entry.update_count = 0
            self.keys[record.key] = entry
            return
        if type(entry) is not _KEY_STATE:
            _ = entry.state  # a lazily loaded key folds first (protocol/loading.py)
        old, leader_fence, _, _, stored_clean, count, _ = _KEY_FIELDS(entry)
        # Set only when it moves: a Struct field's store costs a compiled caller as much
        # as the read.
        if record.leader_epoch > leader_fence:
            entry.leader_fence = record.leader_epoch
        start = old.start_offset if record.start_offset == -1 else record.start_offset
        if merged is None:
            clean = stored_clean if stored_clean is not None else is_clean(old.state_batches)
            merged = merge_batches(old.state_batches, clean, record.state_batches, start)
        batches, now_clean = merged
        if now_clean is not stored_clean:  # nearly always clean before and after
            entry.batches_clean = now_clean
        # The old state with four fields replaced, copied by msgspec in C: from compiled
        # code, reading a Struct's field is a generic attribute lookup, and an integer read
        # out and passed on is boxed again (a new object, for all but the smallest).
        leader_epoch = record.leader_epoch
        complete = record.delivery_complete_count
        entry.state = _REPLACE(
            old,
            leader_epoch=old.leader_epoch if leader_epoch == -1 else leader_epoch,
            start_offset=start,
            state_batches=tuple(batches),
            delivery_complete_count=old.delivery_complete_count if complete == -1 else complete,
        )
        entry.update_count = 0 if count is None else count + 1

    def _replay_tombstone(self, offset: int, key: ShareKey) -> None:
        self.keys.pop(key, None)
        self._tombstone_offset = offset

    def loaded(
        self, entries: Iterable[tuple[ShareKey, KeyState]], tombstone_offset: int | None
    ) -> None:
        """Take the state a loader worked out (protocol/loading.py): what replaying the
        same records here would have left, in the same order. Only into an empty map."""
        if self.keys:
            raise ValueError("a loaded state goes into an empty map only")
        self.keys.update(entries)
        self._tombstone_offset = tombstone_offset

    def last_redundant_offset(self) -> int | None:
        """Every record below this offset is redundant; None when nothing is (docs/semantics.md §9).

        Kafka recomputes ``min(offsets of each key's latest snapshot)`` on every snapshot
        or tombstone replay, counting a just-tombstoned key once more; computing the same
        minimum here, on demand, costs the prune job one pass instead of every replay.
        """
        lowest = min(
            (e.snapshot_offset for e in self.keys.values() if e.snapshot_offset is not None),
            default=None,
        )
        if self._tombstone_offset is not None and (
            lowest is None or self._tombstone_offset < lowest
        ):
            lowest = self._tombstone_offset
        if lowest is None or lowest <= 0:
            return None
        return lowest
