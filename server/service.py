"""The coordinator service: the RPC front of the state partitions.

A request is split entry by entry: each partition entry is routed with
``partition_for`` to the runtime of its state partition and run there at once; the
results are gathered back in request order (duplicates run twice, in order). Before
answering, the service waits until the log has made durable everything the answer
reveals, partition by partition; a partition whose write fails answers 15 for its
entries, and the others are not held back by it.

A failed partition that is ``readable`` (a full disk: runtime.py) answers reads from
its shard and 15 to the rest; from an entry answered 15 on, every later entry of the
request on that state partition is 15 too, as after a failed commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Protocol

from persistence import (
    DurabilityBarrier,
    DurabilityError,
    PartitionFailedError,
)
from protocol import errors
from protocol.messages import (
    AdminState,
    AnyPartitionResult,
    CoordinatorResult,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    PartitionStatus,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicResult,
    error_result,
)
from protocol.records import ShareKey
from protocol.routing import partition_for, partition_for_prefix, prefix_hash
from server.catalog import TopicCatalog
from server.cluster import ClusterMap, find_coordinator
from server.runtime import PartitionRuntime, Status
from server.turns import (
    Deadlines,
    Inactive,
    Place,
    execute_in_turn,
    inactive_code,
    run_job,
)

_log = logging.getLogger("sharecoord.service")

# How long a request runs its entries before it lets the event loop serve others.
SLICE_S = 0.002


# What a readable failed partition answers (runtime.PartitionRuntime.answer_read).
_READS: Final = frozenset({Rpc.READ, Rpc.READ_SUMMARY})
# Checked for every entry, as a C static (an enum member is otherwise two lookups).
_ACTIVE: Final = Status.ACTIVE
# Made for every entry: a class imported from a module Python runs is otherwise a lookup
# in this module's dict at each use.
_SHARE_KEY: Final = ShareKey


# Who leads each coordinator key's state partition (keys, kafka) -> one result per key.
FindLeaders = Callable[[list[str], bool], Awaitable[list[CoordinatorResult]]]


class Commits(Protocol):
    """What the service asks of the group commit (persistence.GroupCommitter). A
    protocol, not the class: in the compiled mode GroupCommitter is a native class, and a
    parameter of its type would take nothing else (the tests' stand-ins)."""

    @property
    def refusing_writes(self) -> bool: ...

    @property
    def journal_bytes(self) -> int: ...

    def wait_durable_many(self, targets: dict[int, int]) -> DurabilityBarrier: ...


class ServiceError(Exception):
    """An admin operation that cannot be done now; carries the Kafka code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CoordinatorService:
    def __init__(
        self,
        *,
        runtimes: dict[int, PartitionRuntime],
        committer: Commits,
        cluster: ClusterMap,
        node_id: int,
        catalog: TopicCatalog,
        write_timeout_ms: int,
        track_touches: bool = False,
        on_entry_results: Callable[[Rpc, dict[int, int]], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        may_serve: Callable[[int], bool] | None = None,
        find_leaders: FindLeaders | None = None,
    ) -> None:
        self.runtimes = runtimes
        # With leases (server/leadership.py): whether a partition held here may still be
        # answered for (its lease cannot have expired), and who leads each key's
        # partition. Without: the runtimes are what the cluster file gives this node.
        self._may_serve = may_serve
        self._find_leaders = find_leaders
        self.committer = committer
        self._journal_full_logged_at = -1.0e9
        self.cluster = cluster
        self.node_id = node_id
        self.num_partitions = cluster.num_partitions
        self.catalog = catalog
        self._write_timeout_s = write_timeout_ms / 1000
        self._deadlines = Deadlines(self._write_timeout_s, time.monotonic)
        self._on_entry_results = on_entry_results
        self._monotonic = monotonic
        # State retention (docs/semantics.md §A, server.jobs): when each group was last
        # touched by an RPC here. Kept only when retention is on (``track_touches``), and
        # pruned of groups without state (PeriodicJobs.expire_groups_once), so RPCs
        # naming ever new groups cannot grow it for good.
        self._track_touches = track_touches
        self.group_touched: dict[str, float] = {}
        self._sweeping: asyncio.Task[None] | None = None
        # Topic registrations and deletions, one at a time (each may wait for a commit).
        self._topic_changes = asyncio.Lock()
        # Not ready before loading ended and the deletions a stop left were finished.
        self._settling = True

    def start(self) -> None:
        """Keep the write timeout of the requests waiting for durability."""
        self._sweeping = asyncio.get_running_loop().create_task(
            self._deadlines.run(), name="write-timeouts"
        )

    async def stop(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
            self._sweeping = None

    # --- the five RPCs ----------------------------------------------------------------

    async def handle(
        self,
        rpc: Rpc,
        request: ShareGroupStateRequest[Any],
        place: Place | None = None,
    ) -> ShareGroupStateResponse[Any]:
        """Run every entry of a decoded request (``protocol.codec.prepare_request`` has
        been over it) and answer once what the answer shows is durable.

        A request never holds the event loop for long: it lets others run every
        ``SLICE_S`` of its own work, and a long entry runs on the offload thread
        (``PartitionRuntime.execute_offloaded``). A request with a ``place`` in an
        ``InOrder`` (those of one Kafka connection) runs its entries after the request
        before it there has run its own, even so; the durability waits overlap."""
        if place is None:
            return await self._handle(rpc, request)
        try:
            before = place.waits_for()
            if before is not None:
                await before
            return await self._handle(rpc, request, place.executed)
        finally:
            place.leave()

    async def _handle(
        self,
        rpc: Rpc,
        request: ShareGroupStateRequest[Any],
        executed: asyncio.Future[None] | None = None,
    ) -> ShareGroupStateResponse[Any]:
        group_id = request.group_id
        num_partitions = self.num_partitions
        runtimes = self.runtimes
        may_serve = self._may_serve
        if rpc is not Rpc.READ_SUMMARY and self.committer.refusing_writes:
            return self._refuse_while_journal_full(rpc, request)
        results: list[TopicResult[Any]] = []
        # Where each executed entry's result sits, per state partition, with the last
        # offset it must see durable (None: it saw only durable state), so a failed
        # commit turns exactly the entries it did not make durable into 15.
        placed: _Placed = {}
        failures: dict[int, int] = {}  # error code -> entries (successes are counted last)
        entries = 0
        touched_here = False
        refused: set[int] = set()  # readable failed partitions that answered an entry 15
        reads = rpc in _READS
        clock = time.perf_counter
        yield_at = clock() + SLICE_S
        for topic in request.topics:
            out: list[AnyPartitionResult] = []
            results.append(TopicResult(topic.topic_id, out))
            key_topic_id = topic.key_topic_id
            prefix = prefix_hash(group_id, key_topic_id)
            for entry in topic.partitions:
                if clock() >= yield_at:
                    await asyncio.sleep(0)
                    yield_at = clock() + SLICE_S
                entries += 1
                partition = entry.partition
                if entry.invalid is not None:
                    out.append(error_result(rpc, partition, errors.INVALID_REQUEST, entry.invalid))
                    failures[errors.INVALID_REQUEST] = failures.get(errors.INVALID_REQUEST, 0) + 1
                    continue
                state_partition = partition_for_prefix(prefix, partition, num_partitions)
                runtime = runtimes.get(state_partition)
                if runtime is None or (may_serve is not None and not may_serve(state_partition)):
                    code = errors.NOT_COORDINATOR
                elif runtime.status is not _ACTIVE:
                    touched_here = True
                    if (
                        reads
                        and runtime.readable
                        and state_partition not in refused
                        and not _waits_on_commit(placed.get(state_partition))
                    ):
                        key = _SHARE_KEY(group_id, key_topic_id, partition)
                        await runtime.fold_key(key)  # a long tail a load left, off the loop
                        answer = (  # (readable still, if that fold let the loop go)
                            runtime.answer_read(rpc, key, entry) if runtime.readable else None
                        )
                        if answer is not None:
                            _place(placed, state_partition, out, runtime.pending_offset_of(key))
                            out.append(answer)
                            if answer.error_code:
                                failures[answer.error_code] = failures.get(answer.error_code, 0) + 1
                            continue
                        refused.add(state_partition)
                    code = inactive_code(runtime)
                else:
                    touched_here = True
                    key = _SHARE_KEY(group_id, key_topic_id, partition)
                    try:
                        done = runtime.execute_now(rpc, key, entry)
                        if done is None:
                            result = await execute_in_turn(runtime, rpc, key, entry)
                            offset = runtime.pending_offset_of(key)
                            yield_at = clock() + SLICE_S
                        else:
                            result, offset = done
                    except Inactive as exc:
                        code = exc.code
                    except PartitionFailedError:
                        # Its last commit failed a moment ago and the runtime has not
                        # heard yet (it will, and reload): unavailable, and no bug.
                        code = errors.COORDINATOR_NOT_AVAILABLE
                    except Exception:
                        _log.exception("state partition %d: operation failed", state_partition)
                        code = errors.COORDINATOR_NOT_AVAILABLE
                    else:
                        _place(placed, state_partition, out, offset)
                        out.append(result)
                        if result.error_code:
                            failures[result.error_code] = failures.get(result.error_code, 0) + 1
                        continue
                out.append(_unavailable(rpc, partition, code))
                failures[code] = failures.get(code, 0) + 1
        if touched_here and self._track_touches:
            self.group_touched[group_id] = self._monotonic()
        if executed is not None:
            executed.set_result(None)
        if placed:
            targets = {}
            for state_partition, entries_there in placed.items():
                # The last entry's offset is the highest there (``_place``).
                last = entries_there[-1][2]
                if last is not None:
                    targets[state_partition] = last
            short = await self._durable_ends(targets)
            for state_partition, durable_end in short.items():
                for out, index, offset in placed[state_partition]:
                    if offset is not None and offset >= durable_end:
                        code = out[index].error_code
                        if code:
                            failures[code] -= 1
                        out[index] = _unavailable(
                            rpc, out[index].partition, errors.COORDINATOR_NOT_AVAILABLE
                        )
                        failures[errors.COORDINATOR_NOT_AVAILABLE] = (
                            failures.get(errors.COORDINATOR_NOT_AVAILABLE, 0) + 1
                        )
        if self._on_entry_results is not None:
            failed = sum(failures.values())
            if entries > failed:
                failures[errors.NONE] = entries - failed
            self._on_entry_results(rpc, failures)
        return ShareGroupStateResponse(results)

    def _refuse_while_journal_full(
        self, rpc: Rpc, request: ShareGroupStateRequest[Any]
    ) -> ShareGroupStateResponse[Any]:
        """Every entry answers 15: the journal is at journal_max_bytes because some
        partition's files will not sync, and a write could no longer be made durable.
        (Read-summary never writes and is still served.)"""
        now = time.monotonic()
        if now - self._journal_full_logged_at >= 1.0:  # a line a second, not one a request
            self._journal_full_logged_at = now
            _log.warning(
                "journal full (%d bytes no checkpoint could free): refusing writes (15)",
                self.committer.journal_bytes,
            )
        results = [
            TopicResult(
                topic.topic_id,
                [
                    _unavailable(rpc, entry.partition, errors.COORDINATOR_NOT_AVAILABLE)
                    for entry in topic.partitions
                ],
            )
            for topic in request.topics
        ]
        if self._on_entry_results is not None:
            self._on_entry_results(rpc, {errors.COORDINATOR_NOT_AVAILABLE: request.entry_count()})
        return ShareGroupStateResponse(results)

    async def wait_durable(self, partitions: Iterable[int]) -> list[int]:
        """Wait until each partition's log is durable up to its end now; return the
        partitions whose commit failed or did not finish within the write timeout."""
        targets = {}
        for state_partition in partitions:
            runtime = self.runtimes.get(state_partition)
            if runtime is None:
                continue  # no longer led here (leases): nothing of it is waited for
            offset = runtime.pending_offset()
            if offset is not None:
                targets[state_partition] = offset
        return list(await self._durable_ends(targets))

    async def _durable_ends(self, targets: dict[int, int]) -> dict[int, int]:
        """Wait until each partition's log is durable up to its target offset, behind
        one barrier for the whole request however many partitions it touched. For each
        partition whose commit failed or did not finish within the write timeout, the
        offset durability reached: what lies below it is durable (and stays so), what
        lies at or above it is not."""
        if not targets:
            return {}
        runtimes = self.runtimes
        barrier = self.committer.wait_durable_many(targets)
        future = barrier.future
        if not future.done():
            self._deadlines.add(future)
            await future
        short: dict[int, int] = {}
        for state_partition, error in barrier.failed.items():
            if isinstance(error, DurabilityError):
                short[state_partition] = error.durable_end_offset
            else:
                _log.error(
                    "state partition %d: unexpected durability failure: %r", state_partition, error
                )
                short[state_partition] = -1  # nothing is known to be durable
        if barrier.pending:
            _log.warning(
                "state partitions %s: commit did not finish within %.1fs; answering 15",
                sorted(barrier.pending),
                self._write_timeout_s,
            )
            for state_partition in barrier.pending:
                runtime = runtimes.get(state_partition)
                # A partition dropped meanwhile (leases): nothing is known to be durable.
                short[state_partition] = -1 if runtime is None else runtime.log.durable_end_offset
        return short

    async def find_coordinator(
        self, request: FindCoordinatorRequest, *, kafka: bool = False
    ) -> FindCoordinatorResponse:
        """Each key's node: from the cluster map, or, with leases, from the leaders and
        nodes tables (with ``kafka``, where its Kafka listener is)."""
        if self._find_leaders is not None:
            return FindCoordinatorResponse(await self._find_leaders(request.keys, kafka))
        return FindCoordinatorResponse(find_coordinator(self.cluster, request.keys))

    @property
    def leased(self) -> bool:
        """Whether this node leads its partitions by leases (no cluster file)."""
        return self._find_leaders is not None

    # --- admin ------------------------------------------------------------------------

    def _runtime_for_key(self, key: ShareKey) -> PartitionRuntime:
        state_partition = partition_for(
            key.group_id, key.topic_id, key.partition, self.num_partitions
        )
        runtime = self.runtimes.get(state_partition)
        if self._may_serve is not None and (
            runtime is None or not self._may_serve(state_partition)
        ):
            raise ServiceError(
                errors.NOT_COORDINATOR,
                f"state partition {state_partition} is not led by this node "
                "(POST /v1/find-coordinator names its leader)",
            )
        if runtime is None:
            owner = self.cluster.owner(state_partition)
            raise ServiceError(
                errors.NOT_COORDINATOR,
                f"state partition {state_partition} is owned by node {owner.id} "
                f"at {owner.host}:{owner.port}",
            )
        _require_readable(runtime)
        return runtime

    async def admin_state(self, key: ShareKey) -> AdminState | None:
        """The stored state of one key, no fencing, no side effect
        (docs/semantics.md §A.1 point 10).
        Like every read, it waits until what it shows is durable."""
        runtime = self._runtime_for_key(key)
        await runtime.fold_key(key)  # a long tail a load left, off the loop
        state = runtime.shard.admin_state(key)
        offset = runtime.pending_offset_of(key)
        if offset is not None:
            failed = await self._durable_ends({runtime.partition: offset})
            if failed:
                raise ServiceError(
                    errors.COORDINATOR_NOT_AVAILABLE,
                    f"state partition {runtime.partition} could not make its state durable",
                )
        return state

    # --- the topic catalog ---------------------------------------------------------------

    async def register_topic(self, topic_id: str, partition_count: int) -> None:
        """Register the topic or change its count. A topic whose deletion has not finished
        is deleted first, so that it starts from nothing (ServiceError if that cannot
        be done now)."""
        async with self._topic_changes:
            if topic_id in self.catalog.deleting():
                await self._finish_deletions(frozenset({topic_id}))
            await _catalog_write(self.catalog.register(topic_id, partition_count))

    async def delete_topic(self, topic_id: str) -> int:
        """Kafka's order: the topic leaves the catalog first, durably, so every RPC for it
        answers 3 from then on; then every share-partition of it on this node gets a
        tombstone (Kafka's onTopicsDeleted), and once they are durable the deletion is
        done. An RPC that raced the delete was therefore either run before the
        tombstones or refused. Returns how many share-partitions this call tombstoned.

        Raises ServiceError (14, 15) when a state partition is not active or the
        tombstones could not be made durable: the topic stays unregistered, and its
        deletion is finished by a later attempt (this call again, or the daemon on its
        own once every state partition is active, at start too)."""
        async with self._topic_changes:
            if topic_id in self.catalog:
                await _catalog_write(self.catalog.begin_deletion(topic_id))
            elif topic_id not in self.catalog.deleting():
                raise ServiceError(
                    errors.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic_id} is not in the topic catalog",
                )
            return await self._finish_deletions(frozenset({topic_id}))

    async def finish_deletions_once(self) -> int:
        """Finish every unfinished topic deletion, once every state partition is active
        (after loading, and then periodically); returns how many share-partitions it
        tombstoned."""
        if not self.catalog.deleting() or not self._all_active():
            return 0
        async with self._topic_changes:
            topic_ids = self.catalog.deleting()
            if not topic_ids:
                return 0
            try:
                deleted = await self._finish_deletions(topic_ids)
            except ServiceError:
                return 0  # said in the log; tried again a second from now
        _log.info(
            "finished deleting topic(s) %s: %d share-partitions tombstoned",
            ", ".join(sorted(topic_ids)),
            deleted,
        )
        return deleted

    async def _finish_deletions(self, topic_ids: frozenset[str]) -> int:
        """Tombstone every share-partition of these topics on the active state partitions
        (the topics are being deleted: no share-partition of theirs can get state any
        more), wait until the tombstones are durable, and end the deletions if every state
        partition got there. Returns how many share-partitions were tombstoned; raises
        ServiceError (14, 15) naming the partitions that did not."""
        deleted = 0
        swept: list[int] = []
        failed: list[int] = []
        loading: list[int] = []
        for state_partition, runtime in self.runtimes.items():
            if runtime.status is Status.ACTIVE:
                try:
                    deleted += await run_job(runtime, lambda shard: shard.delete_topics(topic_ids))
                except PartitionFailedError:
                    failed.append(state_partition)
                else:
                    swept.append(state_partition)
            else:
                (loading if runtime.status is Status.LOADING else failed).append(state_partition)
        failed += await self.wait_durable(swept)
        if not failed and not loading:
            await _catalog_write(self.catalog.end_deletions(topic_ids))
            return deleted
        problems = []
        if failed:
            problems.append(
                f"state partitions {sorted(failed)} are not available or could not make the "
                "tombstones durable"
            )
        if loading:
            problems.append(f"state partitions {sorted(loading)} are still loading")
        code = errors.COORDINATOR_NOT_AVAILABLE if failed else errors.COORDINATOR_LOAD_IN_PROGRESS
        message = (
            f"{'; '.join(problems)}; topic {', '.join(sorted(topic_ids))} is unregistered "
            "(its RPCs answer 3) and its deletion finishes once every state partition is "
            "active: on its own, or by deleting the topic again"
        )
        _log.warning("unfinished topic deletion: %s", message)
        raise ServiceError(code, message)

    def _all_active(self) -> bool:
        return all(r.status is Status.ACTIVE for r in self.runtimes.values())

    # --- compaction and status ----------------------------------------------------------

    async def commit_compaction(self) -> tuple[list[str], list[str]]:
        """Commit every staged compaction output of the partitions this node serves
        (docs/design.md's handshake); returns (committed, stale) as "partition/base"."""
        committed: list[str] = []
        stale: list[str] = []
        for state_partition, runtime in sorted(self.runtimes.items()):
            if runtime.status is not Status.ACTIVE:
                continue
            log = runtime.log
            bases = await asyncio.to_thread(log.pending_compactions)
            for base in bases:
                try:
                    outcome = await asyncio.to_thread(log.commit_staged, base)
                except PartitionFailedError:
                    break  # its last commit just failed; the next scan after the reload
                except Exception:
                    _log.exception(
                        "state partition %d: committing compaction at %d failed",
                        state_partition,
                        base,
                    )
                    continue
                name = f"{state_partition}/{base}"
                (committed if outcome == "committed" else stale).append(name)
                _log.info("state partition %d: compaction at %d %s", state_partition, base, outcome)
        return committed, stale

    def partition_statuses(self) -> list[PartitionStatus]:
        out = []
        for state_partition, runtime in sorted(self.runtimes.items()):
            log = runtime.log
            loaded = runtime.status is not Status.LOADING
            out.append(
                PartitionStatus(
                    state_partition,
                    runtime.status.value,
                    log.log_start_offset if loaded else None,
                    log.log_end_offset if loaded else None,
                    len(log.segments) if loaded else None,
                    log.size_bytes if loaded else None,
                    len(runtime.shard),
                    runtime.error,
                )
            )
        return out

    async def after_load(self) -> None:
        """Once loading ended: finish the topic deletions a stop left unfinished, then
        stop counting as loading."""
        try:
            await self.finish_deletions_once()
        finally:
            self._settling = False

    def loading(self) -> bool:
        return self._settling or any(r.status is Status.LOADING for r in self.runtimes.values())

    def failed_partitions(self) -> list[int]:
        return sorted(p for p, r in self.runtimes.items() if r.status is Status.FAILED)

    def failures(self) -> list[tuple[int, str]]:
        """The failed partitions, each with why."""
        return [
            (p, r.error or "failed")
            for p, r in sorted(self.runtimes.items())
            if r.status is Status.FAILED
        ]


# An executed entry's result: the list it sits in, its index there, and the offset it
# must see durable (None: it saw only durable state).
_Slot = tuple[list[AnyPartitionResult], int, int | None]
_Placed = dict[int, list[_Slot]]


def _place(
    placed: _Placed, state_partition: int, out: list[AnyPartitionResult], offset: int | None
) -> None:
    """Place the result about to be appended to ``out``, with the offset it must see
    durable: its key's last record, and never less than what an earlier entry of the
    request on the same state partition waits for (so the last entry placed on a
    partition waits for the highest offset there, and for none only if none there
    does). A key's own offset spares a read of a quiet key the wait behind another
    request's long write; within a request, an entry after one a failed commit turns
    into 15 is 15 too, whichever key it is on (its answer may rest on what that commit
    lost)."""
    there = placed.setdefault(state_partition, [])
    if there:
        before = there[-1][2]
        if before is not None and (offset is None or offset < before):
            offset = before
    there.append((out, len(out), offset))


def _waits_on_commit(placed: list[_Slot] | None) -> bool:
    """Whether an entry of this request ran on the partition while it was active and
    waits for a commit: the partition failed since, that commit with it, so those
    entries will answer 15, and every later one there answers 15 too (never an answer
    from the shard after a 15 on the same state partition)."""
    return placed is not None and any(offset is not None for _, _, offset in placed)


def _unavailable(rpc: Rpc, partition: int, code: int) -> AnyPartitionResult:
    message = (
        errors.MSG_SHARE_COORDINATOR_NOT_AVAILABLE
        if code == errors.COORDINATOR_NOT_AVAILABLE
        else errors.default_message(code)
    )
    return error_result(rpc, partition, code, message)


def _require_readable(runtime: PartitionRuntime) -> None:
    """For reads: an active partition, or a failed one that still serves reads."""
    if runtime.status is Status.FAILED and runtime.readable:
        return
    _require_active(runtime)


def _require_active(runtime: PartitionRuntime) -> None:
    if runtime.status is Status.LOADING:
        raise ServiceError(
            errors.COORDINATOR_LOAD_IN_PROGRESS,
            f"state partition {runtime.partition} is still loading",
        )
    if runtime.status is Status.FAILED:
        raise ServiceError(
            errors.COORDINATOR_NOT_AVAILABLE,
            f"state partition {runtime.partition} is not available: {runtime.error}",
        )


async def _catalog_write(change: Awaitable[None]) -> None:
    """Run a change of the topic catalog; a disk that refuses it is 15, one line."""
    try:
        await change
    except OSError as exc:
        raise ServiceError(
            errors.COORDINATOR_NOT_AVAILABLE, f"cannot write the topic catalog: {exc}"
        ) from None
