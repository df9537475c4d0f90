"""The state log as one table: the history below each state partition's watermark and
the live log (sealed segments, the active one, and the frames still only in the
journal) at and above it, as Arrow batches of ``columns.SOURCE_SCHEMA``.

Two ways to cut it into pieces (``spark_jobs/datasource.py`` offers both):

* ``segment`` (what a query gets): one piece per history export, per sealed segment and
  per active segment, planned on the driver. A sealed segment that a prune or swap took
  away before its piece ran is read from the history instead, which its exporter wrote
  first; without a history, that is an error and the query is to be run again.
* ``state_partition`` (what the audit takes): one piece per state partition, planned
  where it runs and read whole in offset order.

Why a whole state partition read is consistent with a prune or swap running beside it:
the reader opens every segment it listed before it reads the export markers. A segment
gone before the listing was exported before it went, so its marker is read and the
watermark covers it; a segment replaced by compaction output after the listing is still
read through the descriptor opened; output swapped in before the listing only holds
offsets below the watermark, which the live side leaves to the history.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from persistence import LogError, list_segments, partition_dir, read_meta
from persistence.history import (
    SegmentExport,
    read_declaration,
    read_exports,
    watermark,
)
from persistence.segments import SegmentInfo, read_newest_open
from protocol.records import RecordDecoder
from spark_jobs.columns import collector_paused, decode_values, record_batch
from spark_jobs.history import read_export
from spark_jobs.sealed import RawRecord, read_sealed_segment

READ_ATTEMPTS = 3
BATCH_ROWS = 1 << 16  # rows per Arrow batch: bounded memory whatever a segment holds


@dataclass(frozen=True)
class Source:
    """A data directory and, if it keeps one and it is wanted, its history."""

    data_dir: str
    history_root: str | None
    num_partitions: int

    @classmethod
    def open(cls, data_dir: str, *, history: bool = True) -> Source:
        data_dir = os.path.abspath(data_dir)
        num_partitions = int(read_meta(data_dir)["num_partitions"])
        config = read_declaration(data_dir) if history else None
        return cls(data_dir, None if config is None else config.root, num_partitions)

    def exports(self, partition: int) -> list[SegmentExport]:
        return [] if self.history_root is None else read_exports(self.history_root, partition)


# -- a whole state partition (the audit) -------------------------------------------------


def read_whole_partition(source: Source, partition: int, after: int = -1) -> list[pa.RecordBatch]:
    """Every record of a state partition with an offset above `after`, in offset order.
    Read again (up to READ_ATTEMPTS times) if a segment vanishes between listing and
    opening it."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return _read_partition_once(source, partition, after)
        except FileNotFoundError as exc:
            if attempt == READ_ATTEMPTS:
                raise LogError(
                    f"state partition {partition}: the log kept changing: {exc}"
                ) from exc
    raise AssertionError("unreachable")


def _read_partition_once(source: Source, partition: int, after: int) -> list[pa.RecordBatch]:
    directory = partition_dir(source.data_dir, partition)
    segments = list_segments(directory)
    fds: list[int] = []
    try:
        for segment in segments:
            fds.append(os.open(segment.path, os.O_RDONLY))
        exports = source.exports(partition)  # only now: see the module docstring
        high = watermark(exports)
        batches: list[pa.RecordBatch] = []
        for export in exports:
            if export.records and export.covered_end - 1 > after:
                batches.extend(read_export(source.history_root or "", export, after))
        batches.extend(_live(directory, partition, segments, fds, max(after, high - 1)))
        return batches
    finally:
        for fd in fds:
            os.close(fd)


def _live(
    directory: str,
    partition: int,
    segments: Sequence[SegmentInfo],
    fds: Sequence[int],
    after: int,
) -> Iterator[pa.RecordBatch]:
    """The live records above `after` of segments opened by the caller."""
    last_offset = -1
    for index, (segment, fd) in enumerate(zip(segments, fds, strict=True)):
        if index == len(segments) - 1:
            frames = read_newest_open(
                directory, segment, fd, after_offset=last_offset, from_offset=after + 1
            )
            records = [(f.offset, f.timestamp, f.record_type, f.key, f.value) for f in frames]
            yield from to_batches(records, partition)
            return
        below = segments[index + 1].base_offset
        if below <= after + 1:
            continue
        read = read_sealed_segment(
            segment.path, segment.base_offset, after_offset=last_offset, below_offset=below, fd=fd
        )
        if read.last_offset is not None:
            last_offset = read.last_offset
        yield from to_batches(_above(read.records, after), partition)


def _above(records: list[RawRecord], after: int) -> list[RawRecord]:
    if not records or records[0][0] > after:
        return records
    return [r for r in records if r[0] > after]


def to_batches(records: Sequence[RawRecord], partition: int) -> Iterator[pa.RecordBatch]:
    """Records as data source rows, BATCH_ROWS at a time."""
    decoder = RecordDecoder()
    for start in range(0, len(records), BATCH_ROWS):
        yield _rows(records[start : start + BATCH_ROWS], decoder, partition)


