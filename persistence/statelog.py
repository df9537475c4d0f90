"""The data directory: DATA/meta, DATA/LOCK, the journal and one PartitionLog per state
partition.

DATA/meta                       {"format": 2, "num_partitions": 50}, fixed at creation
DATA/LOCK                       flock()ed by the one process that may write DATA
DATA/journal/                   the shared journal and its CHECKPOINT (journal.py)
DATA/partitions/<p>/            one state partition's segments (partition.py)
DATA/partitions/<p>/compaction/ staging of the compaction job (swap.py)

Format 1 had no journal: every commit fsynced each partition file. A format-1 directory
is fully on disk, so opening it for writing migrates it in place: the journal directory
and a CHECKPOINT saying every partition is synced to its end, then meta says 2. A crash
before meta is rewritten migrates it again.

Opening for writing recovers the journal before any partition loads: read CHECKPOINT,
read every record after it, bring each partition's files up to date with its frames
(catchup.py), start a fresh journal after the old one, and record a new CHECKPOINT. A
partition that cannot catch up (damage) keeps its old checkpoint, so the journal keeps
its frames, and fails to load with the reason; one whose disk refused the catch-up
keeps them too, and catches up when it opens (its loader retries until the disk works).

A full disk (ENOSPC, EDQUOT) does not stop an opener that says it can wait for room
(`full_disk_ok`, the daemon): the writes that end the open (DATA/ASSIGNMENT when it
changed, the .broken copy of a torn journal tail, the new CHECKPOINT) are then left to
`finish_opening`, which the group commit retries until they are done, and before which
no journal record is written. Nothing else in an open needs new space: the journal's
segments are made when the first commit needs them (commit.py), a partition's files
are repaired when it opens (partition.py reads them without writing meanwhile).

A daemon opens with its Assignment (ownership.py): only the partitions this node owns
are created, caught up and opened, and only those its data directory says it may serve.
Any other partition keeps its CHECKPOINT entry: if the journal still holds frames of it
(a crash before the cluster file changed), they are written to its directory when that
directory is this node's own, so the journal can move on; otherwise the entry stays
exactly as it is, and so do the frames (`held`), until the partition is exported or
owned here again.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from persistence.catchup import catch_up
from persistence.errors import (
    LogCorruptionError,
    LogError,
    LogLockedError,
    MetaMismatchError,
    PartitionFailedError,
)
from persistence.fileops import FileOps, is_disk_full, pace, read_file, write_file_atomically
from persistence.journal import (
    DEFAULT_JOURNAL_SEGMENT_BYTES,
    Checkpoint,
    EntryFrames,
    Journal,
    JournalEntry,
    PartitionCheckpoint,
    entries_of,
    journal_dir,
    keep_torn_tail,
    read_checkpoint,
    scan_journal,
    write_checkpoint,
)
from persistence.ownership import (
    Assignment,
    PartitionOwnershipError,
    create_fresh,
    foreign_owner,
    read_assignment,
    settle,
    write_assignment,
)
from persistence.partition import DEFAULT_SEGMENT_BYTES, PartitionLog, PendingBatch
from persistence.segments import list_log_files, scan_segment
from persistence.store import CycleResult, StateStore

_log = logging.getLogger("sharecoord.log")

META_FORMAT = 2
META_FORMATS = (1, 2)  # what this version reads; 1 is migrated on the first writable open
META_FILE = "meta"
LOCK_FILE = "LOCK"
PARTITIONS_DIR = "partitions"

# A checkpoint's pace (fileops.pace): after each partition's fdatasync its thread waits
# this many times as long as the sync took (at most fileops.PACE_MAX_S), so that the disk
# serves the journal's flushes between them. Each such sync also commits the file's new
# size (the file system's journal) and competes with the commit cycles' fdatasync; fifty
# back to back held the cycles up for 20-180 ms on the README's machine, and the writes
# behind them queued for that long. Paced, single writes over the Kafka listener at 13,000/s
# with a checkpoint every second: p99 2.95-4.21 against 4.49-5.34 ms (5 pairs). The
# close's last checkpoint is not paced.
CHECKPOINT_SPREAD = 2.0


def partition_dir(data_dir: str | os.PathLike[str], partition: int) -> str:
    return os.path.join(os.fspath(data_dir), PARTITIONS_DIR, str(partition))


def read_meta(data_dir: str | os.PathLike[str], fs: FileOps | None = None) -> dict[str, Any]:
    """DATA/meta, checked: raises MetaMismatchError if it is not a meta file we wrote."""
    path = os.path.join(os.fspath(data_dir), META_FILE)
    try:
        meta: Any = json.loads(read_file(fs or FileOps(), path))
    except FileNotFoundError:
        raise MetaMismatchError(
            f"{data_dir} is not a sharecoord data directory: {path} is missing"
        ) from None
    except ValueError as exc:
        raise MetaMismatchError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") not in META_FORMATS:
        raise MetaMismatchError(
            f"{path}: unknown format {meta!r}; this version reads formats "
            f"{', '.join(map(str, META_FORMATS))}"
        )
    if not isinstance(meta.get("num_partitions"), int) or meta["num_partitions"] < 1:
        raise MetaMismatchError(f"{path}: num_partitions must be an int >= 1, got {meta!r}")
    return meta


class StateLog:
    """The log of every state partition in one data directory."""

    def __init__(
        self,
        data_dir: str,
        num_partitions: int,
        partitions: list[PartitionLog],
        fs: FileOps,
        lock_fd: int | None,
    ) -> None:
        self.data_dir = data_dir
        self.num_partitions = num_partitions
        self.fs = fs
        self._partitions = partitions
        self._lock_fd = lock_fd
        self.journal: Journal | None = None
        self.checkpoint = Checkpoint()
        # Partitions with frames in the journal that no checkpoint has synced yet.
        self.pinned: set[int] = set()
        # Partitions not opened here whose frames are still only in the journal: their
        # CHECKPOINT entries stand as they are (module docstring).
        self.held: set[int] = set()
        # The writes that end a writable open, while a full disk holds them back.
        self._opening: _OpeningWrites | None = None

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        num_partitions: int | None,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        journal_segment_bytes: int = DEFAULT_JOURNAL_SEGMENT_BYTES,
        fs: FileOps | None = None,
        lock: bool = True,
        assignment: Assignment | None = None,
        only: Collection[int] | None = None,
        full_disk_ok: bool = False,
    ) -> StateLog:
        """Open (creating if need be) a data directory for `num_partitions` partitions.

        With lock=True, takes DATA/LOCK (LogLockedError if another holder has it), may
        write, and recovers the journal (module docstring). With lock=False (read-only
        tools), writes nothing, and num_partitions may be None to take it from
        DATA/meta. Partitions are not opened here: call partition(p).open() for each, so
        one damaged partition does not stop the rest.

        Which partitions are created, caught up and may be opened: with `assignment`
        (the daemon), those the node owns and may serve (ownership.settle; the others
        refuse to open, with the reason); with `only` (the partition tools), exactly
        those, none created; with neither, every partition, as before ownership.

        With `full_disk_ok`, a full disk leaves the writes that end the open to
        `finish_opening` (module docstring) instead of failing it."""
        data_dir = os.fspath(data_dir)
        fs = fs or FileOps()
        if num_partitions is not None and num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        if assignment is not None and num_partitions != len(assignment.owners):
            raise ValueError("the assignment must name an owner for every partition")
        lock_fd = None
        if lock:
            if not fs.exists(data_dir):
                fs.mkdir(data_dir)
                fs.fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
            lock_fd = _take_lock(fs, data_dir)
        try:
            num_partitions, meta_format = _check_meta(
                fs,
                data_dir,
                num_partitions,
                create=lock,
                make_partitions=_partition_maker(assignment, only),
            )
            log = cls(data_dir, num_partitions, [], fs, lock_fd)
            log._partitions = [
                PartitionLog(
                    p,
                    partition_dir(data_dir, p),
                    fs=fs,
                    segment_bytes=segment_bytes,
                    writable=lock,
                    journal=log._journal_entries if lock else None,
                )
                for p in range(num_partitions)
            ]
            if lock:
                if meta_format == 1:
                    _migrate(fs, data_dir, num_partitions)
                opened = log._choose(assignment, only)
                node = (
                    assignment.node_id if assignment is not None else _recorded_node(fs, data_dir)
                )
                log._recover_journal(journal_segment_bytes, opened, node)
                log._end_opening(full_disk_ok)
        except BaseException:
            if lock_fd is not None:
                fs.close(lock_fd)
            raise
        return log

    def _choose(self, assignment: Assignment | None, only: Collection[int] | None) -> set[int]:
        """The partitions this opener may open; every other one refuses, saying why."""
        everything = set(range(self.num_partitions))
        if assignment is None and only is None:
            return everything
        if assignment is not None:
            # CHECKPOINT names every partition a writer ever opened, used or not: those
            # it saw records in are the ones that had state here.
            checkpoint = read_checkpoint(self.fs, self.journal_dir)
            had_records = {p for p, c in checkpoint.partitions.items() if c.next_offset > 0}
            settled = settle(self.fs, self.data_dir, assignment, had_records)
            self._opening = _OpeningWrites(assignment=settled.record)
            opened = set(assignment.owned()) - settled.refused.keys()
            for p, reason in settled.refused.items():
                self._partitions[p].refuse_open(PartitionOwnershipError(p, reason))
            for p, check in settled.undecided.items():
                self._partitions[p].check_before_open(check)
            elsewhere = everything - assignment.owned()
            for p in elsewhere:
                owner = assignment.owners[p]
                reason = f"is not owned by this node (node {owner} owns it)"
                self._partitions[p].refuse_open(PartitionOwnershipError(p, reason))
            return opened
        assert only is not None
        opened = set(only)
        for p in everything - opened:
            self._partitions[p].refuse_open(
                PartitionOwnershipError(p, "was not opened: this opener named other partitions")
            )
        return opened

    def partition(self, partition: int) -> PartitionLog:
        if not 0 <= partition < self.num_partitions:
            raise IndexError(f"state partition {partition} not in [0, {self.num_partitions})")
        return self._partitions[partition]

    @property
    def partitions(self) -> list[PartitionLog]:
        return list(self._partitions)

    # -- the journal -------------------------------------------------------------------

    @property
    def journal_dir(self) -> str:
        return journal_dir(self.data_dir)

    def _recover_journal(self, segment_bytes: int, opened: set[int], node: int | None) -> None:
        fs, directory = self.fs, self.journal_dir
        old = read_checkpoint(fs, directory)
        scan = scan_journal(fs, directory, old.lowest_lsn())
        caught_up: dict[int, tuple[int, int, int]] = {}
        for p, log in enumerate(self._partitions):
            synced = old.partitions.get(p, PartitionCheckpoint(0, 0, 0, 0))
            pending = list(entries_of(scan.records, p, synced.lsn))
            if p not in opened:
                if pending:
                    self._finish_or_hold(p, synced, pending, node, caught_up)
                continue
            try:
                owner = foreign_owner(fs, log.partition_dir, node) if pending else None
                if owner is not None:
                    # This journal's frames were written for this node's directory, never
                    # for one another node made: they stay in the journal.
                    self._hold(p, f"its directory is node {owner}'s")
                    continue
                caught_up[p] = catch_up(fs, log.partition_dir, synced, pending).position
            except LogCorruptionError as exc:
                log.refuse_open(exc)
                self.pinned.add(p)
            except OSError as exc:
                # The disk, not the log: the frames stay in the journal (the old entry
                # stands), and the partition catches up when it opens.
                _log.warning(
                    "state partition %d: not caught up with the journal (%s); it catches up "
                    "when it loads",
                    p,
                    exc,
                )
                log.check_before_open(functools.partial(_catch_up, synced, pending, log))
                self.pinned.add(p)
        # After every segment there is, and every LSN the old checkpoint names: a
        # record must never sort below a checkpoint that already counts past it.
        at_least = max([scan.end_lsn, *(c.lsn for c in old.partitions.values())])
        self.journal = Journal.start(fs, directory, segment_bytes, at_least=at_least)
        start = self.journal.end_lsn
        partitions = dict(old.partitions)
        for p, position in caught_up.items():
            partitions[p] = PartitionCheckpoint(start, *position)
        self.checkpoint = Checkpoint(partitions)
        opening = self._opening = self._opening or _OpeningWrites()
        if scan.torn_at is not None:
            opening.torn_tail = scan.torn_at[:2]

    def _end_opening(self, full_disk_ok: bool) -> None:
        try:
            self.finish_opening()
        except OSError as exc:
            if not (full_disk_ok and is_disk_full(exc)):
                raise
            _log.warning(
                "%s: the disk is full (%s): reads are served from what is on disk; no "
                "journal record is written until the open is finished (it is retried as "
                "space returns)",
                self.data_dir,
                exc,
            )

    @property
    def opening_unfinished(self) -> bool:
        """Whether the writes that end the open are still to do (no journal record may
        be written before they are)."""
        return self._opening is not None

    def finish_opening(self) -> None:
        """The writes that end a writable open, in this order, each done once: ASSIGNMENT
        (when it changed), the .broken copy of a torn journal tail, the new CHECKPOINT,
        then the deletion of the journal segments it frees. Until CHECKPOINT is written
        no journal record may be (a record after the old CHECKPOINT's torn tail would
        make the tail damage in the middle). Raises what the disk raises; call it again
        until it does not (the group commit does, in its checkpoint thread)."""
        opening = self._opening
        if opening is None:
            return
        fs = self.fs
        if opening.assignment is not None:
            write_assignment(fs, self.data_dir, opening.assignment)
            opening.assignment = None
        if opening.torn_tail is not None:
            keep_torn_tail(fs, *opening.torn_tail)
            opening.torn_tail = None
        write_checkpoint(fs, self.journal_dir, self.checkpoint)
        self._opening = None
        assert self.journal is not None
        self.journal.delete_below(self.checkpoint.lowest_lsn())

    def _finish_or_hold(
        self,
        p: int,
        synced: PartitionCheckpoint,
        pending: list[JournalEntry],
        node: int | None,
        caught_up: dict[int, tuple[int, int, int]],
    ) -> None:
        """A partition this opener does not open, with frames only in the journal: they
        are written to its directory when that is this node's (nothing is loaded or
        served), else kept where they are."""
        directory = self._partitions[p].partition_dir
        if not self.fs.exists(directory):
            self._hold(p, "its directory is not here")
            return
        try:
            owner = foreign_owner(self.fs, directory, node)
            if owner is not None:
                self._hold(p, f"its directory is node {owner}'s")
                return
            caught_up[p] = catch_up(self.fs, directory, synced, pending).position
        except (LogCorruptionError, OSError) as exc:
            self._hold(p, str(exc))

    def _hold(self, p: int, why: str) -> None:
        self.held.add(p)
        _log.warning(
            "state partition %d: records of it are still only in the journal, and %s; the "
            "journal keeps them (and everything after them) until it is exported or served "
            "here again (docs/operations.md#moving-a-state-partition)",
            p,
            why,
        )

    def record_replaced(self, partition: int, position: tuple[int, int, int]) -> None:
        """The files of a partition are being replaced whole (an import), and will be on
        disk up to `position`: its CHECKPOINT entry starts at the journal's end, so that
        no older frame of it in the journal is ever laid over the new files."""
        assert self.journal is not None, "only a writable open replaces partitions"
        self._set_entry(partition, PartitionCheckpoint(self.journal.end_lsn, *position))
        self.held.discard(partition)
        self.pinned.discard(partition)

    def restore_entry(self, partition: int, entry: PartitionCheckpoint | None) -> None:
        """Put a partition's CHECKPOINT entry back as it was before record_replaced (the
        entry then, None for none): an import that failed before its files were in
        place."""
        self._set_entry(partition, entry)

    def _set_entry(self, partition: int, entry: PartitionCheckpoint | None) -> None:
        """Written first, then kept: if the write fails, the next checkpoint (close's)
        does not record the entry after all."""
        partitions = dict(self.checkpoint.partitions)
        if entry is None:
            partitions.pop(partition, None)
        else:
            partitions[partition] = entry
        checkpoint = Checkpoint(partitions)
        write_checkpoint(self.fs, self.journal_dir, checkpoint)
        self.checkpoint = checkpoint

    def _journal_entries(self, partition: int) -> list[JournalEntry]:
        """The frames of one partition in the journal since its checkpoint (a partition
        repairing itself while the daemon runs; the journal may be growing)."""
        entry = self.checkpoint.partitions.get(partition)
        lsn = 0 if entry is None else entry.lsn
        records = scan_journal(self.fs, self.journal_dir, lsn, live=True).records
        journal = self.journal
        if journal is not None:
            records = [r for r in records if not journal.is_void(r.lsn)]
        return list(entries_of(records, partition, lsn))

    def take_checkpoint(
        self,
        lsn: int,
        written: set[int],
        on_failure: Callable[[int, BaseException], None] | None = None,
        spread: float = 0.0,
    ) -> dict[int, BaseException]:
        """Make every partition in `written` durable in its own files (fdatasync), then
        record CHECKPOINT at `lsn` and delete the journal below what is still needed.
        Every record below `lsn` must have been applied to the files. Runs in a thread
        of its own; returns the partitions whose sync failed (they stay pinned to the
        journal until a later checkpoint syncs them). `on_failure` hears of each such
        partition as its sync fails, not when the whole checkpoint ends: a partition
        whose files are no longer trusted must stop while the fault that failed it
        can still be the cause, not after someone saw it serve again. With `spread`,
        each partition's sync is followed by a pause `spread` times as long
        (CHECKPOINT_SPREAD)."""
        self.finish_opening()
        failures: dict[int, BaseException] = {}
        partitions = dict(self.checkpoint.partitions)
        for p, log in enumerate(self._partitions):
            if p in self.held:
                continue  # its frames are only in the journal: its entry stands as it is
            if log.failure is not None:
                continue  # stopped: its own entry stands until it has repaired itself
            if p in self.pinned and not log.is_open:
                continue  # not caught up with the journal yet (it does when it opens)
            if p in written or p in self.pinned:
                began = time.monotonic()
                try:
                    position = log.sync_for_checkpoint()
                except PartitionFailedError:
                    continue  # it stopped meanwhile (same as above)
                except BaseException as exc:
                    failures[p] = exc
                    if on_failure is not None:
                        on_failure(p, exc)
                    continue
                finally:
                    pace(began, spread)
            elif not log.is_open:
                # Not written since its checkpoint (nor ever opened here): what its files
                # had then is all there is.
                if p not in partitions:
                    continue
                position = (partitions[p].segment, partitions[p].size, partitions[p].next_offset)
            else:
                position = log.synced
            partitions[p] = PartitionCheckpoint(lsn, *position)
        checkpoint = Checkpoint(partitions)
        write_checkpoint(self.fs, self.journal_dir, checkpoint)
        self.checkpoint = checkpoint
        synced = {p for p, c in partitions.items() if c.lsn == lsn}
        self.pinned = (self.pinned | written) - synced
        if self.journal is not None:
            self.journal.delete_below(checkpoint.lowest_lsn())
        return failures

    def commit_cycle(self, batches: Sequence[tuple[int, PendingBatch]]) -> CycleResult:
        """The seam's commit cycle (persistence/store.py), in the commit thread: one
        journal record for every batch and one fdatasync, then each batch into its
        partition's files. A journal failure fails every batch (they shared the flush)
        and stops their partitions; a partition's own write failure after it is that
        partition's alone, and its batch is durable all the same. (The committer's
        kernel flush does the same in steps: cycle_entries, the journal's prepare,
        write and synced, then journaled and apply_cycle.)"""
        assert self.journal is not None, "only a writable open commits"
        errors, entries = self.cycle_entries(batches)
        started = time.perf_counter()
        try:
            if entries:
                self.journal.append(entries)
        except BaseException as exc:  # every batch of the cycle shared this flush
            return self.fail_cycle(batches, exc, time.perf_counter() - started)
        seconds = time.perf_counter() - started
        end_lsn = self.journal.end_lsn
        self.journaled(batches, errors)
        return CycleResult(self.apply_cycle(batches, errors), None, seconds, end_lsn)

    def cycle_entries(
        self, batches: Sequence[tuple[int, PendingBatch]]
    ) -> tuple[list[BaseException | None], list[EntryFrames]]:
        """What a cycle journals: per batch, None or why it may not be (its partition
        was reset after it was taken), and the entries of those that may."""
        errors: list[BaseException | None] = [None] * len(batches)
        entries: list[EntryFrames] = []
        for index, (partition, batch) in enumerate(batches):
            log = self._partitions[partition]
            if batch.generation != log.generation:
                # Its partition was reset after the batch was taken (resets run in the
                # commit thread, between cycles): its appends are gone, and must not be
                # journaled.
                errors[index] = LogError(f"{log!r}: batch taken before a reset")
            else:
                entries.append((partition, batch.first_offset, len(batch.ends), batch.data))
        return errors, entries

    def fail_cycle(
        self, batches: Sequence[tuple[int, PendingBatch]], cause: BaseException, seconds: float
    ) -> CycleResult:
        """The cycle's journal record failed: every batch with it, and their partitions
        stop until they reload."""
        for partition, _ in batches:
            self._partitions[partition].fail(cause)
        return CycleResult([cause] * len(batches), cause, seconds)

    def journaled(
        self, batches: Sequence[tuple[int, PendingBatch]], errors: Sequence[BaseException | None]
    ) -> None:
        """The cycle's journal record is durable: so is every batch in it."""
        for (partition, batch), error in zip(batches, errors, strict=True):
            if error is None:
                self._partitions[partition].journaled(batch)

    def apply_what_can_be(
        self, batches: Sequence[tuple[int, PendingBatch]], errors: list[BaseException | None]
    ) -> list[int]:
        """On the event loop: write each journaled batch that needs neither a wait nor a
        sync into its partition's files (PartitionLog.try_apply), its failure into
        ``errors``; the indices of those left for apply_cycle (the commit thread)."""
        left = []
        for index, (partition, batch) in enumerate(batches):
            if errors[index] is not None:
                continue
            try:
                if not self._partitions[partition].try_apply(batch):
                    left.append(index)
            except BaseException as exc:  # durable all the same: reported, never lost
                errors[index] = exc
        return left

    def apply_cycle(
        self, batches: Sequence[tuple[int, PendingBatch]], errors: Sequence[BaseException | None]
    ) -> list[BaseException | None]:
        """Write each journaled batch into its partition's files (commit thread):
        ``errors`` with each partition's own failure added (its batch is durable all
        the same: it is reported, never lost)."""
        applied = list(errors)
        for index, (partition, batch) in enumerate(batches):
            if applied[index] is not None:
                continue
            try:
                self._partitions[partition].apply_batch(batch)
            except BaseException as exc:
                applied[index] = exc
        return applied

    def close(self) -> None:
        """Close every partition and release DATA/LOCK. Writable: a last checkpoint
        first, so what offline writers committed is recorded as on disk."""
        try:
            if self.journal is not None and self._lock_fd is not None:
                open_partitions = {p for p, log in enumerate(self._partitions) if log.is_open}
                try:
                    self.take_checkpoint(self.journal.end_lsn, open_partitions & self.pinned)
                except OSError as exc:
                    if not is_disk_full(exc):
                        raise
                    # Nothing is lost: the journal and the old CHECKPOINT hold it all,
                    # and the next open recovers from them.
                    _log.warning(
                        "%s: the last checkpoint was not written, the disk is full (%s); "
                        "the next start recovers from the journal",
                        self.data_dir,
                        exc,
                    )
                self.journal.close()
        finally:
            for partition in self._partitions:
                partition.close()
            if self._lock_fd is not None:
                fd, self._lock_fd = self._lock_fd, None
                self.fs.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> StateLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class _OpeningWrites:
    """The writes that end a writable open, not done yet (StateLog.finish_opening)."""

    assignment: Assignment | None = None  # what DATA/ASSIGNMENT must say
    torn_tail: tuple[str, int] | None = None  # a journal segment and the byte it tears at


