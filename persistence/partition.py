"""One state partition's log: DATA/partitions/<p>/, its segments, appends, recovery.

Threads: append() and take_pending() belong to the event loop's thread (they only touch
memory), and so does try_apply() (a page-cache write, only if the lock is free).
write_batch(), apply_batch(), prune(), commit_staged(), reset_to_durable() and open() may
run in other threads; they take the partition's lock, which guards the segment list and
every file operation. The lock is held across a batch's write and fdatasync, so a reader
that snapshots the segments under it sees exactly the bytes written.

Durability: `durable_end_offset` only moves after an fdatasync returned (the partition's
own, or with a journal the journal's: `journaled`, which may run a cycle ahead of the
files), and a roll fsyncs the full segment before creating the next one, so only the
newest segment can ever end in a torn write. Recovery relies on that: damage in an
older segment, or valid frames after damage, is never a torn tail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import msgspec

from persistence.catchup import catch_up
from persistence.errors import LogCorruptionError, LogError, PartitionFailedError
from persistence.fileops import FileOps, keep_cut_bytes, unlink_if_exists
from persistence.frame import PREFIX, LogRecord, encode_frame_into
from persistence.journal import JournalEntry, PartitionCheckpoint
from persistence.scratch import ScratchFileOps, on_scratch
from persistence.segments import (
    FrameStream,
    SegmentInfo,
    SegmentScan,
    SegmentState,
    iter_stream,
    list_log_files,
    list_segments,
    read_partition,
    scan_partition,
    segment_path,
)
from persistence.swap import (
    CommitOutcome,
    SwapIncompleteError,
    load_staged,
    pending_staged,
    recover_staging,
    swap_in,
)
from protocol.loading import RawRecord

_log = logging.getLogger("sharecoord.log")

DEFAULT_SEGMENT_BYTES = 100 * 1024 * 1024  # share.coordinator.state.topic.segment.bytes

# A partition's frames in the journal from its last checkpoint on (for a repair).
JournalSource = Callable[[int], Iterable[JournalEntry]]


@dataclass(frozen=True)
class TornTail:
    """The end of the newest segment that recovery cut (or, read-only, would cut)."""

    path: str
    position: int  # the segment now ends here
    removed_bytes: int
    reason: str
    broken_path: str | None  # where the cut bytes were kept; None when nothing was cut


@dataclass(frozen=True)
class RecoveryReport:
    partition: int
    segment_count: int
    record_count: int
    log_start_offset: int
    log_end_offset: int
    torn_tail: TornTail | None
    staging_actions: tuple[str, ...]


class PendingBatch(msgspec.Struct, frozen=True, gc=False):
    """Appends taken for one commit: the frames of offsets [first_offset, end_offset),
    back to back in ``data`` as they go to the file; ``ends[i]`` is where the frame of
    offset ``first_offset + i`` ends in it. A Struct: every commit cycle makes one per
    dirty partition (33 against 382 ns a frozen dataclass took); it holds no
    reference back to anything that could make a cycle, so the collector skips it."""

    generation: int
    data: bytearray
    ends: list[int]
    first_offset: int

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.ends)


class PartitionLog:
    # open() reads a load in runs of plain tuples itself (persistence.store.open_in_runs).
    opens_in_runs = True
    failed_cycle = "write or fsync failed"
    reload_source = "disk after a disk failure"

    def __init__(
        self,
        partition: int,
        partition_dir: str,
        *,
        fs: FileOps,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        writable: bool = True,
        journal: JournalSource | None = None,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self.partition = partition
        self.partition_dir = partition_dir
        self.segment_bytes = segment_bytes
        self.writable = writable
        self._fs = fs
        self._lock = threading.Lock()
        self._segments: list[SegmentState] = []
        self._segments_view: tuple[SegmentInfo, ...] = ()
        self._active_fd: int | None = None
        self._opened = False
        self._failure: BaseException | None = None
        self._generation = 0
        # Loop-thread state: appends not yet taken by a commit, offsets
        # [log_end_offset - len(_pending_ends), log_end_offset), framed in _pending.
        self._pending = bytearray()
        self._pending_ends: list[int] = []
        self._log_end_offset = 0
        # Written by the committing thread once an fdatasync returned.
        self._durable_end_offset = 0
        self._durable_base = 0  # the segment the last successful fdatasync covered ...
        self._durable_size = 0  # ... and its size then
        self._durable_known = False  # set by the first successful writable open
        # With a journal, appends are durable once it is; the files are written after it
        # without fsync. `_synced` is how far they are on disk all the same: what a
        # checkpoint or a roll fsynced, as (segment, size, the next offset there).
        self._journal = journal
        self._synced = (0, 0, 0)
        self._refusal: BaseException | None = None
        # Decisions a disk error kept from being made when the log opened, run (in
        # order) before the partition first opens: see check_before_open.
        self._checks: list[Callable[[FileOps], None]] = []

    def __repr__(self) -> str:
        return f"PartitionLog({self.partition}, {self.partition_dir!r})"

    # -- state ---------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The base offset of the oldest segment: no record of the log lies below it."""
        view = self._segments_view
        return view[0].base_offset if view else 0

    @property
    def log_end_offset(self) -> int:
        """The next offset append() assigns."""
        return self._log_end_offset

    @property
    def durable_end_offset(self) -> int:
        """Every record below this offset is written and fsynced."""
        return self._durable_end_offset

    @property
    def segments(self) -> list[SegmentInfo]:
        return list(self._segments_view)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments_view)

    @property
    def has_pending(self) -> bool:
        """Whether appends wait for a commit."""
        return bool(self._pending_ends)

    @property
    def is_open(self) -> bool:
        return self._opened

    @property
    def failure(self) -> BaseException | None:
        """Why the partition stopped taking appends, or None."""
        return self._failure

    def _publish(self) -> None:
        self._segments_view = tuple(s.info() for s in self._segments)

    def _publish_written(self) -> None:
        """``_publish`` after a write that went through: it grew the active segment and
        maybe rolled to new ones, so every segment before the view's last is sealed and
        as the view has it, and only the rest is made again: a write costs the same
        however many segments the partition has. (Measured, the event loop's write of
        one record, ``try_apply``: 4.7 µs at 208 segments and 3.9 at 8, against 60.1
        and 6.0 when every segment's info was made again.)"""
        view, segments = self._segments_view, self._segments
        kept = len(view) - 1
        if (
            kept < 0
            or len(segments) <= kept
            or segments[kept].base_offset != view[kept].base_offset
        ):
            self._publish()
        elif len(segments) == kept + 1:  # no roll, what nearly every write is
            self._segments_view = (*view[:kept], segments[kept].info())
        else:
            self._segments_view = view[:kept] + tuple(s.info() for s in segments[kept:])

    # -- recovery ------------------------------------------------------------------------

    def open(
        self,
        on_record: Callable[[LogRecord], None] | None = None,
        *,
        on_records: Callable[[list[RawRecord]], None] | None = None,
    ) -> RecoveryReport:
        """Recover and verify the partition; see _recover. `on_record` sees every record
        kept, in order, so a loader need not read the log a second time; `on_records`
        sees them too, in runs of plain tuples (protocol.loading's way)."""
        with self._lock:
            if self._opened:
                raise LogError(f"{self!r} is already open")
            self._run_checks()
            return self._recover(on_record, on_records)

    def refuse_open(self, cause: BaseException) -> None:
        """Opening must fail with `cause` (damage that kept it from catching up with the
        journal, or a refusal to serve it here)."""
        self._refusal = cause

    def check_before_open(self, check: Callable[[FileOps], None]) -> None:
        """Opening runs `check` (given the log's FileOps) first, and fails with what it
        raises: a step a disk error kept from being done when the data directory
        opened (an ownership decision, the catch-up with the journal); the loader's
        retries run it again until it passes."""
        self._checks.append(check)

    def _run_checks(self) -> None:
        if self._refusal is not None:
            raise self._refusal
        while self._checks:
            self._checks[0](self._fs)  # raises until it passes; then never again
            del self._checks[0]

    def _recover(
        self,
        on_record: Callable[[LogRecord], None] | None,
        on_records: Callable[[list[RawRecord]], None] | None = None,
    ) -> RecoveryReport:
        """Finish half-done swaps, verify every frame of every segment, cut a torn tail of
        the newest segment (keeping the cut bytes in a .broken file), and raise
        LogCorruptionError for any other damage. Read-only: change nothing."""
        fs = self._fs
        if not fs.exists(self.partition_dir):
            raise LogCorruptionError(self.partition_dir, 0, "the partition directory is missing")
        if self.writable:
            actions = recover_staging(fs, self.partition_dir)
            files = list_log_files(fs, self.partition_dir)
        else:
            actions = []
            files = [(s.base_offset, s.path) for s in list_segments(self.partition_dir, fs)]
        segments: list[SegmentState] = []
        torn: TornTail | None = None
        record_count = 0
        last_offset = -1
        for scan in scan_partition(fs, files, on_record=on_record, on_records=on_records):
            if scan.damage is not None:
                if not scan.tail_is_torn:
                    raise LogCorruptionError(scan.path, scan.damage.position, scan.damage.reason)
                torn = self._cut_torn_tail(scan)
            segments.append(scan.state())
            record_count += scan.record_count
            if scan.last_offset is not None:
                last_offset = scan.last_offset
        next_offset = max(last_offset + 1, segments[-1].base_offset if segments else 0)
        if self.writable:
            self._open_active(segments, next_offset)
        self._segments = segments
        self._publish()
        self._drop_pending()
        self._log_end_offset = self._durable_end_offset = next_offset
        if segments:  # read-only: what may be read (a torn tail is left out)
            self._durable_base, self._durable_size = segments[-1].base_offset, segments[-1].size
            self._durable_known = self.writable
            # Opening fsyncs the newest segment (_open_active): all of it is on disk.
            self._synced = (segments[-1].base_offset, segments[-1].size, next_offset)
        self._failure = None
        self._opened = True
        return RecoveryReport(
            self.partition,
            len(segments),
            record_count,
            self.log_start_offset,
            next_offset,
            torn,
            tuple(actions),
        )

    def _cut_torn_tail(self, scan: SegmentScan) -> TornTail:
        assert scan.damage is not None
        position, removed = scan.valid_size, scan.size - scan.valid_size
        if not self.writable:
            return TornTail(scan.path, position, removed, scan.damage.reason, None)
        fs = self._fs
        fd = fs.open(scan.path, os.O_RDWR)
        try:
            broken = keep_cut_bytes(fs, scan.path, position, fs.pread(fd, removed, position))
            fs.truncate(fd, position)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        _log.warning(
            "%s: torn tail cut at byte %d (%d bytes: %s); the cut bytes are kept in %s",
            scan.path,
            position,
            removed,
            scan.damage.reason,
            broken,
        )
        return TornTail(scan.path, position, removed, scan.damage.reason, broken)

    def _open_active(self, segments: list[SegmentState], next_offset: int) -> None:
        """Open the newest segment for appending (creating the first one), and make what
        a previous process wrote there durable before anyone is told it is."""
        fs = self._fs
        if not segments:
            segments.append(
                SegmentState(next_offset, segment_path(self.partition_dir, next_offset), 0)
            )
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
        else:
            flags = os.O_WRONLY | os.O_APPEND
        fd = fs.open(segments[-1].path, flags)
        try:
            fs.fsync(fd)
            fs.fsync_dir(self.partition_dir)
        except BaseException:
            fs.close(fd)
            raise
        self._active_fd = fd

    # -- appending -----------------------------------------------------------------------

    def append(self, record_type: int, key: bytes, value: bytes | None, timestamp: int) -> int:
        """Buffer one record and return its offset. No I/O: a commit writes it."""
        if self._failure is not None:
            raise PartitionFailedError(self.partition, self._failure)
        if not self._opened or not self.writable:
            raise LogError(f"{self!r} is not open for appends")
        offset = self._log_end_offset
        pending = self._pending
        encode_frame_into(pending, offset, timestamp, record_type, key, value)
        self._pending_ends.append(len(pending))
        self._log_end_offset = offset + 1
        return offset

    def take_pending(self) -> PendingBatch | None:
        """Hand the buffered appends to a commit (event loop thread)."""
        if self._failure is not None:
            raise PartitionFailedError(self.partition, self._failure)
        ends = self._pending_ends
        if not ends:
            return None
        data = self._pending
        self._drop_pending()
        return PendingBatch(self._generation, data, ends, self._log_end_offset - len(ends))

    def _drop_pending(self) -> None:
        self._pending = bytearray()
        self._pending_ends = []

    def write_batch(self, batch: PendingBatch) -> None:
        """Write a batch, rolling segments at segment_bytes, and fdatasync it (any
        thread): for a partition without a journal. On failure the partition stops:
        appends raise until reset_to_durable, and what the batch wrote past the durable
        end is cut from the files before the error reaches anyone (see
        _discard_unsynced)."""
        self._write(batch, sync=True)

    def journaled(self, batch: PendingBatch) -> None:
        """The batch's journal record is durable, and so is the batch, whatever its
        files say yet (the event loop, or the commit thread: whoever flushed it)."""
        self._durable_end_offset = batch.end_offset

    def apply_batch(self, batch: PendingBatch) -> None:
        """Write a batch whose journal record is durable (``journaled``), without fsync
        (the commit thread; with the kernel's flush, after the batch was answered). A
        roll still fsyncs the segment it seals. On failure the partition stops until
        reset_to_durable repairs its files from the journal."""
        self._write(batch, sync=False)

    def try_apply(self, batch: PendingBatch) -> bool:
        """apply_batch, if it needs no wait and no sync: the lock is free, the batch fits
        the active segment (a roll syncs and creates files), the partition runs. For the
        event loop, whose writes reach the page cache only. False: nothing was done, and
        apply_batch (the commit thread) must."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if (
                self._active_fd is None
                or self._failure is not None
                or batch.generation != self._generation
                or self._segments[-1].size + len(batch.data) > self.segment_bytes
            ):
                return False  # apply_batch does it, or raises what is wrong
            self._write_locked(batch, sync=False, on_loop=True)
            return True
        finally:
            self._lock.release()

    def _write(self, batch: PendingBatch, *, sync: bool) -> None:
        with self._lock:
            if batch.generation != self._generation:
                raise LogError(f"{self!r}: batch taken before a reset; its appends are gone")
            if self._failure is not None:
                raise PartitionFailedError(self.partition, self._failure)
            self._write_locked(batch, sync=sync)

    def _write_locked(self, batch: PendingBatch, *, sync: bool, on_loop: bool = False) -> None:
        try:
            self._write_frames(batch, sync, on_loop)
        except BaseException as exc:
            self._failure = exc
            try:
                if sync:
                    self._discard_unsynced()
            finally:
                self._publish()
            raise
        self._publish_written()

    def fail(self, cause: BaseException) -> None:
        """Stop taking appends (the journal record of its pending batch failed):
        reset_to_durable restarts the partition."""
        with self._lock:
            if self._failure is None:
                self._failure = cause

    def commit(self) -> int:
        """Write and fsync everything appended so far, in this thread; returns
        durable_end_offset. For tools and tests that run no GroupCommitter."""
        batch = self.take_pending()
        if batch is not None:
            self.write_batch(batch)
        return self._durable_end_offset

    def _write_frames(self, batch: PendingBatch, sync: bool, on_loop: bool) -> None:
        """Write the batch in as few pieces as the segment size allows: the frames that
        still fit the active segment, then a roll, and so on (a frame larger than a
        whole segment gets a segment of its own). ``on_loop``: by the event loop
        (``try_apply``), which never rolls."""
        data, ends = batch.data, batch.ends
        view = memoryview(data)
        try:
            done = 0  # frames written
            start = 0  # where the next frame starts in data
            while done < len(ends):
                filled = self._segments[-1].size
                fit = bisect_right(ends, start + self.segment_bytes - filled, lo=done)
                if fit == done:
                    if filled > 0:
                        self._roll(batch.first_offset + done)
                        continue
                    fit = done + 1
                last = fit - 1
                last_start = ends[last - 1] if last > 0 else 0
                self._flush(
                    view[start : ends[last]],
                    view[last_start:],
                    batch.first_offset + last,
                    sync,
                    on_loop,
                )
                done, start = fit, ends[last]
        finally:
            view.release()

    def _flush(
        self, data: memoryview, last_frame: memoryview, last_offset: int, sync: bool, on_loop: bool
    ) -> None:
        assert self._active_fd is not None
        active = self._segments[-1]
        if on_loop:
            self._fs.write_on_loop(self._active_fd, data)
        else:
            self._fs.write_all(self._active_fd, data)
        active.size += len(data)
        active.last_offset = last_offset
        active.last_frame_crc = PREFIX.unpack_from(last_frame)[1]
        if sync:
            self._fs.fdatasync(self._active_fd)
            self._synced = (active.base_offset, active.size, last_offset + 1)
            self._durable_end_offset = last_offset + 1
        # Without a sync the journal made it durable (journaled), maybe a cycle ahead.
        self._durable_base, self._durable_size = active.base_offset, active.size

    def _roll(self, base_offset: int) -> None:
        """Start a new segment. The full one is fsynced first (by the flush before it
        when every flush syncs): a sealed segment is always wholly on disk."""
        fs = self._fs
        full = self._segments[-1]
        if self._active_fd is not None and self._synced[:2] != (full.base_offset, full.size):
            fs.fdatasync(self._active_fd)
        path = segment_path(self.partition_dir, base_offset)
        fd = fs.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
        old_fd, self._active_fd = self._active_fd, fd
        self._segments.append(SegmentState(base_offset, path, 0))
        if old_fd is not None:
            fs.close(old_fd)
        fs.fsync_dir(self.partition_dir)
        self._synced = (base_offset, 0, base_offset)

    def sync_for_checkpoint(self) -> tuple[int, int, int]:
        """fdatasync what was written to the newest segment (a checkpoint, in its own
        thread) and return how far it is now on disk: (segment, size, next offset).
        The file is synced through a second descriptor, so commits go on meanwhile."""
        with self._lock:
            self._check_mutable()
            generation = self._generation
            active = self._segments[-1]
            position = (
                active.base_offset,
                active.size,
                active.base_offset if active.last_offset is None else active.last_offset + 1,
            )
            assert self._active_fd is not None
            fd = self._fs.dup(self._active_fd)
        try:
            self._fs.fdatasync(fd)
        finally:
            self._fs.close(fd)
        with self._lock:
            if self._generation != generation or self._failure is not None:
                # It failed, or a reset cut its files back, while the sync ran: what the
                # sync covered may be gone, and a checkpoint that counted it would let the
                # journal's copy go (and the next reset would cut "back" to a size the
                # file no longer has, extending it with zeros).
                raise PartitionFailedError(
                    self.partition, self._failure or LogError("reset during a checkpoint")
                )
            if position[:2] > self._synced[:2]:
                self._synced = position
            return self._synced

    @property
    def generation(self) -> int:
        """Bumped by every reset: a batch taken before one belongs to a log that is gone."""
        return self._generation

    @property
    def synced(self) -> tuple[int, int, int]:
        """(segment, size, next offset): how far the files are surely on disk."""
        return self._synced

    # -- the fsync-failure path ----------------------------------------------------------

    def reset_to_durable(self) -> RecoveryReport:
        """After a failed write or fsync: drop buffered appends, cut the log back to the
        last byte a successful fsync covered (deleting any segment created after it),
        and reopen it (a full recovery). Safe to call again if it fails part way."""
        with self._lock:
            if not self.writable:
                raise LogError(f"{self!r} is read-only")
            fs = self._fs
            self._generation += 1
            self._drop_pending()
            self._opened = False
            cause = self._failure
            if self._failure is None:
                self._failure = LogError("reset in progress")
            if self._active_fd is not None:
                fd, self._active_fd = self._active_fd, None
                with contextlib.suppress(OSError):  # the fd is released whatever close says
                    fs.close(fd)
            if self._durable_known and self._journal is not None:
                # Back to what is surely on disk, then forward again from the journal,
                # which holds every durable frame past it.
                self._cut_back_to(self._synced[0], self._synced[1])
                catch_up(
                    fs,
                    self.partition_dir,
                    PartitionCheckpoint(0, *self._synced),
                    self._journal(self.partition),
                )
            elif self._durable_known:
                self._cut_back_to(self._durable_base, self._durable_size)
            else:
                # Never opened (its first load failed): what open() does first, it does
                # too (a refusal, an ownership decision, the catch-up with the journal).
                self._run_checks()
            report = self._recover(None)
            _log.warning(
                "%s: reset to the durable end, offset %d, after %s",
                self.partition_dir,
                report.log_end_offset,
                "its load failed" if cause is None else repr(cause),
            )
            return report

    def read_recovered(self, on_record: Callable[[LogRecord], None]) -> RecoveryReport:
        """Hand `on_record` the records the next open() (or, once the log was open,
        the next reset_to_durable()) will leave, without writing anything: the same
        recovery, run on a scratch view of the files (persistence/scratch.py). What a
        daemon whose disk is full serves reads from while that recovery waits for room.
        Raises what the recovery would raise but the disk's refusals to write."""
        shadow = PartitionLog(
            self.partition,
            self.partition_dir,
            fs=ScratchFileOps(self._fs),
            segment_bytes=self.segment_bytes,
            journal=self._journal,
        )
        with self._lock:
            shadow._segments = [dataclasses.replace(s) for s in self._segments]
            shadow._synced = self._synced
            shadow._durable_known = self._durable_known
            shadow._durable_base, shadow._durable_size = self._durable_base, self._durable_size
            shadow._refusal, shadow._checks = self._refusal, list(self._checks)
        with on_scratch():
            try:
                if not shadow._durable_known:
                    return shadow.open(on_record)
                report = shadow.reset_to_durable()
                for record in shadow.read(0):
                    on_record(record)
                return report
            finally:
                shadow.close()

    def _discard_unsynced(self) -> None:
        """After a failed write or fsync, before its waiters hear of it: remove what the
        batch wrote past the durable end. Its frames may be whole in the page cache (an
        fsync failed after the write, or a short write landed whole frames), and a
        process that died before the reset would otherwise replay records that were
        answered as failed. No fsync here (the disk just failed one; reset_to_durable
        cuts again, with fsyncs): a process crash keeps the page cache, so the cut holds.
        If the cut itself fails, the reset retries it; until then a crash may replay
        the failed batch, which is logged."""
        if not self._durable_known:
            return
        try:
            self._cut_back_to(self._durable_base, self._durable_size, sync=False)
        except (OSError, LogCorruptionError) as exc:
            _log.error(
                "%s: could not cut the failed batch back to the durable end (%r); "
                "until the reset does, a crash would replay it",
                self.partition_dir,
                exc,
            )

    def _cut_back_to(self, base: int, size: int, *, sync: bool = True) -> None:
        """Delete the segments after `base` and cut that one to `size` bytes, which a
        sync or a write covered, so the file holds at least that many. One that holds
        fewer lost bytes that were there: LogCorruptionError, and nothing is changed
        (ftruncate would grow it with zeros where records were)."""
        fs = self._fs
        path = segment_path(self.partition_dir, base)
        fd = fs.open(path, os.O_WRONLY)
        try:
            held = fs.size(fd)
            if held < size:
                raise LogCorruptionError(
                    path, held, f"the file ends before byte {size}, which it held before"
                )
            for segment in self._segments:
                if segment.base_offset > base:
                    unlink_if_exists(fs, segment.path)
            if sync:
                fs.fsync_dir(self.partition_dir)
            fs.truncate(fd, size)
            if sync:
                fs.fsync(fd)
        finally:
            fs.close(fd)

    # -- reading -------------------------------------------------------------------------

    def read(self, from_offset: int = 0) -> Iterator[LogRecord]:
        """The records at or above `from_offset`, verified as read. Open: exactly the
        durable records, from a snapshot of the segments taken now (later prunes and
        swaps do not disturb it). Not open: what the directory holds."""
        if not self._opened:
            yield from read_partition(self.partition_dir, from_offset, self._fs)
            return
        fs = self._fs
        opened: list[tuple[int, SegmentState, int, int | None]] = []
        try:
            with self._lock:
                segments = self._segments
                for index, segment in enumerate(segments):
                    below = segments[index + 1].base_offset if index + 1 < len(segments) else None
                    if below is not None and below <= from_offset:
                        continue
                    if segment.base_offset > self._durable_base:
                        break
                    limit = self._durable_size if index == len(segments) - 1 else segment.size
                    fd = fs.open(segment.path, os.O_RDONLY)
                    opened.append((fd, segment, limit, below))
            for fd, segment, limit, below in opened:
                stream = FrameStream(
                    fs, fd, min_offset=segment.base_offset, below_offset=below, limit=limit
                )
                yield from iter_stream(stream, segment.path, from_offset, False)
        finally:
            for fd, *_ in opened:
                fs.close(fd)

    def replay(self, on_record: Callable[[LogRecord], None]) -> None:
        """Hand `on_record` every durable record, in order (a reload after
        reset_to_durable: the local log has no cheaper way to a key's last snapshot)."""
        for record in self.read(0):
            on_record(record)

    # -- pruning and compaction ----------------------------------------------------------

    def pending_compactions(self) -> list[int]:
        """The base offsets of the compaction outputs fully staged for commit_staged."""
        return pending_staged(self.partition_dir)

    def prune(
        self, below_offset: int, may_delete: Callable[[SegmentState], bool] | None = None
    ) -> list[str]:
        """Delete the sealed segments whose every offset is below `below_offset` (the
        next segment starts at or below it), oldest first, never the newest. Returns the
        deleted paths. `may_delete` (the history's "is it exported yet?") can hold
        pruning back: it stops at the first segment it refuses, so the log stays whole
        from its start."""
        with self._lock:
            self._check_mutable()
            deleted = []
            while len(self._segments) > 1 and self._segments[1].base_offset <= below_offset:
                segment = self._segments[0]
                if may_delete is not None and not may_delete(segment):
                    break
                self._fs.unlink(segment.path)
                deleted.append(segment.path)
                del self._segments[0]
                self._publish()
            if deleted:
                self._fs.fsync_dir(self.partition_dir)
                _log.info(
                    "%s: pruned %d segments below offset %d; log start offset now %d",
                    self.partition_dir,
                    len(deleted),
                    below_offset,
                    self._segments[0].base_offset,
                )
            return deleted

    def commit_staged(self, base: int) -> CommitOutcome:
        """Swap the compaction output staged at `base` in (see swap.py). The cleaned file
        is read and fsynced outside the lock; only the checks and renames hold it."""
        with self._lock:
            self._check_mutable()
            snapshot = list(self._segments)
        staged = load_staged(self._fs, self.partition_dir, base, snapshot)
        if staged is None:
            return "stale"
        with self._lock:
            self._check_mutable()
            try:
                return swap_in(self._fs, self.partition_dir, staged, self._segments)
            except SwapIncompleteError as exc:
                self._failure = exc  # memory no longer matches the disk: reopen to finish
                raise
            finally:
                self._publish()

    def _check_mutable(self) -> None:
        # A failure first: a partition being reset is not open either, and a job that
        # meets it is told it failed (which it expects), not that it was never opened.
        if self._failure is not None:
            raise PartitionFailedError(self.partition, self._failure)
        if not self._opened or not self.writable:
            raise LogError(f"{self!r} is not open for writing")

    def close(self) -> None:
        """Release the active segment. Buffered appends not committed are dropped."""
        with self._lock:
            self._opened = False
            self._drop_pending()
            if self._active_fd is not None:
                fd, self._active_fd = self._active_fd, None
                self._fs.close(fd)
