"""The shared journal: one fdatasync makes a whole commit cycle durable.

A commit cycle writes the frames of every dirty state partition into one journal
record, fdatasyncs the journal once, and only then writes the same frames into the
partitions' segment files, without syncing them: the journal is what makes them
durable. A checkpoint now and then fsyncs the partition files and records, in
CHECKPOINT, how far each partition is on disk, so the journal below can go. (Many
files made durable by one flush: PostgreSQL's WAL, RocksDB's shared WAL, BookKeeper's
journal.)

DATA/journal/<lsn>.journal   segments, named by the log sequence number (LSN) of their
                             first byte (20 digits). An LSN is a position in the
                             journal's one address space: a segment's base plus the
                             byte's position in it. Each segment is created ahead of
                             use (O_EXCL, zero-filled to its full size, fsynced, its
                             directory fsynced), so writing a record never changes its
                             size and fdatasync flushes data only.
DATA/journal/<lsn>.journal.new
                             the next segment while it is made, paced, beside the
                             writes (Journal.ensure_spare), then renamed into place;
                             one left by a crash is deleted when the journal starts.
DATA/journal/CHECKPOINT      JSON, replaced atomically (temp, fsync, rename, fsync dir):
                             {"format": 1, "partitions": {"<p>": {"lsn": L, "segment":
                             B, "size": S, "next_offset": N}}}: partition p's segment B
                             was fsynced up to byte S, where record N would begin, and
                             every frame of p after that is in the journal at or above
                             LSN L.
DATA/journal/*.broken        bytes recovery cut from a torn journal tail, kept.

A record (all integers big-endian):

    offset  size  field
    0       4     length      u32: bytes after this field
    4       4     crc         u32: zlib.crc32 of bytes [8, 4 + length)
    8       8     lsn         u64: the record's own LSN (where it starts)
    16      4     entries     u32
    20      ...   entries, each:
                  0   4  partition     u32
                  4   8  first_offset  i64: offset of the entry's first frame
                  12  4  frames        u32: how many frames
                  16  4  bytes         u32: their total size
                  20  n  the frames, exactly as the partition's segment gets them

A length of 0 (the zeros a segment is created with) ends the segment's records; the
next record, if any, starts the next segment. A record never spans segments: one that
does not fit in what is left of a segment goes to the next (a record larger than a
whole segment gets a segment of its own size).

Recovery reads from the lowest LSN CHECKPOINT names: every record's CRC, its LSN equal
to its position, segments in order. Damage with nothing valid after it is a torn tail
(a crash during a write that was never acknowledged): it ends the journal, and its
bytes are kept in a `.broken` file. A valid record after damage is damage in the
middle: recovery refuses, naming the file and byte.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from persistence.errors import LogError
from persistence.fileops import (
    FileOps,
    keep_cut_bytes,
    pace,
    read_file,
    unlink_if_exists,
    write_file_atomically,
)
from persistence.frame import LENGTH, OFFSET_AT, PREFIX

_log = logging.getLogger("sharecoord.log")

JOURNAL_DIR = "journal"
CHECKPOINT_FILE = "CHECKPOINT"
JOURNAL_SUFFIX = ".journal"
CHECKPOINT_FORMAT = 1
DEFAULT_JOURNAL_SEGMENT_BYTES = 16 * 1024 * 1024

RECORD_HEAD = struct.Struct(">IIQI")  # length, crc, lsn, entries
ENTRY_HEAD = struct.Struct(">IqII")  # partition, first_offset, frames, bytes
LSN = struct.Struct(">Q")
CRC_START = 8
LSN_AT = 8
_ZERO_CHUNK = b"\0" * (1 << 20)
UNFINISHED_SUFFIX = ".new"

# The next segment's pace (fileops.pace): each MiB of its zeros but the last is synced on
# its own and followed by a pause twice as long as its write and sync took. Written and
# synced at once, its 16 MiB held the commit cycles' flushes up: at 13,000 single
# writes/s each new segment sat under ~450 writes slower than 2 ms.
SEGMENT_SPREAD = 2.0

# What append takes per partition: (partition, first offset, frame count, frames).
EntryFrames = tuple[int, int, int, bytes | bytearray | memoryview]


class JournalCorruptionError(LogError):
    """A journal record is damaged and valid records follow it: not a torn tail, and
    nothing may be cut. The daemon refuses to start."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(
            f"{path}: damaged journal at byte {position}: {reason}, and valid records "
            "follow; refusing to start (see docs/operations.md#repairing-a-damaged-partition)"
        )