def _catch_up(
    synced: PartitionCheckpoint, pending: list[JournalEntry], log: PartitionLog, fs: FileOps
) -> None:
    """A partition's catch-up with the journal, as the open would have done it: run
    when the partition opens (PartitionLog.check_before_open), on the FileOps given."""
    catch_up(fs, log.partition_dir, synced, pending)


def _migrate(fs: FileOps, data_dir: str, num_partitions: int) -> None:
    """Format 1 to 2 (module docstring): every partition file is on disk already."""
    directory = journal_dir(data_dir)
    if not fs.exists(directory):
        fs.mkdir(directory)
        fs.fsync_dir(data_dir)
    partitions = {}
    for p in range(num_partitions):
        files = list_log_files(fs, partition_dir(data_dir, p))
        if files:
            base, path = files[-1]
            scan = scan_segment(fs, path, base)
            next_offset = base if scan.last_offset is None else scan.last_offset + 1
            partitions[p] = PartitionCheckpoint(0, base, scan.valid_size, next_offset)
    write_checkpoint(fs, directory, Checkpoint(partitions))
    write_file_atomically(
        fs,
        os.path.join(data_dir, META_FILE),
        json.dumps({"format": META_FORMAT, "num_partitions": num_partitions}).encode() + b"\n",
    )
    _log.info("%s: migrated to data directory format %d (a journal)", data_dir, META_FORMAT)


