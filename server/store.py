"""The node's state store (docs/design.md#one-node-two-transports): the state log, its
group commit, and what else the node needs of the store it runs on, behind one small
interface (``NodeStore``) that ``open_store`` builds from the configuration:

* ``LocalStore`` (here), the embedded default: the state log on disk, its group commit,
  the file operations under both and the watch on the disk's free space.
  ``LocalStore.open`` opens the log of the state partitions this node owns (creating the
  data directory if it is new) and builds the group committer over it, not yet running;
* ``PostgresNodeStore`` (server/postgres_store.py), with ``--state-store postgresql://``:
  the PostgreSQL store and its group commit, and the leases by which this node leads
  state partitions (server/leadership.py). Its module is imported only then: the
  driver is an extra.

``start`` runs the group commit; ``close`` commits what is left and closes the log. The
runtimes append into ``log.partition(n)`` and wait for durability through ``committer``;
neither they nor the service learn which store it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from persistence import FileOps, GroupCommitter, StateLog
from persistence.room import RoomWatch
from persistence.store import StateStore
from server.cluster import ClusterMap
from server.config import ServeConfig
from server.metrics import ShareCoordinatorMetrics

if TYPE_CHECKING:
    from server.leadership import Leadership, PartitionHost


class NodeStore(Protocol):
    """What the node needs of its state store."""

    @property
    def log(self) -> StateStore[Any]: ...

    @property
    def committer(self) -> GroupCommitter[Any]: ...

    @property
    def room(self) -> RoomWatch | None:
        """Where writes refused for a full disk wait for room; None without a disk."""
        ...

    @property
    def description(self) -> str:
        """Where the state is, for the log (a password never shows)."""
        ...

    def leadership(self, host: PartitionHost) -> Leadership | None:
        """The leases by which this node leads state partitions, serving them through
        ``host``; None for a store whose partitions the cluster file assigns."""
        ...

    def start(self) -> None: ...

    async def close(self) -> None: ...

    def not_durable(self) -> list[int]: ...


async def open_store(
    config: ServeConfig,
    cluster: ClusterMap,
    metrics: ShareCoordinatorMetrics,
    *,
    fs: FileOps | None,
    on_partition_failure: Callable[[int, BaseException], None],
    on_disk_full: Callable[[BaseException | None], None],
) -> NodeStore:
    """The store the configuration names: the PostgreSQL store for a ``state_store``
    URI, else the data directory."""
    if config.state_store is not None:
        from server.postgres_store import PostgresNodeStore  # noqa: PLC0415 (the extra)

        return await PostgresNodeStore.open(
            config, metrics, on_partition_failure=on_partition_failure
        )
    return await LocalStore.open(
        config,
        cluster,
        metrics,
        fs=fs,
        on_partition_failure=on_partition_failure,
        on_disk_full=on_disk_full,
    )


@dataclass
class LocalStore:
    log: StateLog
    committer: GroupCommitter[Any]
    # Where writes refused for a full disk wait for room (docs/operations.md#a-full-disk).
    room: RoomWatch
    description: str

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
    ) -> LocalStore:
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
            on_cycle=cycle_recorder(metrics),
            on_checkpoint=lambda seconds, _: metrics.checkpoint_duration.observe(seconds),
            checkpoint_interval_ms=config.journal_checkpoint_interval_ms,
            checkpoint_bytes=config.journal_checkpoint_bytes,
            journal_max_bytes=config.journal_max_bytes,
            on_disk_full=on_disk_full,
            room=room,
            kernel_flush=config.journal_flush == "kernel",
        )
        metrics.journal_bytes.set_function(lambda: committer.journal_bytes)
        return cls(log, committer, room, config.data_dir)

    def leadership(self, host: PartitionHost) -> Leadership | None:
        return None  # the cluster file says who owns what

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
        return not_durable(self.log)


def not_durable(log: StateStore[Any]) -> list[int]:
    """The state partitions whose log ends past its last flush."""
    return [p.partition for p in log.partitions if p.durable_end_offset < p.log_end_offset]


def cycle_recorder(metrics: ShareCoordinatorMetrics) -> Callable[[int, list[float]], None]:
    partitions = metrics.group_commit_partitions
    fsync = metrics.fsync_latency

    def record(count: int, durations: list[float]) -> None:
        partitions.observe(count)
        for seconds in durations:
            fsync.observe(seconds)

    return record