@collector_paused
def _rows(chunk: Sequence[RawRecord], decoder: RecordDecoder, partition: int) -> pa.RecordBatch:
    return record_batch(chunk, decode_values(chunk), decoder, partition)


# -- pieces (a query) --------------------------------------------------------------------

# A piece is a plain tuple, so Spark can ship it to the executors:
#   ("history", data_dir, root, partition, export as JSON, after)
#   ("sealed", data_dir, root, partition, base, path, below, inode, after)
#   ("newest", data_dir, root, partition, base, path, inode, after)
#   ("partition", data_dir, root, partition, after)
Piece = tuple[Any, ...]


def plan(
    source: Source, partitions: Sequence[int], after: dict[int, int], whole: bool
) -> list[Piece]:
    """The pieces of a read of `partitions` (records above `after[p]`)."""
    root = source.history_root
    pieces: list[Piece] = []
    for partition in partitions:
        floor = after.get(partition, -1)
        if whole:
            pieces.append(("partition", source.data_dir, root, partition, floor))
            continue
        segments = list_segments(partition_dir(source.data_dir, partition))
        inodes = {s.path: _inode(s.path) for s in segments}
        exports = source.exports(partition)
        for export in exports:
            if export.records and export.covered_end - 1 > floor:
                pieces.append(
                    ("history", source.data_dir, root, partition, export.to_json(), floor)
                )
        live_after = max(floor, watermark(exports) - 1)
        for index, segment in enumerate(segments):
            inode = inodes[segment.path]
            if inode is None:
                continue  # gone already: its export is among the markers read after
            if index == len(segments) - 1:
                pieces.append(
                    ("newest", source.data_dir, root, partition, segment.base_offset,
                     segment.path, inode, live_after)
                )  # fmt: skip
            elif segments[index + 1].base_offset > live_after + 1:
                pieces.append(
                    ("sealed", source.data_dir, root, partition, segment.base_offset,
                     segment.path, segments[index + 1].base_offset, inode, live_after)
                )  # fmt: skip
    return pieces


def piece_bytes(piece: Piece) -> int:
    """About how many bytes of files a piece reads (for grouping pieces into tasks)."""
    kind = piece[0]
    if kind == "history":
        export = SegmentExport.from_json(piece[4])
        return sum(_size(os.path.join(piece[2], f.path)) for f in export.files)
    if kind in ("sealed", "newest"):
        return _size(piece[5])
    return 0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def read_piece(piece: Piece) -> Iterator[pa.RecordBatch]:
    kind, data_dir, root = piece[0], piece[1], piece[2]
    partition = piece[3]
    if kind == "partition":
        source = Source(data_dir, root, 0)
        yield from read_whole_partition(source, partition, piece[4])
    elif kind == "history":
        yield from read_export(root, SegmentExport.from_json(piece[4]), piece[5])
    elif kind == "sealed":
        yield from _read_sealed_piece(data_dir, root, partition, *piece[4:])
    elif kind == "newest":
        yield from _read_newest_piece(data_dir, partition, *piece[4:])
    else:
        raise ValueError(f"unknown piece {kind!r}")


def _read_sealed_piece(
    data_dir: str,
    root: str | None,
    partition: int,
    base: int,
    path: str,
    below: int,
    inode: int,
    after: int,
) -> Iterator[pa.RecordBatch]:
    fd = _open_same(path, inode)
    if fd is None:
        yield from _from_history_instead(root, partition, base, path, below, after)
        return
    try:
        read = read_sealed_segment(path, base, below_offset=below, fd=fd)
    finally:
        os.close(fd)
    yield from to_batches(_above(read.records, after), partition)


def _from_history_instead(
    root: str | None, partition: int, base: int, path: str, below: int, after: int
) -> Iterator[pa.RecordBatch]:
    """A sealed segment went (pruned, or replaced by compaction output) after the plan:
    whoever deleted it exported it first."""
    exports = [] if root is None else read_exports(root, partition)
    covering = [
        e
        for e in exports
        if e.records and e.first_offset is not None and e.first_offset < below
        and e.covered_end > max(base, after + 1)
    ]  # fmt: skip
    if not covering:
        raise LogError(
            f"{path} was pruned or compacted while the query read the log, and no history "
            "holds it: run the query again"
        )
    for export in covering:
        yield from read_export(root or "", export, after, below)


def _read_newest_piece(
    data_dir: str, partition: int, base: int, path: str, inode: int, after: int
) -> Iterator[pa.RecordBatch]:
    fd = _open_same(path, inode)
    if fd is None:
        raise LogError(f"{path} was replaced while the query read the log: run the query again")
    try:
        segment = SegmentInfo(base, path, 0)
        directory = partition_dir(data_dir, partition)
        frames = read_newest_open(directory, segment, fd, from_offset=after + 1)
        records = [(f.offset, f.timestamp, f.record_type, f.key, f.value) for f in frames]
    finally:
        os.close(fd)
    yield from to_batches(records, partition)


def _open_same(path: str, inode: int) -> int | None:
    """A descriptor of `path` if it is still the file planned (same inode), else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    if os.fstat(fd).st_ino != inode:
        os.close(fd)
        return None
    return fd