def _partition_maker(
    assignment: Assignment | None, only: Collection[int] | None
) -> Callable[[FileOps, str, int], None]:
    """What a new data directory starts with: the daemon's own partitions (each with its
    OWNER, and ASSIGNMENT), none for the partition tools, or every partition."""

    def make(fs: FileOps, data_dir: str, num_partitions: int) -> None:
        if assignment is not None:
            create_fresh(fs, data_dir, assignment)
        else:
            _make_partition_dirs(fs, data_dir, 0 if only is not None else num_partitions)

    return make


def _recorded_node(fs: FileOps, data_dir: str) -> int | None:
    """The node DATA/ASSIGNMENT names, if a daemon of this version ran here."""
    recorded = read_assignment(fs, data_dir)
    return None if recorded is None else recorded.node_id


def _take_lock(fs: FileOps, data_dir: str) -> int:
    fd = fs.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        fs.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LogLockedError(data_dir) from None
        raise
    # Who holds it, for a human looking; the flock is what counts. Written over the old
    # holder's bytes, then cut to length: on a full disk that needs no new space, and if
    # even that is refused (a LOCK file made just now), the lock still holds.
    holder = f"{os.getpid()}\n".encode()
    try:
        fs.pwrite_all(fd, holder, 0)
        fs.truncate(fd, len(holder))
    except OSError as exc:
        if not is_disk_full(exc):
            fs.close(fd)
            raise
        _log.warning("%s: the holder's PID not written: %s", data_dir, exc)
    return fd


