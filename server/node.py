"""One sharecoord node (docs/design.md#one-node-two-transports): its configuration, its
state store, one runtime per state partition it owns, the coordinator service over them,
the metrics, the offload thread, the topic catalog, and their lifecycle.

It imports no transport. HTTP (``server.http``) and Kafka's protocol (``server.kafka``)
are two ways into the same node, each an adapter over a started ``Node``;
``server.daemon`` composes them. The lifecycle, in order:

1. ``Node(config, cluster)``: nothing is read or made on disk yet (``serve`` binds its
   listen addresses first, so that a port in use leaves no data directory behind).
2. ``start``: open the state store (``server.store.open_store``: the data directory,
   made if new, or the PostgreSQL store), load the topic catalog, build the runtimes and
   the service, start the group commit and the periodic jobs (``server.jobs``: pruning,
   cold snapshots, compaction commits, state retention, unfinished topic deletions),
   and load the state partitions in the background. On the PostgreSQL store the node
   owns no partition by configuration: its leadership (``server.leadership``) claims
   them by leases, and adopts and drops their runtimes (``adopt``, ``drop``) as it wins and
   loses them.
3. Ready: ``loading`` is true until every owned state partition loaded or failed and
   the topic deletions a stop left were finished (on the PostgreSQL store: until the
   node registered, claimed, and loaded what it leads); ``failures`` says which
   failed, why.
4. ``drain``: each transport that ``serves`` the node, the last one first, stops
   taking requests and finishes those in flight within ``--shutdown-timeout-s``.
5. ``stop``: stop the jobs and the loading, commit what is left, close the log;
   ``not_durable`` then names the partitions the final commit left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from persistence import FileOps
from protocol import codec
from protocol.messages import Rpc
from protocol.shard import ShardConfig
from server.catalog import TopicCatalog
from server.cluster import ClusterMap, format_partitions
from server.config import ServeConfig
from server.folds import BackgroundFolds
from server.jobs import JobIntervals, PeriodicJobs
from server.metric_families import CounterChild
from server.metrics import ShareCoordinatorMetrics
from server.offload import Offload, watch_loop_lag
from server.runtime import PartitionRuntime, Status
from server.service import CoordinatorService
from server.store import NodeStore, open_store

if TYPE_CHECKING:
    from server.leadership import Leadership

_log = logging.getLogger("sharecoord.node")

# Partitions loaded at once: loading is CPU-bound under the GIL, two keep the disk busy.
LOAD_CONCURRENCY = 2


@dataclass
class Drained:
    """What a drain did: requests answered after the stop began, and requests cut off
    (never answered: cut waiting for their body, or still running at the deadline)."""

    drained: int = 0
    cut_off: int = 0


class Transport(Protocol):
    """A way into the node, as its drain sees it (``server.http``, ``server.kafka``)."""

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        ...

    async def stop(self) -> Drained:
        """Stop taking requests, finish those in flight within ``--shutdown-timeout-s``,
        close the connections."""
        ...


class NodeNotStarted(RuntimeError):
    """The service was asked for before ``Node.start`` built it (a bug of the caller:
    the transports serve a started node)."""


class Node:
    def __init__(
        self, config: ServeConfig, cluster: ClusterMap, *, fs: FileOps | None = None
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.fs = fs
        self.metrics = ShareCoordinatorMetrics()
        self.offload = Offload()
        # The background folds of lazily loaded partitions take turns, behind the loads.
        self.folds = BackgroundFolds()
        # The request limits both transports decode with.
        self.limits = codec.Limits(
            max_entries_per_request=config.max_entries_per_request,
            max_state_batches_per_entry=config.max_state_batches_per_entry,
            max_group_id_bytes=config.max_group_id_bytes,
        )
        self.store: NodeStore | None = None
        self.leadership: Leadership | None = None
        # Where this node's Kafka listener is reached (the daemon says, once bound).
        self.kafka_advertised: str | None = None
        self.runtimes: dict[int, PartitionRuntime] = {}
        self._make_runtime: Callable[[int], PartitionRuntime] | None = None
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._service: CoordinatorService | None = None
        self._jobs: PeriodicJobs | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._transports: list[Transport] = []
        self._stopped = False

    @property
    def service(self) -> CoordinatorService:
        if self._service is None:
            raise NodeNotStarted("the node has not started")
        return self._service

    @property
    def jobs(self) -> PeriodicJobs:
        if self._jobs is None:
            raise NodeNotStarted("the node has not started")
        return self._jobs

    def rebind(self, cluster: ClusterMap) -> None:
        """Advertise another address for this node (the port bound for --listen :0)."""
        self.cluster = cluster
        if self._service is not None:
            self._service.cluster = cluster
        self._advertise()

    def _advertise(self) -> None:
        if self.leadership is not None:
            me = self.cluster.node(self.config.node_id)
            host = f"[{me.host}]" if ":" in me.host else me.host
            self.leadership.advertise(f"{host}:{me.port}", self.kafka_advertised)

    # --- start ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store and build what serves from it; the partitions load in the
        background. Raises what opening the log or the catalog raised (``LogError``,
        ``CatalogError``, ``OSError``), with nothing left open."""
        config = self.config
        runtimes = self.runtimes

        def partition_failed(partition: int, cause: BaseException) -> None:
            runtime = runtimes.get(partition)
            if runtime is not None:
                runtime.on_durability_failure(cause)

        def disk_full(cause: BaseException | None) -> None:
            for runtime in runtimes.values():
                runtime.journal_full(cause)

        store = await open_store(
            config,
            self.cluster,
            self.metrics,
            fs=self.fs,
            on_partition_failure=partition_failed,
            on_disk_full=disk_full,
        )
        leadership = self.leadership = store.leadership(self)
        if leadership is not None and config.cluster is not None:
            # On leases a cluster file is a preference only (server/leadership.py).
            cluster = self.cluster
            leadership.preferred = {p: cluster.owner(p).id for p in range(cluster.num_partitions)}
        owned = [] if leadership is not None else sorted(self.cluster.owned_by(config.node_id))
        try:
            # The catalog is a file of the data directory; on leases an empty one, never
            # written (the admin endpoints refuse to change it there).
            catalog = (
                TopicCatalog(config.data_dir, fs=self.fs)
                if leadership is not None
                else await asyncio.to_thread(TopicCatalog.load, config.data_dir, self.fs)
            )
            self._build(store, catalog, owned)
        except BaseException:
            await store.close()
            _log.info("state log closed")
            raise
        self.store = store
        service = self.service
        store.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(_load_all(runtimes, service, self.folds), name="load"),
            loop.create_task(watch_loop_lag(self.metrics.event_loop_lag.labels()), name="loop-lag"),
        ]
        service.start()
        self.jobs.start()
        if leadership is not None:
            self._advertise()
            leadership.start()
            _log.info(
                "leading state partitions by leases of %d ms on %s",
                config.lease_ms,
                store.description,
            )
            return
        _log.info(
            "serving state partitions %s of %d from %s",
            format_partitions(owned) or "none",
            config.partitions,
            store.description,
        )

    def _build(self, store: NodeStore, catalog: TopicCatalog, owned: list[int]) -> None:
        """One runtime per owned state partition, and the service over them."""
        config = self.config
        metrics = self.metrics
        shard_config = ShardConfig(
            records_per_snapshot=config.snapshot_update_records_per_snapshot,
            cold_partition_snapshot_interval_ms=config.cold_partition_snapshot_interval_ms,
            max_state_batches=config.max_state_batches_per_share_partition,
        )
        committer = store.committer
        runtimes = self.runtimes

        def make_runtime(partition: int) -> PartitionRuntime:
            runtime = PartitionRuntime(
                partition,
                store.log.partition(partition),
                shard_config,
                metadata=catalog if config.topic_catalog else None,
                metrics=metrics,
                exclusive=committer.run_exclusive,
                room=store.room,
                before_serving=committer.prepared,
                offload=self.offload,
                folds=self.folds,
            )
            _track(metrics, runtime)
            return runtime

        self._make_runtime = make_runtime
        for partition in owned:
            runtimes[partition] = make_runtime(partition)
        leadership = self.leadership
        metrics.shard_writes.set_function(lambda: sum(r.shard_writes for r in runtimes.values()))
        service = self._service = CoordinatorService(
            runtimes=runtimes,
            committer=committer,
            cluster=self.cluster,
            node_id=config.node_id,
            catalog=catalog,
            write_timeout_ms=config.write_timeout_ms,
            track_touches=config.state_retention_ms > 0,
            on_entry_results=_results_recorder(metrics),
            may_serve=None if leadership is None else leadership.may_serve,
            find_leaders=None if leadership is None else leadership.find_coordinator,
        )
        if leadership is not None:
            metrics.track_leadership(
                led=lambda: len(leadership.led),
                without_leader=lambda: leadership.without_leader,
                takeovers=lambda: leadership.takeovers,
            )
        self._jobs = PeriodicJobs(
            service,
            JobIntervals(
                prune_ms=config.prune_interval_ms,
                cold_snapshot_ms=config.cold_partition_snapshot_interval_ms,
                compaction_commit_ms=config.compaction_commit_interval_ms,
                state_retention_ms=config.state_retention_ms,
            ),
            on_pruned=lambda partition, mark: metrics.last_pruned_offset.labels(partition).set(
                mark
            ),
        )

    # --- ready ----------------------------------------------------------------------

    def loading(self) -> bool:
        """Not ready yet: not started, or a partition still loading, or (on leases) not
        registered yet (``/readyz``)."""
        if self._service is None or self._service.loading():
            return True
        return self.leadership is not None and not self.leadership.settled

    # --- partitions won and lost (server.leadership's PartitionHost) -------------------

    def adopt(self, partition: int) -> None:
        """This node leads ``partition`` from now on: its runtime loads it (14 until
        loaded), then serves it."""
        assert self._make_runtime is not None, "adopt before start"
        runtime = self.runtimes[partition] = self._make_runtime(partition)
        self._loads[partition] = asyncio.get_running_loop().create_task(
            runtime.load(), name=f"load-partition-{partition}"
        )

    async def drop(self, partition: int) -> None:
        """This node no longer leads ``partition``: its runtime and in-memory state go
        now (requests for it answer 16), its loading or reloading stops."""
        runtime = self.runtimes.pop(partition, None)
        load = self._loads.pop(partition, None)
        if runtime is None:
            return
        runtime.stop()
        if load is not None:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
        await runtime.close()
        self.metrics.untrack_partition(partition)

    def adopting(self) -> bool:
        return any(runtime.status is Status.LOADING for runtime in self.runtimes.values())

    def failures(self) -> list[tuple[int, str]]:
        """The failed state partitions, each with why."""
        return [] if self._service is None else self._service.failures()

    # --- drain ----------------------------------------------------------------------

    def serves(self, transport: Transport) -> None:
        """``transport`` takes requests for this node from now on; ``drain`` stops it."""
        self._transports.append(transport)

    @property
    def in_flight(self) -> int:
        """Requests being handled now, over every transport."""
        return sum(transport.in_flight for transport in self._transports)

    async def drain(self) -> Drained:
        """Stop every transport, the last one that began serving first, each finishing
        its requests in flight within ``--shutdown-timeout-s``: the log is still open
        for them. Returns the sum of what they drained and cut off."""
        total = Drained()
        while self._transports:
            done = await self._transports.pop().stop()
            total.drained += done.drained
            total.cut_off += done.cut_off
        return total

    # --- stop -----------------------------------------------------------------------

    async def stop(self) -> None:
        """After the drain: stop the loading and the jobs, close the runtimes and the
        offload thread, commit what is left and close the log. Once: a second call
        does nothing."""
        store = self.store
        if store is None or self._stopped:
            return
        self._stopped = True
        try:
            if self.leadership is not None:
                await self.leadership.stop()  # no claims, no renewals: the drain is done
            for runtime in self.runtimes.values():
                runtime.stop()  # replays in threads end now, not when the log does
            tasks = [*self._tasks, *self._loads.values()]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._jobs is not None:
                await self._jobs.stop()
            if self._service is not None:
                await self._service.stop()
            for runtime in self.runtimes.values():
                await runtime.close()
            await asyncio.to_thread(self.offload.close)
        finally:
            await store.close()
            _log.info("state log closed")

    def not_durable(self) -> list[int]:
        """The state partitions whose log ends past its last fsync (only a failed one
        can, once stopped)."""
        return [] if self.store is None else self.store.not_durable()


