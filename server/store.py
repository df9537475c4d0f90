"""The node's state store: the state log on disk, its group commit, the file operations
under both and the watch on the disk's free space (docs/design.md#one-node-two-transports).

``StateStore.open`` opens the log of the state partitions this node owns (creating the
data directory if it is new) and builds the group committer over it, not yet running;
``start`` runs it; ``close`` commits what is left, checkpoints and closes the log. The
runtimes append into ``log.partition(n)`` and wait for durability through ``committer``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from persistence import FileOps, GroupCommitter, StateLog
from persistence.room import RoomWatch
from server.cluster import ClusterMap
from server.config import ServeConfig
from server.metrics import ShareCoordinatorMetrics


@dataclass
class StateStore:
    log: StateLog
    committer: GroupCommitter[Any]
    # Where writes refused for a full disk wait for room (docs/operations.md#a-full-disk).
    room: RoomWatch

    @classmethod
    async def open(
        cls,
        config: ServeConfig,
        cluster: ClusterMap,
        metrics: ShareCoordinatorMetrics,
        *,
        fs: FileOps | None,
        on_partition_failure: Callable[[int, BaseException], None],
        on_disk_full: Callable[[BaseException | None], None],
    ) -> StateStore:
        """Open the log (in a thread: it reads every segment's tail) and build its group
        committer. ``on_partition_failure`` hears of a state partition whose commit
        failed, ``on_disk_full`` of a journal that cannot grow (None: it can again)."""
        log = await asyncio.to_thread(
            StateLog.open,
            config.data_dir,
            config.partitions,
            segment_bytes=config.segment_bytes,
            journal_segment_bytes=config.journal_segment_bytes,
            fs=fs,
            # Only what this node owns and may serve (docs/operations.md#moving-a-state-partition).
            assignment=cluster.assignment(config.node_id),
            # A full disk stops writes, not the start (docs/operations.md#a-full-disk).
            full_disk_ok=True,
        )
        room = RoomWatch(log.fs, config.data_dir)
        committer = GroupCommitter(
            log,
            on_partition_failure=on_partition_failure,
            linger_ms=config.append_linger_ms,
            on_cycle=_cycle_recorder(metrics),
            on_checkpoint=lambda seconds, _: metrics.checkpoint_duration.observe(seconds),
            checkpoint_interval_ms=config.journal_checkpoint_interval_ms,
            checkpoint_bytes=config.journal_checkpoint_bytes,
            journal_max_bytes=config.journal_max_bytes,
            on_disk_full=on_disk_full,
            room=room,
        )
        metrics.journal_bytes.set_function(lambda: committer.journal_bytes)
        return cls(log, committer, room)

    def start(self) -> None:
        self.committer.start()

    async def close(self) -> None:
        """The final commit (of everything appended, waited for or not), the last
        checkpoint, then the log closed. The log is closed even if the commit failed."""
        try:
            await self.committer.close()
        finally:
            await asyncio.to_thread(self.log.close)

    def not_durable(self) -> list[int]:
        """The state partitions whose log ends past its last fsync (after ``close``,
        only a failed one can)."""
        return [
            p.partition for p in self.log.partitions if p.durable_end_offset < p.log_end_offset
        ]


def _cycle_recorder(metrics: ShareCoordinatorMetrics) -> Callable[[int, list[float]], None]:
    partitions = metrics.group_commit_partitions
    fsync = metrics.fsync_latency

    def record(count: int, durations: list[float]) -> None:
        partitions.observe(count)
        for seconds in durations:
            fsync.observe(seconds)

    return record