def _check_meta(
    fs: FileOps,
    data_dir: str,
    num_partitions: int | None,
    *,
    create: bool,
    make_partitions: Callable[[FileOps, str, int], None],
) -> tuple[int, int]:
    """(num_partitions, format) of the directory, creating it in the current format
    (its partition directories by `make_partitions`)."""
    path = os.path.join(data_dir, META_FILE)
    if not fs.exists(path) and create:
        if num_partitions is None:
            raise ValueError(f"{data_dir} is new: num_partitions is required to create it")
        # Meta goes last: once it exists, every partition directory it was made with and
        # the journal do, and a missing one is damage, never a fresh start.
        make_partitions(fs, data_dir, num_partitions)
        directory = journal_dir(data_dir)
        if not fs.exists(directory):
            fs.mkdir(directory)
            fs.fsync_dir(data_dir)
        write_checkpoint(fs, directory, Checkpoint())
        meta = {"format": META_FORMAT, "num_partitions": num_partitions}
        write_file_atomically(fs, path, json.dumps(meta).encode() + b"\n")
        return num_partitions, META_FORMAT
    found = read_meta(data_dir, fs)
    if num_partitions is not None and found["num_partitions"] != num_partitions:
        raise MetaMismatchError(
            f"{data_dir} was created with num_partitions={found['num_partitions']} (recorded "
            f"in {path}); refusing to open it with num_partitions={num_partitions}: the number "
            "of state partitions is fixed for a data directory"
        )
    return int(found["num_partitions"]), int(found["format"])


def _make_partition_dirs(fs: FileOps, data_dir: str, num_partitions: int) -> None:
    root = os.path.join(data_dir, PARTITIONS_DIR)
    created = []
    if not fs.exists(root):
        fs.mkdir(root)
        created.append(data_dir)
    for p in range(num_partitions):
        path = partition_dir(data_dir, p)
        if not fs.exists(path):
            fs.mkdir(path)
            created.append(root)
    for directory in dict.fromkeys(created):
        fs.fsync_dir(directory)


if TYPE_CHECKING:

    def _implements_the_seam(log: StateLog) -> StateStore[PendingBatch]:
        """mypy's check that the local log is a state store (persistence/store.py)."""
        return log
