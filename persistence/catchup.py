"""Bringing a partition's files up to date with the journal.

Partition files are written after the journal, without fsync, so after a crash (or a
failed write, or a failed checkpoint fsync) the newest segment may end short of what
the journal made durable, or in a torn or half-flushed stretch. What was fsynced is
known: the checkpoint (or, for a partition repairing itself while the daemon runs, its
last successful sync) names the segment, the byte up to which it is on disk, and the
offset of the next record after it. A partition with frames in the journal catches up:

1. The newest segment is the synced one, or a newer one (a roll fsyncs the full segment
   and creates the next, so a newer one starts with nothing synced).
2. The frames after the synced byte are read: they may be anything a crash left (the
   page cache writes back in any order, so valid frames may even follow garbage). They
   are kept up to the first one that does not verify or does not carry the next offset;
   the rest is cut (its bytes kept in a ``.broken`` file).
   If the segment is shorter than its synced size, or older than the synced segment,
   the disk lost what was fsynced: the whole newest segment is judged as recovery
   judges any segment (a torn tail is cut; damage followed by valid frames, or a frame
   whose checksum holds but whose fields are impossible, refuses).
3. The journal's frames of this partition are laid after that: a frame the file already
   holds is skipped, after comparing checksums where the file's copy was just read; the
   next one is appended; a frame beyond the next offset is a gap, and a checksum that
   differs a mismatch: both are damage.
4. The segment is fdatasynced.

A partition without frames in the journal is left as it is: nothing was written to it
since it was last synced, and opening it recovers it as ever. If its newest segment is
not the one the checkpoint names, at the size it names, the files were put there from
elsewhere (a restored backup, an imported partition): the position is then read from the
files, so that a crash after the next writes is not judged against the old files'
position. Run it twice and the second changes nothing: the file then holds every
journal frame.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from persistence.errors import LogCorruptionError
from persistence.fileops import FileOps, keep_cut_bytes
from persistence.frame import (
    FrameError,
    InvalidFrame,
    LogRecord,
    decode_frame,
    find_next_frame,
    frame_crc,
)
from persistence.journal import JournalEntry, PartitionCheckpoint, frame_checksum, frame_offset
from persistence.segments import list_log_files, scan_segment

_log = logging.getLogger("sharecoord.log")


@dataclass(frozen=True)
class CatchUpReport:
    partition_dir: str
    cut_at: int | None  # where the newest segment was cut, if it was
    cut_bytes: int
    broken_path: str | None
    frames_appended: int
    position: tuple[int, int, int]  # now on disk: (segment, size, next offset)


def catch_up(
    fs: FileOps,
    partition_dir: str,
    synced: PartitionCheckpoint,
    entries: Iterable[JournalEntry],
) -> CatchUpReport:
    """Steps 1-4 of the module docstring. Raises LogCorruptionError for damage."""
    pending = list(entries)
    unchanged = (synced.segment, synced.size, synced.next_offset)
    if not pending:
        try:
            files = list_log_files(fs, partition_dir) if fs.exists(partition_dir) else []
            position = unchanged if not files else _files_position(fs, files[-1], synced)
        except OSError as exc:
            # Nothing to lay from the journal, so nothing is at stake here: opening the
            # partition meets the disk error again and retries until the disk works.
            _log.warning(
                "%s: files not read (%s); the checkpoint's position stands", partition_dir, exc
            )
            position = unchanged
        return CatchUpReport(partition_dir, None, 0, None, 0, position)
    files = list_log_files(fs, partition_dir)
    if not files:
        raise LogCorruptionError(partition_dir, 0, "the partition has no segment")
    base, path = files[-1]
    fd = fs.open(path, os.O_RDWR)
    try:
        size = fs.size(fd)
        if base > synced.segment:
            start, next_offset, lenient = 0, base, True
        elif base == synced.segment and size >= synced.size:
            start, next_offset, lenient = synced.size, synced.next_offset, True
        else:  # the disk lost fsynced bytes: judge the segment as recovery would
            start, next_offset, lenient = 0, base, False
        tail = fs.pread(fd, size - start, start)
        checksums, valid, next_offset, stopped = _verified_prefix(tail, next_offset)
        cut_at = broken = None
        if valid < len(tail):
            if not lenient and isinstance(stopped, InvalidFrame):
                raise LogCorruptionError(path, start + valid, stopped.reason)
            if not lenient and find_next_frame(tail, valid, next_offset) is not None:
                raise LogCorruptionError(path, start + valid, "damaged frame, valid ones follow")
            cut_at = start + valid
            broken = _keep_broken(fs, path, cut_at, tail[valid:])
            fs.truncate(fd, cut_at)
        end = start + valid
        appended = 0
        for entry in pending:
            for span_start, span_end in entry.frame_spans():
                offset = frame_offset(entry.frames, span_start)
                if offset < next_offset:
                    known = checksums.get(offset)
                    if known is not None and known != frame_checksum(entry.frames, span_start):
                        raise LogCorruptionError(
                            path, 0, f"record {offset} differs from the journal's copy"
                        )
                    continue
                if offset > next_offset:
                    raise LogCorruptionError(
                        path, end, f"the journal goes on at record {offset}, not {next_offset}"
                    )
                frame = entry.frames[span_start:span_end]
                try:
                    fs.pwrite_all(fd, frame, end)
                except OSError:
                    _cut_quietly(fs, fd, path, end)
                    raise
                end += len(frame)
                next_offset += 1
                appended += 1
        if cut_at is not None or appended:
            fs.fdatasync(fd)
    finally:
        fs.close(fd)
    if cut_at is not None or appended:
        _log.info(
            "%s: caught up with the journal: %d records appended%s",
            partition_dir,
            appended,
            f", {size - cut_at} unsynced bytes cut at byte {cut_at}" if cut_at is not None else "",
        )
    return CatchUpReport(
        partition_dir,
        cut_at,
        0 if cut_at is None else size - cut_at,
        broken,
        appended,
        (base, end, next_offset),
    )


def _cut_quietly(fs: FileOps, fd: int, path: str, end: int) -> None:
    """After a failed write (a full disk): cut what part of the frame landed, so the
    next try finds whole frames only, not a tail to keep as .broken. Cutting needs no
    space; if it fails all the same, the next try cuts it as any unsynced tail."""
    try:
        fs.truncate(fd, end)
    except OSError as exc:
        _log.warning("%s: a partly written frame not cut at byte %d (%s)", path, end, exc)


def _files_position(
    fs: FileOps, newest: tuple[int, str], synced: PartitionCheckpoint
) -> tuple[int, int, int]:
    """Where the files of a partition without journal frames end: the checkpoint's
    position if the newest segment is the one it names at its size, else read from the
    segment (its whole valid frames; opening the partition judges the rest), after an
    fdatasync: the checkpoint will call that position durable, and a copy put in place
    may still be only in the page cache."""
    base, path = newest
    fd = fs.open(path, os.O_RDONLY)
    try:
        if (base, fs.size(fd)) == (synced.segment, synced.size):
            return (synced.segment, synced.size, synced.next_offset)
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    scan = scan_segment(fs, path, base)
    next_offset = base if scan.last_offset is None else scan.last_offset + 1
    _log.info(
        "%s: the files are not those the checkpoint names (segment %d, %d bytes): "
        "taking their position, segment %d, %d bytes",
        os.path.dirname(path),
        synced.segment,
        synced.size,
        base,
        scan.valid_size,
    )
    return (base, scan.valid_size, next_offset)


def _verified_prefix(
    tail: bytes, next_offset: int
) -> tuple[dict[int, int], int, int, FrameError | None]:
    """The frames at the start of ``tail`` that verify and carry the offsets that are
    due: their checksums by offset, the bytes they span, the next offset after, and
    why the next frame does not verify (None: it is whole, with another offset)."""
    checksums: dict[int, int] = {}
    pos = 0
    while pos < len(tail):
        try:
            record, end = decode_frame(tail, pos)
        except FrameError as exc:
            return checksums, pos, next_offset, exc
        if not _in_order(record, next_offset):
            break
        checksums[record.offset] = frame_crc(memoryview(tail)[pos:end])
        next_offset = record.offset + 1
        pos = end
    return checksums, pos, next_offset, None


def _in_order(record: LogRecord, next_offset: int) -> bool:
    # Appends assign offsets one by one: the frame after a synced one is the next offset.
    return record.offset == next_offset


def _keep_broken(fs: FileOps, path: str, position: int, cut: bytes) -> str | None:
    if not cut.strip(b"\0"):
        return None  # zeros a crash left: nothing anybody wrote
    return keep_cut_bytes(fs, path, position, cut)
