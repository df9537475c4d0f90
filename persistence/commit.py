"""Group commit through the shared journal: one cycle makes every dirty partition's
appends durable with one journal record and one fdatasync, then releases exactly the
waiters it covered.

A cycle:
  1. (event loop) take the dirty partitions' buffered appends (PartitionLog.take_pending:
     memory only);
  2. (commit thread) write them as one journal record and fdatasync the journal; then
     write each partition's frames to its active segment, without fsync (journal.py);
  3. (event loop) resolve the waiters whose offsets are now durable. A journal failure
     fails every waiter of the cycle (they shared the flush) and stops those partitions
     until they reload; a partition's own write failure fails that partition alone.
With the kernel's flush (kernel_flush.py, Linux), step 2 changes where a record fits
the journal's current segment: the event loop writes the record (the page cache) and
the kernel runs its fdatasync; then the loop writes each partition's frames that fit
its active segment while its lock is free, and the commit thread the others, after the
waiters were answered (an answer never waited for them: a batch whose record is durable
is answered even if its files then fail). Anything else (no segment yet, a roll of the
journal, a failed record to erase) takes the commit thread as above.
Appends and waits arriving while a cycle is in flight mark their partitions dirty and
the next cycle starts as soon as this one ends: batching comes from the fsync time
itself, with no sleep on the path (but Kafka's append linger, when set).

Checkpoints run in a thread of their own, off the request path: every
`checkpoint_bytes` of journal, every `checkpoint_interval_ms`, and at close. One
fdatasyncs the partitions written since the last one, records CHECKPOINT, and deletes
the journal segments nothing needs any more (StateLog.take_checkpoint). Its LSN is where
the journal ended after the last cycle whose partition files are written, never the
journal's end itself: a timed checkpoint may start while a cycle is in the commit
thread, whose record may be journaled and its frames not yet in the files. A partition
whose sync fails keeps the journal from shrinking below its frames; past
`journal_max_bytes` the committer refuses writes (`refusing_writes`) until a checkpoint
gets through.

A full disk (ENOSPC, EDQUOT) is met before any record is lost to it: the journal keeps
its next segment made ahead of need, and when the disk has no room for it (or for the
writes that end the data directory's open) the committer reports the disk full
(`disk_full`, `on_disk_full`), and the service refuses writes (15) before they reach a
shard, while reads go on (readiness.py). A cycle whose journal record the disk refuses
all the same (a record larger than a segment) fails as any, and reports it too.

Measured (bench/group_commit.py): a cycle's fsync time no longer grows with the number
of dirty partitions; see bench/results.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar, cast

from persistence.errors import DurabilityError, LogError, PartitionFailedError
from persistence.fileops import is_disk_full
from persistence.journal import Journal
from persistence.kernel_flush import KernelFlush
from persistence.partition import PendingBatch
from persistence.readiness import DiskFullCallback, JournalReadiness
from persistence.room import RoomWatch
from persistence.statelog import CHECKPOINT_SPREAD, StateLog
from persistence.store import BatchT, CycleResult, StateStore

_log = logging.getLogger("sharecoord.log")

DEFAULT_CHECKPOINT_INTERVAL_MS = 10_000
DEFAULT_CHECKPOINT_BYTES = 8 * 1024 * 1024
DEFAULT_JOURNAL_MAX_BYTES = 1024 * 1024 * 1024

T = TypeVar("T")

FailureCallback = Callable[[int, BaseException], None]
# After each cycle: how many partitions it wrote, and its journal write + fdatasync time.
CycleCallback = Callable[[int, list[float]], None]
# After each checkpoint: how long it took, and how many partitions it synced.
CheckpointCallback = Callable[[float, int], None]


class DurabilityBarrier:
    """One wait over several partitions: done once each is durable up to its offset or
    has failed. `future` resolves to {partition: error} for the failed ones (empty when
    all are durable); `pending` holds the partitions not settled yet."""

    __slots__ = ("failed", "future", "pending")

    def __init__(self, future: asyncio.Future[dict[int, BaseException]]) -> None:
        self.future = future
        self.failed: dict[int, BaseException] = {}
        self.pending: set[int] = set()

    def settle(self, partition: int, error: BaseException | None = None) -> None:
        if partition not in self.pending:
            return
        self.pending.discard(partition)
        if error is not None:
            self.failed[partition] = error
        if not self.pending and not self.future.done():
            self.future.set_result(self.failed)


# offset, arrival order, and a future (one partition) or a barrier (several)
_Waiter = tuple[int, int, "asyncio.Future[None] | DurabilityBarrier"]


class GroupCommitter(Generic[BatchT]):
    """The group commit over any state store (persistence/store.py). The journal's
    upkeep (its readiness on a full disk, checkpoints, journal_max_bytes) is the local
    store's alone: over another store those parts are idle (no disk_full, no
    checkpoints, never refusing_writes)."""

    def __init__(
        self,
        log: StateStore[BatchT],
        *,
        on_partition_failure: FailureCallback | None = None,
        linger_ms: float = 0,
        on_cycle: CycleCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
        journal_max_bytes: int = DEFAULT_JOURNAL_MAX_BYTES,
        on_disk_full: DiskFullCallback | None = None,
        room: RoomWatch | None = None,
        kernel_flush: bool = True,
    ) -> None:
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        # Two statements, not a conditional expression: mypyc types that expression by
        # its else branch (None) and the compiled mode then refuses a StateLog.
        local: StateLog | None = None
        if isinstance(log, StateLog):
            local = log
        if local is not None and local.journal is None:
            raise ValueError("group commit needs a data directory opened for writing")
        # Kafka's append.linger.ms: wait this long after the first dirty partition before
        # a cycle, to gather more. 0 by default: appends arriving during an fsync already
        # share the next cycle, so a linger only adds latency unless the disk is very fast.
        self._linger_s = linger_ms / 1000
        self._on_cycle = on_cycle
        self._on_checkpoint = on_checkpoint
        self._log = log
        # The local store and its journal; None over another store.
        self._local = local
        self._journal: Journal | None = None if local is None else local.journal
        self._on_partition_failure = on_partition_failure
        self._checkpoint_interval_s = checkpoint_interval_ms / 1000
        self._checkpoint_bytes = checkpoint_bytes
        self._journal_max_bytes = journal_max_bytes
        # The journal's flush by the kernel (kernel_flush.py), where the files allow it
        # (the tests' fault-injecting ones fail their calls in the commit thread).
        self._use_kernel_flush = (
            kernel_flush and local is not None and local.fs.allows_kernel_flush()
        )
        self._kernel_flush: KernelFlush | None = None
        # Held by a cycle and by run_exclusive's job: a reset never runs while a cycle
        # checks its batches' generations on the event loop.
        self._cycle_lock: asyncio.Lock | None = None
        # The last cycle's partition files still being written (kernel flush), and
        # what such writes failed, for the next cycle boundary.
        self._applying: asyncio.Future[list[BaseException | None]] | None = None
        self._apply_failures: list[tuple[int, BaseException]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._checkpointer: ThreadPoolExecutor | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # its loop, once started
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closing = False
        self._dirty: set[int] = set()
        self._waiters: dict[int, list[_Waiter]] = {}
        self._arrival = itertools.count()
        self._reported: dict[int, BaseException] = {}
        # Partitions with journaled frames no checkpoint has synced yet.
        self._unsynced: set[int] = set()
        self._journal_bytes_at_checkpoint = 0
        # Where the journal ended after the last cycle whose files are written: what a
        # checkpoint may count as applied (set at start, then by each cycle).
        self._applied_lsn = 0
        self._last_checkpoint = time.monotonic()
        self.cycles = 0  # commit cycles that wrote something
        self.checkpoints = 0
        self._readiness: JournalReadiness | None = None
        if local is not None and self._journal is not None:
            self._readiness = JournalReadiness(
                local, self._journal, room or RoomWatch(local.fs, local.data_dir), on_disk_full
            )

    def start(self) -> None:
        """Start committing, on the running event loop."""
        if self._task is not None:
            raise RuntimeError("GroupCommitter already started")
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sharecoord-commit")
        self._wakeup = asyncio.Event()
        self._cycle_lock = asyncio.Lock()
        loop = self._loop = asyncio.get_running_loop()
        if self._use_kernel_flush:
            self._kernel_flush = KernelFlush.open()
            if self._kernel_flush is not None:
                self._kernel_flush.start(loop)
                _log.info("journal flush: by the kernel (Linux AIO)")
        self._task = loop.create_task(self._run(), name="group-commit")
        if self._journal is not None:
            self._applied_lsn = self._journal.end_lsn
        if self._readiness is None:
            return
        self._checkpointer = ThreadPoolExecutor(1, thread_name_prefix="sharecoord-checkpoint")
        self._ticker = loop.create_task(self._tick(), name="checkpoint-ticker")
        # The journal's first segments, ahead of the first cycle (and the end of the
        # data directory's open, if a full disk held it back).
        self._readiness.start(self._checkpointer)

    @property
    def kernel_flushes(self) -> int | None:
        """Journal flushes the kernel finished, or None while the commit thread does
        them all (no kernel flush here, or it was turned off)."""
        return None if self._kernel_flush is None else self._kernel_flush.flushes

    @property
    def journal_bytes(self) -> int:
        """Journal bytes no checkpoint has freed yet."""
        if self._local is None or self._journal is None:
            return 0
        return max(0, self._journal.end_lsn - self._local.checkpoint.lowest_lsn())

    async def prepared(self) -> None:
        """Return once the journal's first try to get ready (start) has ended, in
        success or with `disk_full` set: a partition should not serve before, or a
        write could reach its shard that a full disk then refuses."""
        if self._readiness is not None:
            await self._readiness.prepared()

    @property
    def disk_full(self) -> BaseException | None:
        """The error of a full disk that keeps the journal from taking records (no room
        for its next segment, or for the end of the open, which any error of the disk
        holds back), or None. Writes must be refused (15) before they reach a shard
        while it is set; reads go on."""
        return None if self._readiness is None else self._readiness.disk_full

    @property
    def refusing_writes(self) -> bool:
        """The journal is past journal_max_bytes: checkpoints cannot shrink it (a
        partition whose files will not sync). Writes must be refused (15) until one
        does."""
        return self.journal_bytes > self._journal_max_bytes

    async def close(self) -> None:
        """Commit everything appended so far (waited for or not), checkpoint, stop."""
        if self._task is None or self._wakeup is None or self._executor is None:
            return
        if not self._closing:
            self._closing = True
            if self._journal is not None:
                self._journal.hurry()  # the last checkpoint waits for its thread
            self._dirty.update(p.partition for p in self._log.partitions if p.has_pending)
            self._wakeup.set()
        try:
            await self._task
        finally:
            if self._applying is not None:
                await asyncio.gather(self._applying, return_exceptions=True)
                self._settle_applied()
            if self._kernel_flush is not None:
                self._kernel_flush.close()
            if self._ticker is not None:
                self._ticker.cancel()
            if self._readiness is not None:
                await self._readiness.close()
            if self._checkpoint_task is not None:
                await asyncio.gather(self._checkpoint_task, return_exceptions=True)
            try:
                await self._checkpoint(spread=0.0)  # the last one, at full speed
            except OSError as exc:
                # The disk, not a bug: a line (the journal keeps it all for the next start).
                _log.warning(
                    "the last checkpoint failed (%s); the journal keeps what it covers", exc
                )
            except Exception:
                _log.exception("the last checkpoint failed; the journal keeps what it covers")
            await asyncio.to_thread(self._executor.shutdown, True)
            if self._checkpointer is not None:
                await asyncio.to_thread(self._checkpointer.shutdown, True)

    def wait_durable(self, partition: int, offset: int) -> asyncio.Future[None]:
        """A future that completes once `offset` of `partition` is durable, or fails
        with DurabilityError if that partition's commit fails first."""
        loop = self._loop
        if self._task is None or self._wakeup is None or loop is None or self._closing:
            raise RuntimeError("GroupCommitter is not running")
        log = self._log.partition(partition)
        future: asyncio.Future[None] = loop.create_future()
        if offset < log.durable_end_offset:
            future.set_result(None)
        elif log.failure is not None:
            future.set_exception(DurabilityError(partition, log.failure, log.durable_end_offset))
        elif offset >= log.log_end_offset:
            raise ValueError(
                f"offset {offset} of partition {partition} was never appended "
                f"(log end offset {log.log_end_offset})"
            )
        else:
            heapq.heappush(
                self._waiters.setdefault(partition, []), (offset, next(self._arrival), future)
            )
            self._dirty.add(partition)
            self._wakeup.set()
        return future

    def wait_durable_many(self, targets: dict[int, int]) -> DurabilityBarrier:
        """One barrier for several partitions: partition -> the offset that must be
        durable. Cheaper than a future per partition for a request that touched many."""
        loop = self._loop
        if self._task is None or self._wakeup is None or loop is None or self._closing:
            raise RuntimeError("GroupCommitter is not running")
        barrier = DurabilityBarrier(loop.create_future())
        for partition, offset in targets.items():
            log = self._log.partition(partition)
            if offset < log.durable_end_offset:
                continue
            if log.failure is not None:
                barrier.failed[partition] = DurabilityError(
                    partition, log.failure, log.durable_end_offset
                )
                continue
            if offset >= log.log_end_offset:
                raise ValueError(
                    f"offset {offset} of partition {partition} was never appended "
                    f"(log end offset {log.log_end_offset})"
                )
            barrier.pending.add(partition)
            heapq.heappush(
                self._waiters.setdefault(partition, []), (offset, next(self._arrival), barrier)
            )
            self._dirty.add(partition)
        if barrier.pending:
            self._wakeup.set()
        else:
            barrier.future.set_result(barrier.failed)
        return barrier

    async def _run(self) -> None:
        assert self._wakeup is not None
        try:
            while True:
                await self._wakeup.wait()
                if self._linger_s and not self._closing:
                    await asyncio.sleep(self._linger_s)
                self._wakeup.clear()
                self._settle_applied()
                if self._dirty:
                    dirty, self._dirty = self._dirty, set()
                    await self._cycle(sorted(dirty))
                if self._closing and not self._dirty:
                    return
        except asyncio.CancelledError:
            self._fail_all(RuntimeError("group commit was cancelled"))
            raise
        except Exception as exc:
            _log.exception("group commit stopped")
            self._fail_all(exc)
            raise

    def _fail_all(self, cause: BaseException) -> None:
        for partition in list(self._waiters):
            self._fail_waiters(partition, cause)

    async def _cycle(self, dirty: list[int]) -> None:
        batches: list[tuple[int, BatchT]] = []
        for partition in dirty:
            log = self._log.partition(partition)
            try:
                batch = log.take_pending()
            except PartitionFailedError as exc:
                self._partition_failed(partition, exc.cause or exc)
                continue
            if batch is not None:
                batches.append((partition, batch))
            else:
                self._release(partition)
        if not batches:
            return
        if self._local is not None and self._local.opening_unfinished:
            # No record before the open's CHECKPOINT (StateLog.finish_opening): the
            # service refuses writes meanwhile, so only a write racing the refusal
            # gets here.
            refusal = LogError(
                f"the data directory's open is not finished: {self.disk_full or 'not yet'}"
            )
            for partition, _ in batches:
                self._log.partition(partition).fail(refusal)
                self._partition_failed(partition, refusal)
            return
        self.cycles += 1
        loop = asyncio.get_running_loop()
        journal = self._journal
        rolled_from = None if journal is None else journal.spare_lsn
        assert self._cycle_lock is not None
        async with self._cycle_lock:
            flushed = None
            if self._kernel_flush is not None:
                # Shielded: once the record is written, its cycle ends whatever
                # happens to this task (as the commit thread's does).
                flushed = await asyncio.shield(self._flush_in_kernel(batches))
            if flushed is None:
                result = await loop.run_in_executor(self._executor, self._log.commit_cycle, batches)
                applied = True
            else:
                # Not applied: the commit thread writes some files yet (_applied).
                result, applied = flushed
        shared = result.shared
        if shared is not None and is_disk_full(shared) and self._readiness is not None:
            self._readiness.refused(shared)
        if self._on_cycle is not None:
            self._on_cycle(len(batches), [result.seconds])
        if result.end_lsn is not None:
            self._applied_lsn = result.end_lsn
        for (partition, _), error in zip(batches, result.errors, strict=True):
            # Released first: a batch whose journal record is durable is answered even
            # if its partition's files then failed (the partition stops and repairs
            # itself from the journal).
            self._release(partition)
            if applied and (error is None or error is not shared):
                self._unsynced.add(partition)
            if error is not None:
                cause = error.cause if isinstance(error, PartitionFailedError) else error
                self._partition_failed(partition, cause or error)
        if journal is None or self._readiness is None:
            return
        if journal.spare_lsn != rolled_from:
            self._readiness.make_ready()
        if journal.bytes_written - self._journal_bytes_at_checkpoint >= self._checkpoint_bytes:
            self._start_checkpoint()

    async def _flush_in_kernel(
        self, batches: list[tuple[int, BatchT]]
    ) -> tuple[CycleResult, bool] | None:
        """The cycle's journal record written from here and flushed by the kernel; then
        its partition files written, here where that needs no wait, else in the commit
        thread (_applied hears how that went). With whether the files are all written.
        None, having written nothing, when the record needs the commit thread
        (commit_cycle): no segment yet, a roll, a failed record to erase."""
        local = self._local
        journal = self._journal
        flush = self._kernel_flush
        assert local is not None
        assert journal is not None
        assert flush is not None
        local_batches = cast("list[tuple[int, PendingBatch]]", batches)
        errors, entries = local.cycle_entries(local_batches)
        record = journal.prepare(entries) if entries else None
        if record is None:
            return None
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            journal.write(record)
            try:
                flushed = flush.fdatasync(record.fd)
            except OSError as exc:
                # The kernel will not take it (no FDSYNC in this kernel, say): the
                # commit thread flushes this record and every one after it.
                _log.warning("journal flush: in the commit thread from now on (%s)", exc)
                self._kernel_flush = None
                flush.close()
                await loop.run_in_executor(self._executor, local.fs.fdatasync, record.fd)
            else:
                await flushed
                local.fs.flushed(record.fd)
        except OSError as exc:
            seconds = time.perf_counter() - started
            await loop.run_in_executor(self._executor, journal.abandon, record)
            return local.fail_cycle(local_batches, exc, seconds), True
        seconds = time.perf_counter() - started
        journal.synced(record)
        local.journaled(local_batches, errors)
        if self._applying is None or self._applying.done():
            # Page-cache writes, here; what would wait (a lock taken, a roll) is left.
            left = local.apply_what_can_be(local_batches, errors)
        else:  # the thread is still at an earlier cycle's: after it, in order
            left = [index for index, error in enumerate(errors) if error is None]
        if not left:
            return CycleResult(errors, None, seconds, journal.end_lsn), True
        rest = [local_batches[index] for index in left]
        applying = loop.run_in_executor(self._executor, local.apply_cycle, rest, [None] * len(rest))
        applying.add_done_callback(
            functools.partial(
                self._applied, [p for p, _ in batches], [p for p, _ in rest], journal.end_lsn
            )
        )
        self._applying = applying
        return CycleResult(errors, None, seconds), False

    def _applied(
        self,
        partitions: list[int],
        left: list[int],
        end_lsn: int,
        applying: asyncio.Future[list[BaseException | None]],
    ) -> None:
        """The partition files a kernel-flushed cycle left to the commit thread are
        written: what a checkpoint may count from now on (every partition of the cycle
        has unsynced frames), and the partitions whose files failed."""
        if applying.cancelled():
            return
        failure = applying.exception()
        if failure is not None:  # a bug: apply_cycle reports each partition's own
            _log.error("writing a cycle's partition files failed: %r", failure)
            return
        self._applied_lsn = end_lsn
        self._unsynced.update(partitions)
        for partition, error in zip(left, applying.result(), strict=True):
            if error is not None:
                # Stopped already (its files refuse writes); its waiters hear it at
                # the next cycle boundary, where no cycle holds a batch of it.
                self._apply_failures.append((partition, error))
        if self._apply_failures and self._wakeup is not None:
            self._wakeup.set()

    def _settle_applied(self) -> None:
        failures, self._apply_failures = self._apply_failures, []
        for partition, error in failures:
            cause = error.cause if isinstance(error, PartitionFailedError) else error
            self._partition_failed(partition, cause or error)

    # -- checkpoints -------------------------------------------------------------------

    async def _tick(self) -> None:
        """Checkpoint on time as well as on volume: a quiet daemon's journal shrinks."""
        while True:
            await asyncio.sleep(self._checkpoint_interval_s)
            if self._unsynced and time.monotonic() - self._last_checkpoint >= (
                self._checkpoint_interval_s * 0.9
            ):
                self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        if self._checkpoint_task is None or self._checkpoint_task.done():
            self._checkpoint_task = asyncio.get_running_loop().create_task(
                self._checkpoint(), name="checkpoint"
            )

    async def _checkpoint(self, spread: float = CHECKPOINT_SPREAD) -> None:
        """One checkpoint at the journal's end as it is now (between cycles: every
        record below it has been applied to the partition files), paced by `spread`
        (StateLog.take_checkpoint)."""
        if self._checkpointer is None or self._local is None or self._journal is None:
            return
        # Not the journal's end: the cycle in the commit thread may have journaled a
        # record whose partition files are not written yet.
        lsn = self._applied_lsn
        written, self._unsynced = self._unsynced, set()
        self._journal_bytes_at_checkpoint = self._journal.bytes_written
        started = time.monotonic()
        loop = asyncio.get_running_loop()

        def stop_now(partition: int, error: BaseException) -> None:
            # From the checkpoint's thread, as the sync fails: the partition stops
            # before anything that follows the fault (its clearing, a look at the
            # partitions' status) can be answered on the event loop.
            # (A closed loop: the daemon is gone, and the partition with it.)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._partition_stopped, partition, error)

        try:
            failures = await loop.run_in_executor(
                self._checkpointer, self._local.take_checkpoint, lsn, written, stop_now, spread
            )
        except OSError as exc:
            self._unsynced |= written  # the old CHECKPOINT stands: sync them next time
            if self._closing:
                raise
            # CHECKPOINT itself could not be written (a full disk): the journal keeps
            # every frame, and the next checkpoint tries again. A line, not a trace.
            _log.warning("checkpoint not written: %s; the next one tries again", exc)
            return
        except BaseException:
            self._unsynced |= written  # the old CHECKPOINT stands: sync them next time
            raise
        self._last_checkpoint = time.monotonic()
        self.checkpoints += 1
        for partition in failures:
            self._unsynced.add(partition)  # stopped already, by stop_now
        if self._on_checkpoint is not None:
            self._on_checkpoint(self._last_checkpoint - started, len(written))

    # -- waiters -----------------------------------------------------------------------

    def _release(self, partition: int) -> None:
        """Resolve the waiters of `partition` that are now durable."""
        waiters = self._waiters.get(partition)
        durable_end = self._log.partition(partition).durable_end_offset
        while waiters and waiters[0][0] < durable_end:
            _, _, waiter = heapq.heappop(waiters)
            if isinstance(waiter, DurabilityBarrier):
                waiter.settle(partition)
            elif not waiter.done():
                waiter.set_result(None)

    def _partition_failed(self, partition: int, cause: BaseException) -> None:
        """A cycle failed the partition: what it did not make durable fails."""
        self._release(partition)
        self._fail_waiters(partition, cause)
        self._report(partition, cause)

    def _partition_stopped(self, partition: int, cause: BaseException) -> None:
        """Its files would not sync (a checkpoint): it takes no more appends until it
        repairs itself from the journal, but what the journal holds is durable, and its
        waiters are answered by the cycles that carry their records."""
        self._log.partition(partition).fail(cause)
        self._report(partition, cause)

    async def run_exclusive(self, job: Callable[[], T]) -> T:
        """Run `job` in the commit thread, between cycles: a partition's reset there
        never overlaps a cycle that carries one of its batches."""
        if self._executor is None or self._executor._shutdown or self._cycle_lock is None:
            return await asyncio.to_thread(job)
        async with self._cycle_lock:
            return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def _report(self, partition: int, cause: BaseException) -> None:
        if self._reported.get(partition) is cause:
            return
        self._reported[partition] = cause
        what = self._log.partition(partition).failed_cycle
        _log.error("state partition %d: %s: %r", partition, what, cause)
        if self._on_partition_failure is not None:
            try:
                self._on_partition_failure(partition, cause)
            except Exception:
                _log.exception("on_partition_failure(%d) raised", partition)

    def _fail_waiters(self, partition: int, cause: BaseException) -> None:
        durable_end = self._log.partition(partition).durable_end_offset
        error = DurabilityError(partition, cause, durable_end)
        for _, _, waiter in self._waiters.pop(partition, []):
            if isinstance(waiter, DurabilityBarrier):
                waiter.settle(partition, error)
            elif not waiter.done():
                waiter.set_exception(error)
