"""The node's periodic jobs (docs/design.md#one-node-two-transports), each on its own
timer from the node's start to its stop:

* pruning: whole sealed segments below each state partition's last redundant offset
  go (docs/semantics.md §9, §A), once the history holds them if the data directory keeps
  one (docs/design.md#the-history);
* cold snapshots (docs/semantics.md §10);
* compaction commits: staged compaction output swapped in (``service.commit_compaction``);
* unfinished topic deletions, finished once every state partition is active
  (``service.finish_deletions_once``);
* state retention (docs/semantics.md §A), when ``state_retention_ms`` is on.

A job that fails is said in one line (a disk) or with its trace (a bug), and runs again
at its next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from persistence import LogError, PartitionFailedError, SegmentInfo
from persistence.history import HistoryIndex
from protocol.shard import ShareCoordinatorShard
from server.runtime import Status
from server.service import CoordinatorService
from server.turns import run_job

# Its lines are logged as the service logged them before the jobs had a module.
_log = logging.getLogger("sharecoord.service")

# How often an unfinished topic deletion is tried again (nothing is done while none is).
UNFINISHED_DELETIONS_CHECK_MS = 1000


@dataclass(frozen=True)
class JobIntervals:
    prune_ms: int
    cold_snapshot_ms: int
    compaction_commit_ms: int
    state_retention_ms: int  # -1: never


class _NoPruning(HistoryIndex):
    """A history declaration that cannot be read: prune nothing rather than guess."""

    def __init__(self) -> None:
        pass

    def holds(self, partition: int, segment: Any) -> bool:
        return False


_KEEP_EVERYTHING = _NoPruning()


class PeriodicJobs:
    def __init__(
        self,
        service: CoordinatorService,
        intervals: JobIntervals,
        *,
        on_pruned: Callable[[int, int], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._service = service
        self._intervals = intervals
        self._on_pruned = on_pruned
        self._monotonic = monotonic
        # A group's retention clock starts at its last RPC here, or at the node's start.
        self._started_at = monotonic()
        self._last_pruned: dict[int, int] = {}
        self._held_at: dict[int, str] = {}  # the segment pruning last waited for
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        intervals = self._intervals
        service = self._service
        self._tasks = [
            self._every(intervals.prune_ms, self.prune_once, "prune"),
            self._every(intervals.cold_snapshot_ms, self.cold_snapshots_once, "cold-snapshots"),
            self._every(
                intervals.compaction_commit_ms, service.commit_compaction, "compaction-commit"
            ),
            # A deletion left unfinished by a partition that was not active finishes once
            # it is.
            self._every(
                UNFINISHED_DELETIONS_CHECK_MS, service.finish_deletions_once, "topic-deletions"
            ),
        ]
        if intervals.state_retention_ms > 0:
            # Look often enough that a group expires within a tenth of its retention.
            check_ms = min(max(intervals.state_retention_ms // 10, 100), 60_000)
            self._tasks.append(self._every(check_ms, self.expire_groups_once, "state-retention"))

    def _every(
        self, interval_ms: int, job: Callable[[], Awaitable[Any]], name: str
    ) -> asyncio.Task[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_ms / 1000)
                try:
                    await job()
                except asyncio.CancelledError:
                    raise
                except OSError as exc:
                    # The disk, not the code: a line, not a trace (docs/api.md keeps those
                    # for bugs).
                    _log.warning(
                        "periodic job %s failed: %s; it runs again in %d ms", name, exc, interval_ms
                    )
                except Exception:
                    _log.exception(
                        "periodic job %s failed; it runs again in %d ms", name, interval_ms
                    )

        return asyncio.get_running_loop().create_task(loop(), name=name)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def prune_once(self) -> None:
        """Delete whole sealed segments below each partition's last redundant offset
        (docs/semantics.md §9, §A). Only a durable mark counts: the snapshots that make the older
        records redundant must survive a crash first."""
        history = await self._history()
        for state_partition, runtime in sorted(self._service.runtimes.items()):
            if runtime.status is not Status.ACTIVE:
                continue
            mark = runtime.shard.last_redundant_offset()
            log = runtime.log
            if mark is None or self._last_pruned.get(state_partition) == mark:
                continue
            # The mark is the lowest of every key's latest snapshot offset, as the shard
            # holds them in memory: a key whose newest snapshot is appended but not yet
            # fsynced already counts its previous, durable one as redundant. Had that
            # segment gone and the new snapshot then been lost (a failed fsync, a crash),
            # the key would be left without a snapshot. So: first wait until everything
            # the mark was computed from is durable; a failed commit skips the round.
            if await self._service.wait_durable([state_partition]):
                continue
            if mark >= log.durable_end_offset:
                continue
            may_delete = None if history is None else partial(history.holds, state_partition)
            try:
                deleted = await asyncio.to_thread(log.prune, mark, may_delete)
            except PartitionFailedError:
                continue  # its last commit just failed; the reload comes first
            if history is not None and self._held_back(state_partition, log.segments, mark):
                continue  # not done with this mark: the next round tries again
            self._last_pruned[state_partition] = mark
            if self._on_pruned is not None:
                self._on_pruned(state_partition, mark)
            if deleted:
                _log.info(
                    "state partition %d: pruned %d segments below offset %d",
                    state_partition,
                    len(deleted),
                    mark,
                )

    # --- pruning and the history (persistence/history.py) ------------------------------

    async def _history(self) -> HistoryIndex | None:
        """The data directory's history, if it keeps one: then only segments already
        exported to it may be pruned. The daemon has no Parquet writer; the compaction
        job exports (docs/design.md#the-history). Read every round, so a history
        declared or dropped by `sharecoord compact` counts without a restart."""
        if not self._service.runtimes:
            return None
        some_partition = next(iter(self._service.runtimes.values())).log.partition_dir
        if some_partition is None:
            return None  # a store without files keeps no history (yet)
        data_dir = os.path.dirname(os.path.dirname(some_partition))
        try:
            return await asyncio.to_thread(HistoryIndex.load, data_dir)
        except LogError as exc:
            _log.warning("pruning skipped: %s", exc)
            return _KEEP_EVERYTHING

    def _held_back(self, state_partition: int, segments: list[SegmentInfo], mark: int) -> bool:
        """Whether a segment below the mark stayed because the history lacks it; said
        once per segment."""
        if len(segments) < 2 or segments[1].base_offset > mark:
            self._held_at.pop(state_partition, None)
            return False
        held = os.path.basename(segments[0].path)
        if self._held_at.get(state_partition) != held:
            self._held_at[state_partition] = held
            _log.info(
                "state partition %d: pruning held back at segment %s: the history does not "
                "hold it yet (sharecoord compact exports it)",
                state_partition,
                held,
            )
        return True

    async def cold_snapshots_once(self) -> int:
        """docs/semantics.md §10 on every active partition; returns how many snapshots
        were written."""
        written = 0
        touched = []
        for state_partition, runtime in self._service.runtimes.items():
            if runtime.status is Status.ACTIVE:
                # It reads every key's state: after the background fold of a lazy load,
                # which would otherwise fold them all at once, here on the loop.
                await runtime.wait_folded()
                if runtime.status is not Status.ACTIVE:
                    continue
                try:
                    count = await run_job(runtime, ShareCoordinatorShard.cold_snapshots)
                except PartitionFailedError:
                    continue  # its commit just failed; the next pass after the reload
                if count:
                    written += count
                    touched.append(state_partition)
        failed = await self._service.wait_durable(touched)
        if failed:
            _log.warning("cold snapshots not durable on state partitions %s", sorted(failed))
        return written

    async def expire_groups_once(self) -> int:
        """State retention (docs/semantics.md §A): tombstone every share-partition of a
        group that no RPC touched here for the retention time. A group's clock starts at
        its last RPC or at this node's start, so a restart only ever delays expiry."""
        retention_s = self._intervals.state_retention_ms / 1000
        now = self._monotonic()
        touched_at = self._service.group_touched
        groups: set[str] = set()
        all_active = True
        for runtime in self._service.runtimes.values():
            if runtime.status is Status.ACTIVE:
                groups |= runtime.shard.group_ids()
            else:
                all_active = False
        if all_active:
            # A group without state here needs no clock: state only comes back through
            # an RPC, which starts it again. (With a partition loading or failed, its
            # groups are unknown, and their clocks must stay.)
            for group in touched_at.keys() - groups:
                del touched_at[group]
        expired = frozenset(
            g for g in groups if now - touched_at.get(g, self._started_at) >= retention_s
        )
        if not expired:
            return 0
        tombstoned = 0
        touched = []
        for state_partition, runtime in self._service.runtimes.items():
            if runtime.status is Status.ACTIVE:
                try:
                    count = await run_job(runtime, lambda shard: shard.expire_groups(expired))
                except PartitionFailedError:
                    continue  # its commit just failed; a later pass expires the rest
                if count:
                    tombstoned += count
                    touched.append(state_partition)
        for group in expired:
            touched_at.pop(group, None)
        failed = await self._service.wait_durable(touched)
        _log.info(
            "state retention: expired %d groups (%d share-partitions)%s",
            len(expired),
            tombstoned,
            f"; not durable on {sorted(failed)}" if failed else "",
        )
        return tombstoned
