"""`sharecoord log verify`: check a data directory without changing it.

Every frame of every segment is read and checked (length, checksum, magic, record
type, field lengths) and offsets must rise strictly, within each segment's range. A
torn or incomplete end of a partition's newest segment is not damage: a crash leaves
one (the next open cuts it) and a running daemon may be writing the frame right now. It
is reported as `tail`. A frame whose checksum holds is never a torn end, wherever it
lies (frame.py: InvalidFrame). Everything else is damage, named by file and byte offset. A
partition the data directory says another node holds has no directory here, and that is
no damage either (`absent`).

The journal is checked too (a record that does not decode, followed by one that does,
is damage; a torn end is a tail). Where the journal's checkpoint says a partition's
newest segment was never fsynced, anything after that byte is what the journal holds
and the next open lays again, so damage there is a tail as well. Records still only in
the journal are counted and named in a note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from persistence.errors import LogError
from persistence.fileops import FileOps
from persistence.journal import JournalView, frame_offset, journal_dir, read_checkpoint
from persistence.ownership import absent_by_design
from persistence.segments import list_segments, scan_partition
from persistence.staging import SWAP_SUFFIX
from persistence.statelog import META_FILE, partition_dir, read_meta
from persistence.swap import pending_staged


@dataclass(frozen=True)
class Damage:
    path: str
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: byte {self.position}: {self.reason}"


@dataclass
class PartitionVerifyResult:
    partition: int
    segment_count: int = 0
    record_count: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    damage: list[Damage] = field(default_factory=list)
    tail: Damage | None = None  # a torn or still-being-written end of the newest segment
    notes: list[str] = field(default_factory=list)
    absent: str | None = None  # why the partition is not here although nothing is wrong

    @property
    def ok(self) -> bool:
        return not self.damage


@dataclass
class VerifyReport:
    data_dir: str
    num_partitions: int | None
    partitions: list[PartitionVerifyResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # about the directory itself
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.partitions)


def verify(data_dir: str | os.PathLike[str], fs: FileOps | None = None) -> VerifyReport:
    """Check every partition of `data_dir`; never writes."""
    data_dir = os.fspath(data_dir)
    fs = fs or FileOps()
    try:
        meta = read_meta(data_dir, fs)
    except LogError as exc:
        return VerifyReport(data_dir, None, problems=[str(exc)])
    except OSError as exc:  # a meta that is a directory, or cannot be read
        path = os.path.join(data_dir, META_FILE)
        return VerifyReport(data_dir, None, problems=[f"{path}: {exc.strerror or exc}"])
    num_partitions: int = meta["num_partitions"]
    report = VerifyReport(data_dir, num_partitions)
    journal = None
    try:
        journal = JournalView.load(data_dir, fs)
        if journal is None and meta["format"] >= 2:
            read_checkpoint(fs, journal_dir(data_dir))  # raises: it is missing
    except LogError as exc:
        report.problems.append(str(exc))
    if journal is not None and journal.torn_at is not None:
        path, position, reason = journal.torn_at
        report.notes.append(f"journal: incomplete tail: {path}: byte {position}: {reason}")
    for partition in range(num_partitions):
        elsewhere = absent_by_design(fs, data_dir, partition)
        if elsewhere is not None:
            absent = PartitionVerifyResult(partition, absent=elsewhere)
            if journal is not None and any(True for _ in journal.entries(partition)):
                absent.notes.append(
                    "the journal here still holds records for it, kept until they are"
                    " written (docs/operations.md, moving a partition)"
                )
            report.partitions.append(absent)
            continue
        report.partitions.append(
            verify_partition(partition, partition_dir(data_dir, partition), fs, journal)
        )
    return report


def verify_partition(
    partition: int, directory: str, fs: FileOps, journal: JournalView | None = None
) -> PartitionVerifyResult:
    result = PartitionVerifyResult(partition)
    if not fs.exists(directory):
        result.damage.append(Damage(directory, 0, "the partition directory is missing"))
        return result
    try:
        segments = list_segments(directory, fs)
    except (OSError, ValueError) as exc:
        result.damage.append(Damage(directory, 0, f"cannot list the segments: {exc}"))
        return result
    result.segment_count = len(segments)
    newest_base = segments[-1].base_offset if segments else None
    for scan in scan_partition(fs, [(s.base_offset, s.path) for s in segments]):
        result.record_count += scan.record_count
        if result.first_offset is None:
            result.first_offset = scan.first_offset
        if scan.last_offset is not None:
            result.last_offset = scan.last_offset
        if scan.damage is not None:
            found = Damage(scan.path, scan.damage.position, scan.damage.reason)
            unsynced_from = None
            if journal is not None and newest_base is not None and scan.path == segments[-1].path:
                unsynced_from = journal.unsynced_from(partition, newest_base)
            if scan.tail_is_torn or (
                unsynced_from is not None and scan.damage.position >= unsynced_from
            ):
                result.tail = found
            else:
                result.damage.append(found)
    if journal is not None:
        _count_journal_only(result, journal)
    result.notes.extend(_staging_notes(directory, fs))
    return result


def _count_journal_only(result: PartitionVerifyResult, journal: JournalView) -> None:
    """Add the partition's records that follow its files' last one in the journal."""
    last = -1 if result.last_offset is None else result.last_offset
    extra = 0
    for entry in journal.entries(result.partition):
        for start, _ in entry.frame_spans():
            offset = frame_offset(entry.frames, start)
            if offset > last:
                extra += 1
                last = offset
                if result.first_offset is None:
                    result.first_offset = offset
    if extra:
        result.record_count += extra
        result.last_offset = last
        result.notes.append(f"{extra} records only in the journal yet; the next open writes them")


def _staging_notes(directory: str, fs: FileOps) -> list[str]:
    notes = []
    for name in sorted(fs.listdir(directory)):
        if name.endswith(SWAP_SUFFIX):
            notes.append(f"{name}: a half-done compaction swap; the next open finishes it")
        elif name.endswith(".broken"):
            notes.append(f"{name}: bytes cut from a torn tail by an earlier recovery")
    for base in pending_staged(directory, fs):
        notes.append(f"compaction output staged at base {base}, waiting to be committed")
    return notes