@dataclass(frozen=True)
class JournalEntry:
    """One partition's frames in one record."""

    partition: int
    first_offset: int
    frame_count: int
    frames: bytes

    def frame_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each frame in ``frames``; its offset is ``first_offset``
        plus its index."""
        spans = []
        pos = 0
        for _ in range(self.frame_count):
            end = pos + LENGTH.size + LENGTH.unpack_from(self.frames, pos)[0]
            spans.append((pos, end))
            pos = end
        return spans


@dataclass(frozen=True)
class JournalRecord:
    lsn: int
    end_lsn: int
    entries: tuple[JournalEntry, ...]


@dataclass(frozen=True)
class UnsyncedRecord:
    """A record prepared for the current segment, not durable yet (Journal.prepare)."""

    fd: int
    lsn: int
    data: bytes


@dataclass(frozen=True)
class PartitionCheckpoint:
    """How far one partition is on disk: its segment ``segment`` is fsynced up to byte
    ``size``, where the record of offset ``next_offset`` would begin; every frame of the
    partition after that is in the journal at or above ``lsn``."""

    lsn: int
    segment: int
    size: int
    next_offset: int


@dataclass(frozen=True)
class Checkpoint:
    """Every partition's checkpoint. Never changed once made: a new checkpoint is a new
    object, so what is derived from it can be kept."""

    partitions: dict[int, PartitionCheckpoint] = field(default_factory=dict)

    def lowest_lsn(self) -> int:
        """The oldest journal position any partition still needs (asked on every write,
        to know whether the journal is full: worked out once)."""
        return self._lowest_lsn

    @functools.cached_property
    def _lowest_lsn(self) -> int:
        return min((c.lsn for c in self.partitions.values()), default=0)


def journal_dir(data_dir: str) -> str:
    return os.path.join(data_dir, JOURNAL_DIR)


def segment_file(directory: str, base: int) -> str:
    return os.path.join(directory, f"{base:020d}{JOURNAL_SUFFIX}")


def list_journal_segments(fs: FileOps, directory: str) -> list[tuple[int, str]]:
    """(base LSN, path) of every journal segment, oldest first."""
    found = []
    for name in fs.listdir(directory):
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == JOURNAL_SUFFIX and len(stem) == 20 and stem.isdigit():
            found.append((int(stem), os.path.join(directory, name)))
    return sorted(found)


# --- CHECKPOINT -----------------------------------------------------------------------


def read_checkpoint(fs: FileOps, directory: str) -> Checkpoint:
    path = os.path.join(directory, CHECKPOINT_FILE)
    try:
        document = json.loads(read_file(fs, path))
        if document.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        partitions = {
            int(p): PartitionCheckpoint(
                int(c["lsn"]), int(c["segment"]), int(c["size"]), int(c["next_offset"])
            )
            for p, c in document["partitions"].items()
        }
    except FileNotFoundError:
        raise LogError(
            f"{path} is missing: the journal cannot be read without it "
            "(see docs/operations.md#repairing-a-damaged-partition)"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogError(f"{path} is not a valid checkpoint: {exc}") from None
    return Checkpoint(partitions)


def write_checkpoint(fs: FileOps, directory: str, checkpoint: Checkpoint) -> None:
    document = {
        "format": CHECKPOINT_FORMAT,
        "partitions": {
            str(p): {
                "lsn": c.lsn,
                "segment": c.segment,
                "size": c.size,
                "next_offset": c.next_offset,
            }
            for p, c in sorted(checkpoint.partitions.items())
        },
    }
    write_file_atomically(
        fs, os.path.join(directory, CHECKPOINT_FILE), json.dumps(document).encode() + b"\n"
    )


# --- records --------------------------------------------------------------------------


def record_size(entries: Sequence[EntryFrames]) -> int:
    return RECORD_HEAD.size + sum(ENTRY_HEAD.size + len(e[3]) for e in entries)


def encode_record(lsn: int, entries: Sequence[EntryFrames]) -> bytes:
    """``entries``: (partition, first_offset, frame count, frames) each."""
    parts: list[bytes | bytearray | memoryview] = [b""]
    for partition, first_offset, count, frames in entries:
        parts.append(ENTRY_HEAD.pack(partition, first_offset, count, len(frames)))
        parts.append(frames)
    body = b"".join(parts)
    tail = LSN.pack(lsn) + struct.pack(">I", len(entries)) + body
    return struct.pack(">II", len(tail) + 4, zlib.crc32(tail)) + tail


def decode_record(buf: bytes, pos: int, expected_lsn: int) -> tuple[JournalRecord | None, str]:
    """The record at ``buf[pos]``, or None and why not (an empty reason: the zeros that
    end a segment's records)."""
    if pos + RECORD_HEAD.size > len(buf):
        if not buf[pos:].strip(b"\0"):
            return None, ""
        return None, "a record header cut short"
    length, crc, lsn, count = RECORD_HEAD.unpack_from(buf, pos)
    if length == 0:
        return None, ""
    end = pos + 4 + length
    if length < RECORD_HEAD.size - 4 or end > len(buf):
        return None, f"length field {length} runs past the segment"
    if zlib.crc32(memoryview(buf)[pos + CRC_START : end]) != crc:
        return None, "checksum mismatch"
    if lsn != expected_lsn:
        return None, f"LSN {lsn} where {expected_lsn} was due"
    entries = []
    at = pos + RECORD_HEAD.size
    for _ in range(count):
        if at + ENTRY_HEAD.size > end:
            return None, "an entry header runs past the record"
        partition, first_offset, frames, size = ENTRY_HEAD.unpack_from(buf, at)
        at += ENTRY_HEAD.size
        if at + size > end:
            return None, "an entry's frames run past the record"
        entries.append(JournalEntry(partition, first_offset, frames, bytes(buf[at : at + size])))
        at += size
    if at != end:
        return None, "entries do not fill the record"
    return JournalRecord(lsn, lsn + 4 + length, tuple(entries)), ""


# --- reading --------------------------------------------------------------------------


@dataclass
class JournalScan:
    records: list[JournalRecord]
    end_lsn: int  # after the last valid record (or where the scan began)
    torn_at: tuple[str, int, str] | None = None  # (segment, byte, reason) of a torn tail
    broken_path: str | None = None


def scan_journal(
    fs: FileOps, directory: str, from_lsn: int, *, keep_torn_tail: bool = False, live: bool = False
) -> JournalScan:
    """Every valid record at or above ``from_lsn``, in order (see the module docstring).

    ``live``: the journal is being written (a partition repairing itself while the
    daemon runs): the first record that does not decode ends the scan, whatever
    follows. Otherwise damage followed by a valid record raises JournalCorruptionError,
    and ``keep_torn_tail`` copies the bytes of a torn tail into a ``.broken`` file."""
    segments = list_journal_segments(fs, directory)
    records: list[JournalRecord] = []
    end_lsn = from_lsn
    for index, (base, path) in enumerate(segments):
        buf = read_file(fs, path)
        if base + len(buf) <= from_lsn:
            continue  # wholly below where the scan begins
        pos = max(from_lsn - base, 0)
        while True:
            record, reason = decode_record(buf, pos, base + pos)
            if record is None:
                break
            records.append(record)
            end_lsn = record.end_lsn
            pos = record.end_lsn - base
        written = len(buf.rstrip(b"\0"))  # nothing but zeros after this
        if not reason:
            if written <= pos:
                continue  # the segment's records end here; the next segment may go on
            reason = "bytes after the zeros that end the records"
        # Damage: a torn tail only if nothing valid comes after it.
        if live:
            return JournalScan(records, end_lsn)
        if _valid_record_after(buf, pos, written, base) or any(
            decode_record(read_file(fs, p), 0, b)[0] is not None for b, p in segments[index + 1 :]
        ):
            raise JournalCorruptionError(path, pos, reason)
        scan = JournalScan(records, end_lsn, (path, pos, reason))
        if keep_torn_tail:
            scan.broken_path = _keep_broken(fs, path, pos, buf[pos:written])
        return scan
    return JournalScan(records, end_lsn)


def _valid_record_after(buf: bytes, pos: int, written: int, base: int) -> bool:
    """Whether a valid record starts anywhere after ``pos`` in this segment (and before
    ``written``, where its zeros begin). Only a position holding its own LSN is tried."""
    for candidate in range(pos + 1, written - RECORD_HEAD.size + 1):
        if buf[candidate + LSN_AT : candidate + LSN_AT + 8] != LSN.pack(base + candidate):
            continue
        if decode_record(buf, candidate, base + candidate)[0] is not None:
            return True
    return False


def keep_torn_tail(fs: FileOps, path: str, position: int) -> str | None:
    """Keep the bytes of the torn tail a scan found (``JournalScan.torn_at``) in a
    ``.broken`` file: from ``position`` to where the segment's zeros begin. The segment
    itself is not changed (records after the tail go to new segments). Returns the
    file's path, or None when there was nothing but zeros to keep."""
    return _keep_broken(fs, path, position, read_file(fs, path)[position:].rstrip(b"\0"))


def _keep_broken(fs: FileOps, path: str, pos: int, torn: bytes) -> str | None:
    if not torn:
        return None
    broken = keep_cut_bytes(fs, path, pos, torn)
    _log.warning(
        "%s: torn journal tail at byte %d (%d bytes) cut; kept in %s", path, pos, len(torn), broken
    )
    return broken


@dataclass
class JournalView:
    """The journal as a reader sees it (log verify, log dump, the Spark jobs): what
    each partition's files hold surely, and the frames still only in the journal."""

    checkpoint: Checkpoint
    records: list[JournalRecord]
    torn_at: tuple[str, int, str] | None

    @classmethod
    def load(cls, data_dir: str, fs: FileOps) -> JournalView | None:
        """None for a directory without a journal (format 1). Raises LogError for a
        checkpoint it cannot read, JournalCorruptionError for damage in the middle."""
        directory = journal_dir(data_dir)
        if not fs.exists(os.path.join(directory, CHECKPOINT_FILE)):
            return None
        checkpoint = read_checkpoint(fs, directory)
        scan = scan_journal(fs, directory, checkpoint.lowest_lsn())
        return cls(checkpoint, scan.records, scan.torn_at)

    def synced(self, partition: int) -> PartitionCheckpoint | None:
        return self.checkpoint.partitions.get(partition)

    def entries(self, partition: int) -> Iterator[JournalEntry]:
        synced = self.synced(partition)
        return entries_of(self.records, partition, 0 if synced is None else synced.lsn)

    def unsynced_from(self, partition: int, segment_base: int) -> int | None:
        """Where the segment's bytes stop being surely on disk (what lies after may be
        anything a crash left, and is in the journal), or None: all of it is. Without
        frames in the journal nothing was written since the sync: all of it is."""
        synced = self.synced(partition)
        if next(self.entries(partition), None) is None:
            return None
        if synced is None or segment_base > synced.segment:
            return 0
        return synced.size if segment_base == synced.segment else None


def entries_of(
    records: Sequence[JournalRecord], partition: int, from_lsn: int
) -> Iterator[JournalEntry]:
    """The entries of one partition in records at or above ``from_lsn``, in order."""
    for record in records:
        if record.lsn < from_lsn:
            continue
        for entry in record.entries:
            if entry.partition == partition:
                yield entry


def frame_offset(frames: bytes, start: int) -> int:
    """The record offset of the frame starting at ``frames[start]``."""
    value: int = struct.unpack_from(">q", frames, start + OFFSET_AT)[0]
    return value


def frame_checksum(frames: bytes, start: int) -> int:
    value: int = PREFIX.unpack_from(frames, start)[1]
    return value


# --- writing --------------------------------------------------------------------------


def create_segment(fs: FileOps, directory: str, base: int, size: int) -> None:
    """A new segment of ``size`` zero bytes, durable with its directory entry."""
    _write_zeros(fs, segment_file(directory, base), size)
    fs.fsync_dir(directory)


def _write_zeros(
    fs: FileOps, path: str, size: int, paced_until: threading.Event | None = None
) -> None:
    """A new file of ``size`` zero bytes, fsynced; with ``paced_until``, synced a chunk
    at a time, each followed by its pause (SEGMENT_SPREAD), until that is set. A
    failure leaves no file behind."""
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        left = size
        while left > 0:
            began = time.monotonic()
            chunk = _ZERO_CHUNK if left >= len(_ZERO_CHUNK) else _ZERO_CHUNK[:left]
            fs.write_all(fd, chunk)
            left -= len(chunk)
            if left > 0 and paced_until is not None and not paced_until.is_set():
                fs.fsync(fd)  # (the file grew: fdatasync would commit its size all the same)
                pace(began, SEGMENT_SPREAD)
        fs.fsync(fd)
    except BaseException:
        fs.close(fd)
        unlink_if_exists(fs, path)
        raise
    fs.close(fd)


def remove_unfinished(fs: FileOps, directory: str) -> None:
    """Delete the segments a crash left half made (``.journal.new``): never in use."""
    removed = False
    for name in fs.listdir(directory):
        if name.endswith(JOURNAL_SUFFIX + UNFINISHED_SUFFIX):
            fs.unlink(os.path.join(directory, name))
            removed = True
    if removed:
        fs.fsync_dir(directory)


def next_free_lsn(fs: FileOps, directory: str) -> int:
    """The LSN just past every segment there is: where a new one may begin."""
    end = 0
    for base, path in list_journal_segments(fs, directory):
        fd = fs.open(path, os.O_RDONLY)
        try:
            end = max(end, base + fs.size(fd))
        finally:
            fs.close(fd)
    return end


class Journal:
    """Appends records to pre-created segments: ``append`` in the commit thread, or
    ``prepare``/``write``/``synced`` from the event loop for a record that fits the
    current segment, flushed by the kernel (kernel_flush.py). One record at a time.

    After a failed write or fdatasync the segment is never appended to again: the
    failed record is erased (zeroed and synced) and the next record goes to a fresh
    segment. No record is written while a failed one is not erased yet (each append
    tries again first, and fails while the disk does): a failed record never sits
    between good ones, where a reader would take it for damage in the middle, or for
    records that were answered 15. Until it is erased, ``is_void`` names it for the
    readers of a running journal."""

    def __init__(self, fs: FileOps, directory: str, start_lsn: int, segment_bytes: int) -> None:
        if segment_bytes < RECORD_HEAD.size:
            raise ValueError(f"journal segment_bytes must be >= {RECORD_HEAD.size}")
        self._fs = fs
        self.directory = directory
        self.segment_bytes = segment_bytes
        # The segment appends go to; none yet: the first append opens it.
        self._base = start_lsn
        self._capacity = segment_bytes
        self._position = 0
        self._fd: int | None = None
        # Creating a segment (ahead of need, in the checkpoint thread) and rolling onto
        # one (the commit thread) must not race on the same file.
        self._segments_lock = threading.Lock()
        self.bytes_written = 0  # since open: what the checkpoint cadence looks at
        self._hurry = threading.Event()  # set: a paced segment goes on at full speed
        # A failed record still on disk: (segment base, position, length).
        self._unerased: tuple[int, int, int] | None = None

    @classmethod
    def start(
        cls, fs: FileOps, directory: str, segment_bytes: int, *, at_least: int = 0
    ) -> Journal:
        """A journal that goes on after every segment there is (recovery read them) and
        at or above ``at_least``. Its segments are created when first needed, or ahead
        of need by ``ensure_spare``."""
        remove_unfinished(fs, directory)
        return cls(fs, directory, max(next_free_lsn(fs, directory), at_least), segment_bytes)

    @property
    def end_lsn(self) -> int:
        """The LSN the next record gets, if it fits the current segment."""
        return self._base + self._position

    @property
    def spare_lsn(self) -> int:
        return self._base + self._capacity

    def _use(self, base: int, capacity: int) -> None:
        fd = self._fs.open(segment_file(self.directory, base), os.O_WRONLY)
        if self._fd is not None:
            self._fs.close(self._fd)
        self._fd, self._base, self._capacity, self._position = fd, base, capacity, 0

    def ensure_spare(self) -> None:
        """Create the current segment, if no append has yet, and the next one, ahead of
        need (from a thread that does not append: the checkpoint thread). Once records
        are written, the next one is made paced (SEGMENT_SPREAD), under a name of its
        own, and renamed into place: a roll that needs it before that makes it at once
        itself, and never waits for the paced one."""
        with self._segments_lock:
            if not self._fs.exists(segment_file(self.directory, self._base)):
                create_segment(self._fs, self.directory, self._base, self.segment_bytes)
            base = self.spare_lsn
            path = segment_file(self.directory, base)
            if self._fs.exists(path):
                return
            if self._fd is None:
                # No record yet (the daemon's start waits for this): at once, and a
                # first roll waits for it.
                create_segment(self._fs, self.directory, base, self.segment_bytes)
                return
        unfinished = path + UNFINISHED_SUFFIX
        if self._fs.exists(unfinished):
            self._fs.unlink(unfinished)  # an earlier try's, which failed to remove it
        _write_zeros(self._fs, unfinished, self.segment_bytes, paced_until=self._hurry)
        with self._segments_lock:
            if self._fs.exists(path):
                self._fs.unlink(unfinished)  # a roll made it meanwhile
                return
            # Its name durable before a roll can write a record into it.
            self._fs.rename(unfinished, path)
            self._fs.fsync_dir(self.directory)

    def hurry(self) -> None:
        """Make the segment being made, and any after it, at full speed from now on:
        the daemon is stopping, and its last checkpoint waits for that thread."""
        self._hurry.set()

    def append(self, entries: Sequence[EntryFrames]) -> JournalRecord:
        """Write one record and fdatasync it: when this returns, the record is durable.
        Raises OSError (the record is not durable, and the segment is done for), also
        before writing anything while an earlier failed record cannot be erased."""
        if self._unerased is not None:
            self._erase()
        size = record_size(entries)
        if self._fd is None or self._position + size > self._capacity:
            self._roll(size)
        record = self.prepare(entries)
        assert record is not None
        try:
            self.write(record)
            self._fs.fdatasync(record.fd)
        except BaseException:
            self.abandon(record)
            raise
        return self.synced(record)

    def prepare(self, entries: Sequence[EntryFrames]) -> UnsyncedRecord | None:
        """The next record, encoded for the current segment, for a caller that writes
        and flushes it itself (``write``, its own fdatasync of ``fd``, then ``synced``,
        or ``abandon`` if either failed); or None when only ``append`` can take it (no
        segment yet, a roll, a failed record not erased: each creates or syncs files)."""
        if self._unerased is not None or self._fd is None:
            return None
        if self._position + record_size(entries) > self._capacity:
            return None
        lsn = self.end_lsn
        return UnsyncedRecord(self._fd, lsn, encode_record(lsn, entries))

    def write(self, record: UnsyncedRecord) -> None:
        """Write the prepared record, without its flush (the page cache only)."""
        assert record.lsn == self.end_lsn, "one record in flight at a time"
        self._fs.pwrite_all(record.fd, record.data, self._position)

    def synced(self, record: UnsyncedRecord) -> JournalRecord:
        """The record's flush returned: it is durable, and the next goes after it."""
        assert record.lsn == self.end_lsn, "one record in flight at a time"
        length = len(record.data)
        self._position += length
        self.bytes_written += length
        return JournalRecord(record.lsn, record.lsn + length, ())

    def abandon(self, record: UnsyncedRecord) -> None:
        """Its write or flush failed: erase what it may have put down and leave the
        segment (_abandon_segment). Writes and syncs: not on the event loop."""
        assert record.lsn == self.end_lsn, "one record in flight at a time"
        self._abandon_segment(len(record.data))

    def _roll(self, size: int) -> None:
        # The first append takes the segment the journal starts at; later ones the next.
        base = self._base if self._fd is None else self.spare_lsn
        capacity = self.segment_bytes
        path = segment_file(self.directory, base)
        with self._segments_lock:
            if size > capacity:
                # Larger than any segment: one of its own size, created now.
                unlink_if_exists(self._fs, path)
                capacity = size
                create_segment(self._fs, self.directory, base, capacity)
            elif not self._fs.exists(path):
                create_segment(self._fs, self.directory, base, capacity)
            self._use(base, capacity)

    def _abandon_segment(self, size: int) -> None:
        """After a failed write or fsync: erase what the record may have put down, and
        move on to a fresh segment (the next append rolls; the rest of this segment
        stays unused). If the disk refuses the erasure too, every append tries it again
        first (class docstring)."""
        self._unerased = (self._base, self._position, min(size, self._capacity - self._position))
        self._position = self._capacity
        try:
            self._erase()
        except OSError as exc:
            _log.error(
                "%s: could not erase a failed journal record (%s): no record is written "
                "until it is",
                self.directory,
                exc,
            )

    def _erase(self) -> None:
        assert self._unerased is not None
        base, position, length = self._unerased
        try:
            fd = self._fs.open(segment_file(self.directory, base), os.O_WRONLY)
        except FileNotFoundError:
            self._unerased = None  # a checkpoint deleted the segment: gone with it
            return
        try:
            self._fs.pwrite_all(fd, bytes(length), position)
            self._fs.fdatasync(fd)
        finally:
            self._fs.close(fd)
        self._unerased = None
        _log.info("%s: failed record at LSN %d erased", self.directory, base + position)

    def is_void(self, lsn: int) -> bool:
        """Whether the record at ``lsn`` is a failed one not erased yet (its write may
        have landed whole; its entries were answered 15): readers must skip it."""
        unerased = self._unerased
        return unerased is not None and lsn == unerased[0] + unerased[1]

    def delete_below(self, lsn: int) -> list[str]:
        """Delete the segments whose every byte lies below ``lsn``."""
        deleted = []
        segments = list_journal_segments(self._fs, self.directory)
        for index, (base, path) in enumerate(segments):
            next_base = segments[index + 1][0] if index + 1 < len(segments) else None
            if next_base is None or next_base > lsn or base >= self._base:
                break
            self._fs.unlink(path)
            deleted.append(path)
        if deleted:
            self._fs.fsync_dir(self.directory)
        return deleted

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._fs.close(fd)