def _results_recorder(metrics: ShareCoordinatorMetrics) -> Callable[[Rpc, dict[int, int]], None]:
    results = metrics.partition_results
    children: dict[tuple[Rpc, int], CounterChild] = {}  # a few RPCs times a few codes

    def record(rpc: Rpc, codes: dict[int, int]) -> None:
        for code, count in codes.items():
            child = children.get((rpc, code))
            if child is None:
                child = children[rpc, code] = results.labels(rpc.value, code)
            child.inc(count)

    return record


def _track(metrics: ShareCoordinatorMetrics, runtime: PartitionRuntime) -> None:
    log = runtime.log
    metrics.track_partition(
        runtime.partition,
        status=lambda: runtime.status.value,
        keys=lambda: len(runtime.shard),
        keys_unfolded=lambda: runtime.keys_unfolded,
        log_start_offset=lambda: log.log_start_offset,
        log_end_offset=lambda: log.log_end_offset,
        segments=lambda: len(log.segments),
        size_bytes=lambda: log.size_bytes,
    )


async def _load_all(
    runtimes: dict[int, PartitionRuntime], service: CoordinatorService, folds: BackgroundFolds
) -> None:
    started = time.perf_counter()
    gate = asyncio.Semaphore(LOAD_CONCURRENCY)

    async def load(runtime: PartitionRuntime) -> None:
        async with gate:
            await runtime.load()

    # One load for the whole start, as the folds see it: between one partition's load and
    # the next, every partition loaded before would take a slice of its fold (they all
    # wake when the loads drop to none, ahead of the next load): the 50th partition
    # waited ~50 ms for its turn, and a 1M-record log loaded in 3.7 s instead of 1.4 s
    # with one load at a time.
    with folds.loading():
        await asyncio.gather(*(load(r) for r in runtimes.values()))
    failed = [p for p, r in runtimes.items() if r.status is Status.FAILED]
    _log.info(
        "loaded %d state partitions in %.2fs%s",
        len(runtimes),
        time.perf_counter() - started,
        f"; failed: {failed} (they answer 15, the rest serve)" if failed else "",
    )
    await service.after_load()
