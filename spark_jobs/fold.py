"""Folding a state partition's records into one ShareSnapshot per live key: the core of
compaction, pure (records in, records out).

The result replays to exactly the state the input replays to (docs/semantics.md §A.1 point 12: the
same admin state for every key, fencing maxima included; the snapshot-update counter
restarts). The fold does not restate the replay rules: each key's state comes from
``protocol.loading.fold_values``, the fold the daemon's own load runs (which
tests/protocol/test_loading.py holds equal to a replay of every record through
``protocol.replay.ShareStateMap``).

Two phases per key, in one pass over the records in offset order:

1. Light: a snapshot replaces a key's whole state, so the records of a key before its
   last snapshot matter only for the fencing maxima (docs/semantics.md §2, §4: leaderEpochMap is the
   highest leader epoch of any record, stateEpochMap the highest state epoch of any
   snapshot, both raised by the fence fields of §A). Only those fields of their values
   are looked at, by the replay's own fence rule (``protocol.replay.snapshot_fences``
   and ``update_leader_fence``, which ShareStateMap calls too). Every value was decoded in bulk
   beforehand (spark_jobs/columns.py: the history export needs them all, and one
   msgspec call per segment costs less than one per record) and checked as the record
   decoder checks it, so a log the daemon cannot load is never "repaired" by compaction.
2. Full: the key's last snapshot and the updates after it are folded onto those fences,
   exactly as the daemon's load reaches them (the merges on the batches themselves,
   without a record or a replayed state per update: a single-process fold of the
   bench's 1M records, its read included, took 3.7 s against 4.9 s through the
   replay); the folded snapshot is the resulting state verbatim, at the
   offset and timestamp of the key's last record, with ``fence_leader_epoch`` /
   ``fence_state_epoch`` the resulting fences (the maxima over the whole history). The
   updates of a key without a snapshot are folded too, and kept as they are: every
   record of a tail is checked as loading checks it.

Only the snapshot-update counter differs from a whole replay, as docs/semantics.md §A.1 point 12
allows: the light phase does not count updates.

Per key, by what its history ends with:

    ... S u u u            one folded ShareSnapshot (S itself if nothing follows it and
                           its fence fields already hold the maxima)
    ... T                  the tombstone, kept at its offset, unless it is older than
                           the retention: then the key leaves no record at all
    ... T u u / u u u      the updates verbatim: a key whose state was built by updates
                           alone has no state epoch fence (None), which no snapshot can
                           say; only a hand-made log holds such a key

A tombstone clears everything a key had (docs/semantics.md §4), so nothing before one matters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from persistence.frame import encode_frame
from protocol.key_state import ShareGroupOffset
from protocol.loading import fold_values
from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    encode_value,
)
from protocol.replay import snapshot_fences, update_leader_fence
from spark_jobs.columns import Value, decode_values
from spark_jobs.sealed import RawRecord


@dataclass
class FoldResult:
    records: list[RawRecord] = field(default_factory=list)  # by offset
    snapshots: int = 0  # live keys, one folded snapshot each
    tombstones_kept: int = 0
    tombstones_dropped: int = 0  # keys that leave no record
    verbatim_updates: int = 0  # updates of keys never snapshotted, kept as they are

    @property
    def keys(self) -> int:
        return self.snapshots + self.tombstones_kept


class _KeyHistory:
    """What the light phase keeps per key: the fences of everything before the tail
    (None, None while that leaves the key without state), and the tail (the indices of
    the key's last snapshot or tombstone and the records after it)."""

    __slots__ = ("leader_fence", "state_fence", "tail")

    def __init__(self, first: int) -> None:
        self.leader_fence: int | None = None
        self.state_fence: int | None = None
        self.tail: list[int] = [first]


def fold_records(
    records: Sequence[RawRecord],
    *,
    tombstone_cutoff_ms: int,
    values: Sequence[Value] | None = None,
) -> FoldResult:
    """Fold `records` (one state partition's, in offset order, from the start of its log)
    into one record per live key; tombstones with a timestamp below
    `tombstone_cutoff_ms` are dropped with their key. `values` are the records' decoded
    values (decoded here if not given). Raises RecordDecodeError (or the replay's
    TypeError/ValueError) for a record the daemon could not load."""
    if values is None:
        values = decode_values(records).values
    histories: dict[bytes, _KeyHistory] = {}
    get = histories.get
    for index, record in enumerate(records):
        history = get(record[3])
        if history is None:
            histories[record[3]] = _KeyHistory(index)
        elif record[2] == UPDATE_RECORD_TYPE:
            history.tail.append(index)
        else:  # a snapshot or a tombstone replaces the state: the tail so far retires
            _retire_tail(history, records, values)
            history.tail = [index]
    return _fold_tails(records, values, histories, tombstone_cutoff_ms)


def _retire_tail(
    history: _KeyHistory, records: Sequence[RawRecord], values: Sequence[Value]
) -> None:
    """Phase 1: the tail's effect on the key's fences, and nothing else, by the replay's
    fence rule; the batches are not even read."""
    leader, state = history.leader_fence, history.state_fence
    for index in history.tail:
        value: Any = values[index]  # a decoded value: its record's fields by name
        if value is None:  # a tombstone clears the key
            leader, state = None, None
        elif records[index][2] == SNAPSHOT_RECORD_TYPE:
            leader, state = snapshot_fences(leader, state, value)
        else:
            leader = update_leader_fence(leader, value.leader_epoch)
    history.leader_fence, history.state_fence = leader, state


def _fold_tails(
    records: Sequence[RawRecord],
    values: Sequence[Value],
    histories: dict[bytes, _KeyHistory],
    tombstone_cutoff_ms: int,
) -> FoldResult:
    """Phase 2: fold each key's tail and emit what stands for it."""
    result = FoldResult()
    decoder = RecordDecoder()
    out = result.records
    for key, history in histories.items():
        at = history.tail
        head = records[at[0]]
        head_value: Any = values[at[0]]
        if head_value is not None and head[2] == SNAPSHOT_RECORD_TYPE:
            # The tail folds onto the fences the records before it left (a snapshot
            # replaces the rest, docs/semantics.md §4), by the load's own fold.
            leader_fence, state_fence = snapshot_fences(
                history.leader_fence, history.state_fence, head_value
            )
            state, _, leader_fence = fold_values(
                head_value, map(values.__getitem__, at[1:]), leader_fence, snapshot=True
            )
            out.append(
                _folded_snapshot(
                    records, at, decoder.decode_key(key), head_value, state, leader_fence,
                    state_fence,
                )
            )  # fmt: skip
            result.snapshots += 1
            continue
        if len(at) == 1 and head_value is None:  # a tombstone, last
            if head[1] < tombstone_cutoff_ms:
                result.tombstones_dropped += 1
            else:
                out.append(head)
                result.tombstones_kept += 1
            continue
        # Updates without a snapshot (after a tombstone, or from the start): kept as
        # they are, once folded all the same, so checked as loading checks them.
        first = 1 if head_value is None else 0
        created: Any = values[at[first]]
        fold_values(
            created,
            map(values.__getitem__, at[first + 1 :]),
            update_leader_fence(None, created.leader_epoch),
            snapshot=False,
        )
        updates = [records[i] for i in at[first:]]
        out.extend(updates)
        result.verbatim_updates += len(updates)
    out.sort()
    return result


def _folded_snapshot(
    records: Sequence[RawRecord],
    at: list[int],
    key: ShareKey,
    head: Any,
    state: ShareGroupOffset,
    leader_fence: int,
    state_fence: int | None,
) -> RawRecord:
    """The snapshot that stands for the tail at ``at`` (``head``: its first record's
    value, a snapshot's), at the offset and timestamp of its last record."""
    if len(at) == 1 and (head.fence_leader_epoch, head.fence_state_epoch) == (
        leader_fence,
        state_fence,
    ):
        return records[at[0]]  # already the fold: keep its bytes
    last = records[at[-1]]
    value = encode_value(
        ShareSnapshot(
            key,
            state.snapshot_epoch,
            state.state_epoch,
            state.leader_epoch,
            state.start_offset,
            state.create_timestamp,
            state.write_timestamp,
            list(state.state_batches),
            state.delivery_complete_count,
            leader_fence,
            state_fence,
        )
    )
    return (last[0], last[1], SNAPSHOT_RECORD_TYPE, records[at[0]][3], value)


def encode_frames(records: Iterable[RawRecord]) -> list[bytes]:
    """The log frames of folded records."""
    return [encode_frame(*record) for record in records]
