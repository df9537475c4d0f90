"""Segment files: naming, listing, and reading them frame by frame with verification.

A state partition's directory DATA/partitions/<p>/ holds its segments, each named by
the offset it starts at (`00000000000000000000.log`). Offsets increase strictly through
a segment and across segments, and every offset in a segment lies in
[its base offset, the next segment's base offset). They need not be contiguous: a
compacted segment keeps only the offsets it kept.

Readers here never write. They verify every frame they pass (checksum, format, offset
order) and report or raise on the first one that is not right: nothing is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from persistence.errors import LogCorruptionError
from persistence.fileops import FileOps
from persistence.frame import (
    LENGTH_FIELD_SIZE,
    MAX_FRAME_LENGTH,
    MIN_LENGTH,
    CorruptFrame,
    FrameError,
    IncompleteFrame,
    InvalidFrame,
    LogRecord,
    decode_frame,
    find_next_frame,
    frame_crc,
    last_frame_of,
    walk_frames,
)
from persistence.journal import JournalView, frame_offset
from persistence.ownership import absent_by_design, data_dir_of
from persistence.staging import (
    LOG_SUFFIX,
    SWAP_SUFFIX,
    SegmentFingerprint,
    base_name,
    manifest_path,
    parse_base,
    read_manifest,
)
from protocol.loading import RawRecord

READ_CHUNK = 1 << 20
_DEFAULT_FS = FileOps()


class SegmentInfo(NamedTuple):
    base_offset: int
    path: str
    size_bytes: int


def segment_name(base_offset: int) -> str:
    return base_name(base_offset) + LOG_SUFFIX


def segment_path(partition_dir: str, base_offset: int) -> str:
    return os.path.join(partition_dir, segment_name(base_offset))


def list_log_files(fs: FileOps, partition_dir: str) -> list[tuple[int, str]]:
    """(base offset, path) of every `<base>.log` file, oldest first."""
    found = []
    for file_name in fs.listdir(partition_dir):
        base = parse_base(file_name, LOG_SUFFIX)
        if base is not None:
            found.append((base, os.path.join(partition_dir, file_name)))
    return sorted(found)


def list_segments(partition_dir: str, fs: FileOps | None = None) -> list[SegmentInfo]:
    """The partition's segments as recovery will leave them, oldest first.

    A half-done compaction swap (a `<base>.swap` file) is shown as done: the swap file
    stands in for the segments its manifest says it replaces, so a reader sees every
    record exactly once whether or not the swap finished."""
    fs = fs or _DEFAULT_FS
    if _elsewhere(fs, partition_dir):
        return []
    files = dict(list_log_files(fs, partition_dir))
    for file_name in fs.listdir(partition_dir):
        base = parse_base(file_name, SWAP_SUFFIX)
        if base is None:
            continue
        manifest = read_manifest(fs, manifest_path(partition_dir, base))
        for replaced in manifest.replaced:
            replaced_base = parse_base(replaced.name, LOG_SUFFIX)
            if replaced_base is not None:
                files.pop(replaced_base, None)
        files[base] = os.path.join(partition_dir, file_name)
    return [SegmentInfo(base, path, os.stat(path).st_size) for base, path in sorted(files.items())]


@dataclass
class SegmentState:
    """What the log keeps in memory about one of its segments."""

    base_offset: int
    path: str
    size: int
    last_offset: int | None = None
    last_frame_crc: int | None = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def info(self) -> SegmentInfo:
        # tuple.__new__, not SegmentInfo(...): a NamedTuple's __new__ is Python source,
        # and the event loop makes an info after every write it applies.
        info: SegmentInfo = _TUPLE_NEW(SegmentInfo, (self.base_offset, self.path, self.size))
        return info


_TUPLE_NEW: Final[Callable[..., Any]] = tuple.__new__


class _OffsetOutOfOrder(InvalidFrame):
    """A valid frame whose offset breaks the order: never a torn write."""


class FrameStream:
    """Iterate (position, record, crc) over the frames of an open segment file.

    Stops at a clean end, or at the first bad frame, which it leaves in `damage` (its
    position made a file position). `limit` bounds the bytes read: a live segment may be
    growing, and only what was durable when the read began is wanted."""

    def __init__(
        self,
        fs: FileOps,
        fd: int,
        *,
        min_offset: int = 0,
        below_offset: int | None = None,
        limit: int | None = None,
    ) -> None:
        self._fs = fs
        self._fd = fd
        self._min_offset = min_offset  # the next frame's offset must be at least this
        self._below_offset = below_offset
        self.limit = fs.size(fd) if limit is None else limit
        self.damage: FrameError | None = None
        self.valid_size = 0  # bytes of whole valid frames from the start
        self._read_to = 0
        self._rest = b""  # bytes read from the damage on, kept for tail classification

    def __iter__(self) -> Iterator[tuple[int, LogRecord, int]]:
        buf = b""
        buf_at = 0  # file position of buf[0]
        while True:
            pos = 0
            need = READ_CHUNK
            try:
                while pos < len(buf):
                    record, end = decode_frame(buf, pos)
                    self._check_order(pos, record.offset)
                    self._min_offset = record.offset + 1
                    yield buf_at + pos, record, frame_crc(memoryview(buf)[pos:end])
                    pos = end
                    self.valid_size = buf_at + pos
            except IncompleteFrame as exc:
                if self._read_to >= self.limit:
                    self._stop(exc, buf_at, buf[pos:])
                    return
                need = max(need, exc.needed)
            except CorruptFrame as exc:
                self._stop(exc, buf_at, buf[pos:])
                return
            if self._read_to >= self.limit:
                return
            buf, buf_at = buf[pos:] + self._read(need), buf_at + pos

    def _check_order(self, pos: int, offset: int) -> None:
        if offset < self._min_offset:
            raise _OffsetOutOfOrder(
                pos, f"record offset {offset} where at least {self._min_offset} was due"
            )
        if self._below_offset is not None and offset >= self._below_offset:
            raise _OffsetOutOfOrder(
                pos, f"record offset {offset} reaches the next segment's base {self._below_offset}"
            )

    def _read(self, size: int) -> bytes:
        size = min(size, self.limit - self._read_to)
        parts = []
        while size > 0:
            chunk = self._fs.read(self._fd, size)
            if not chunk:
                self.limit = self._read_to  # shorter than the limit: stop at what is there
                break
            parts.append(chunk)
            size -= len(chunk)
            self._read_to += len(chunk)
        return b"".join(parts)

    def _stop(self, damage: FrameError, buf_at: int, rest: bytes) -> None:
        damage.position += buf_at
        self.damage = damage
        self._rest = rest

    def damage_is_torn_tail(self) -> bool:
        """Whether the damage is a torn tail: a frame whose checksum does not hold, or
        that the end of the file cuts short, with no valid frame (with an offset in
        order) after it. A frame whose checksum holds (an InvalidFrame, an offset out of
        order) was written so, and is never torn; nor is damage a valid frame follows:
        it is in the middle, and nothing may be cut. Reads the rest of the file."""
        if self.damage is None or isinstance(self.damage, InvalidFrame):
            return False
        rest = self._rest + self._read(self.limit - self._read_to)
        return find_next_frame(rest, 0, self._min_offset) is None


@dataclass
class SegmentScan:
    """The result of reading one segment file through."""

    path: str
    base_offset: int
    size: int  # bytes considered (the file size, or the limit given)
    valid_size: int  # bytes of whole valid frames from the start
    record_count: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    last_frame_crc: int | None = None
    last_frame_at: int | None = None  # file position where the last valid frame starts
    damage: FrameError | None = None  # the first bad frame; position in the file
    tail_is_torn: bool = False  # set when asked: nothing valid follows the damage

    def state(self) -> SegmentState:
        """The segment as it stands once whatever follows `valid_size` is cut."""
        return SegmentState(
            self.base_offset, self.path, self.valid_size, self.last_offset, self.last_frame_crc
        )


def scan_segment(
    fs: FileOps,
    path: str,
    base_offset: int,
    *,
    after_offset: int = -1,
    below_offset: int | None = None,
    limit: int | None = None,
    classify_tail: bool = False,
    on_record: Callable[[LogRecord], None] | None = None,
    on_records: Callable[[list[RawRecord]], None] | None = None,
) -> SegmentScan:
    """Read a segment through, verifying every frame and the offset order (each offset
    above `after_offset`, at least `base_offset`, below `below_offset`). Never raises for
    damage: the first bad frame is in the result. With `classify_tail`, also tell whether
    the damage is a torn tail (reads the rest of the file).

    `on_records` takes the records in runs, as plain tuples (a loader's way: a third
    of the cost of `on_record`'s LogRecord a frame); the result is the same."""
    if on_records is not None:
        fast, handed_on = _scan_fast(
            fs, path, base_offset, after_offset, below_offset, limit, on_records
        )
        if fast is not None:
            return fast
        # Damage: the frame-by-frame reader has the verdict, and hands on what follows
        # the records the fast one already gave.
        delivered = _Delivered(on_records, handed_on)
        on_record = delivered.take
    fd = fs.open(path, os.O_RDONLY)
    try:
        stream = FrameStream(
            fs,
            fd,
            min_offset=max(base_offset, after_offset + 1),
            below_offset=below_offset,
            limit=limit,
        )
        scan = SegmentScan(path, base_offset, stream.limit, 0)
        for position, record, crc in stream:
            if on_record is not None:
                on_record(record)
            if scan.first_offset is None:
                scan.first_offset = record.offset
            scan.record_count += 1
            scan.last_offset = record.offset
            scan.last_frame_crc = crc
            scan.last_frame_at = position
        scan.valid_size = stream.valid_size
        scan.damage = stream.damage
        if classify_tail and stream.damage is not None:
            scan.tail_is_torn = stream.damage_is_torn_tail()
        if on_records is not None:
            delivered.flush()
        return scan
    finally:
        fs.close(fd)


class _Delivered:
    """The records of a segment the fast reader gave up on, read again frame by frame:
    those past what it already handed on go on, in runs."""

    def __init__(self, on_records: Callable[[list[RawRecord]], None], after: int) -> None:
        self.on_records = on_records
        self.after = after
        self.run: list[RawRecord] = []

    def take(self, record: LogRecord) -> None:
        if record.offset > self.after:
            self.run.append(
                (record.offset, record.timestamp, record.record_type, record.key, record.value)
            )

    def flush(self) -> None:
        if self.run:
            self.on_records(self.run)
            self.run = []


def _scan_fast(
    fs: FileOps,
    path: str,
    base_offset: int,
    after_offset: int,
    below_offset: int | None,
    limit: int | None,
    on_records: Callable[[list[RawRecord]], None],
) -> tuple[SegmentScan | None, int]:
    """``scan_segment`` of a segment without damage, by ``walk_frames`` over chunks of
    the file; None at the first frame it does not take (``scan_segment`` reads the
    segment again for the verdict), with the last offset handed on (-1: none)."""
    fd = fs.open(path, os.O_RDONLY)
    try:
        size = fs.size(fd) if limit is None else limit
        scan = SegmentScan(path, base_offset, size, 0)
        min_offset = max(base_offset, after_offset + 1)
        buf = b""
        buf_at = 0  # file position of buf[0]
        read_to = 0
        need: int | None = READ_CHUNK
        while True:
            records, stop = walk_frames(buf, 0, min_offset, below_offset)
            if records:
                last = records[-1]
                if scan.first_offset is None:
                    scan.first_offset = records[0][0]
                scan.record_count += len(records)
                scan.last_offset = min_offset = last[0]
                min_offset += 1
                scan.last_frame_crc, at = last_frame_of(buf, stop, last)
                scan.last_frame_at = buf_at + at
                scan.valid_size = buf_at + stop
                on_records(records)
            rest = len(buf) - stop
            if rest:
                need = _frame_size(buf, stop)
                if need is None or rest >= need or read_to >= size:
                    return None, -1 if scan.last_offset is None else scan.last_offset
            elif read_to >= size:
                return scan, -1
            chunk = fs.pread(fd, min(max(READ_CHUNK, need or 0), size - read_to), read_to)
            if not chunk:  # shorter than the limit: what is there is all there is
                if rest:
                    return None, -1 if scan.last_offset is None else scan.last_offset
                return scan, -1
            read_to += len(chunk)
            buf, buf_at = buf[stop:] + chunk, buf_at + stop
    finally:
        fs.close(fd)


def _frame_size(buf: bytes, at: int) -> int | None:
    """How many bytes the frame at buf[at] claims (its length field and all); None when
    the claim is no frame's."""
    if len(buf) - at < LENGTH_FIELD_SIZE:
        return LENGTH_FIELD_SIZE + MIN_LENGTH
    length = int.from_bytes(buf[at : at + LENGTH_FIELD_SIZE], "big")
    if length < MIN_LENGTH or length > MAX_FRAME_LENGTH:
        return None
    return LENGTH_FIELD_SIZE + length


def scan_partition(
    fs: FileOps,
    segments: Sequence[tuple[int, str]],
    *,
    on_record: Callable[[LogRecord], None] | None = None,
    on_records: Callable[[list[RawRecord]], None] | None = None,
) -> Iterator[SegmentScan]:
    """Scan a partition's segments, (base offset, path) oldest first: each one's offsets
    above the previous segment's and below the next one's base. Damage in the newest is
    classified (tail_is_torn); the caller decides what any damage means."""
    last_offset = -1
    for index, (base, path) in enumerate(segments):
        newest = index == len(segments) - 1
        scan = scan_segment(
            fs,
            path,
            base,
            after_offset=last_offset,
            below_offset=None if newest else segments[index + 1][0],
            classify_tail=newest,
            on_record=on_record,
            on_records=on_records,
        )
        yield scan
        if scan.last_offset is not None:
            last_offset = scan.last_offset


def read_segment(
    path: str | os.PathLike[str],
    *,
    fs: FileOps | None = None,
    from_offset: int = 0,
    allow_torn_tail: bool = False,
) -> Iterator[LogRecord]:
    """The records of one segment (or staged cleaned file), verified as they are read.

    Raises LogCorruptionError at the first bad frame. With `allow_torn_tail` (for the
    newest segment, which the daemon may be writing, or a crash may have torn), damage
    that recovery would cut as a torn tail ends the iteration instead: the records read
    are those the recovered log keeps."""
    path = os.fspath(path)
    fs = fs or _DEFAULT_FS
    fd = fs.open(path, os.O_RDONLY)
    try:
        yield from iter_stream(
            FrameStream(fs, fd, min_offset=_base_of(path)), path, from_offset, allow_torn_tail
        )
    finally:
        fs.close(fd)


def iter_stream(
    stream: FrameStream,
    path: str,
    from_offset: int,
    allow_torn_tail: bool,
    unsynced_from: int | None = None,
) -> Iterator[LogRecord]:
    """The records of `stream` from `from_offset`; raise at damage (but a torn tail, if
    allowed, or damage at or after `unsynced_from`, where the file was never fsynced
    and the journal holds what belongs there)."""
    for _, record, _ in stream:
        if record.offset >= from_offset:
            yield record
    damage = stream.damage
    if damage is None:
        return
    if unsynced_from is not None and damage.position >= unsynced_from:
        return
    if not (allow_torn_tail and stream.damage_is_torn_tail()):
        raise LogCorruptionError(path, damage.position, damage.reason)


def fingerprint_segment(path: str, fs: FileOps | None = None) -> SegmentFingerprint:
    """Name, size and last frame checksum of a sealed segment (reads it through)."""
    fs = fs or _DEFAULT_FS
    scan = scan_segment(fs, path, _base_of(path))
    if scan.damage is not None:
        raise LogCorruptionError(path, scan.damage.position, scan.damage.reason)
    return SegmentFingerprint(
        os.path.basename(path), scan.size, scan.last_frame_crc, scan.last_frame_at
    )


def _base_of(path: str) -> int:
    """The base offset a file's name gives (`<20 digits>.<anything>`), else 0."""
    stem = os.path.basename(path).split(".", 1)[0]
    return int(stem) if stem.isdigit() else 0


def read_partition(
    partition_dir: str | os.PathLike[str], from_offset: int = 0, fs: FileOps | None = None
) -> Iterator[LogRecord]:
    """The records of a partition directory at or above `from_offset`, verified, for
    readers outside the daemon (log dump, the Spark jobs): the records recovery would
    keep. A torn tail of the newest segment (a frame a running daemon is writing, or
    the end a crash tore) ends the files' records; so does damage where the files were
    never fsynced. Then come the records still only in the journal. Any other damage
    raises."""
    partition_dir = os.fspath(partition_dir)
    fs = fs or _DEFAULT_FS
    if not fs.exists(partition_dir):
        if _elsewhere(fs, partition_dir):
            return  # another node's partition: nothing of it is here, by design
        raise LogCorruptionError(partition_dir, 0, "the partition directory is missing")
    partitions_dir, partition_name = os.path.split(os.path.normpath(partition_dir))
    journal = None
    if partition_name.isdigit() and os.path.basename(partitions_dir) == "partitions":
        journal = JournalView.load(os.path.dirname(partitions_dir), fs)
    partition = int(partition_name) if journal is not None else -1
    segments = list_segments(partition_dir, fs)
    last_offset = -1
    for index, segment in enumerate(segments):
        newest = index == len(segments) - 1
        below = None if newest else segments[index + 1].base_offset
        if below is not None and below <= from_offset:
            continue
        fd = fs.open(segment.path, os.O_RDONLY)
        try:
            stream = FrameStream(
                fs,
                fd,
                min_offset=max(segment.base_offset, last_offset + 1),
                below_offset=below,
            )
            unsynced_from = (
                journal.unsynced_from(partition, segment.base_offset)
                if journal is not None and newest
                else None
            )
            for record in iter_stream(stream, segment.path, from_offset, newest, unsynced_from):
                last_offset = record.offset
                yield record
        finally:
            fs.close(fd)
    if journal is not None:
        yield from _journal_records(journal, partition, last_offset, from_offset)


def read_newest_open(
    partition_dir: str,
    segment: SegmentInfo,
    fd: int,
    *,
    after_offset: int = -1,
    from_offset: int = 0,
    fs: FileOps | None = None,
) -> Iterator[LogRecord]:
    """``read_partition``'s newest segment, read through a descriptor the caller opened
    (so a reader that opened every segment first reads what it listed, whatever a prune
    or swap does meanwhile), then the partition's records still only in the journal.
    `after_offset` is the last offset of the segment before it (-1: none)."""
    partition_dir = os.fspath(partition_dir)
    fs = fs or _DEFAULT_FS
    partitions_dir, partition_name = os.path.split(os.path.normpath(partition_dir))
    journal = None
    if partition_name.isdigit() and os.path.basename(partitions_dir) == "partitions":
        journal = JournalView.load(os.path.dirname(partitions_dir), fs)
    partition = int(partition_name) if journal is not None else -1
    stream = FrameStream(fs, fd, min_offset=max(segment.base_offset, after_offset + 1))
    unsynced_from = (
        journal.unsynced_from(partition, segment.base_offset) if journal is not None else None
    )
    last_offset = after_offset
    for record in iter_stream(stream, segment.path, from_offset, True, unsynced_from):
        last_offset = record.offset
        yield record
    if journal is not None:
        yield from _journal_records(journal, partition, last_offset, from_offset)


def _elsewhere(fs: FileOps, partition_dir: str) -> bool:
    """Whether a partition directory is missing because the data directory says another
    node holds that partition (ownership.py): empty for a reader, not damage."""
    if fs.exists(partition_dir):
        return False
    found = data_dir_of(partition_dir)
    return found is not None and absent_by_design(fs, *found) is not None


def _journal_records(
    journal: JournalView, partition: int, last_offset: int, from_offset: int
) -> Iterator[LogRecord]:
    """The partition's frames in the journal that follow `last_offset` without a gap."""
    for entry in journal.entries(partition):
        for start, end in entry.frame_spans():
            offset = frame_offset(entry.frames, start)
            if offset <= last_offset:
                continue
            if last_offset >= 0 and offset != last_offset + 1:
                return
            record, _ = decode_frame(entry.frames[start:end])
            last_offset = offset
            if offset >= from_offset:
                yield record
