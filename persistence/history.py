"""The history: where the records compaction folds away and pruning deletes are kept,
and how anyone finds out which segments it already holds.

This module knows the layout and the export markers only; the Parquet files themselves
are written and read by ``spark_jobs`` (pyarrow), which the daemon does not have. The
daemon's prune asks ``HistoryIndex.holds`` before it deletes a segment.

    DATA/history.json                  {"format": 1, "dir": "history", "retention_ms": N}:
                                       this data directory keeps a history, there
                                       (relative to DATA, or absolute). Written by the
                                       compaction job; absent: no history is kept.
    HISTORY/state_partition=<p>/day=<YYYY-MM-DD>/<segment>.parquet
                                       the exported records of one segment that fall on
                                       one UTC day (Spark's partition directories)
    HISTORY/_exports/<p>/<segment>.json
                                       the export marker of one segment: written last,
                                       it is what makes the export count

``<segment>`` is the segment's fingerprint: ``<base, 20 digits>-<size>-<crc of its last
frame, or "empty">``. A sealed segment never changes, so the same fingerprint always
means the same bytes, and writing an export again writes the same files: exports are
idempotent by segment. A compaction output swapped in under the name of the segment it
replaced has another size or last frame, so another fingerprint.

What an export holds: the segment's records at or above the partition's *watermark*,
one past the highest offset any earlier marker covered. The history therefore holds
each original record once, from the first export on, whatever compaction later did to
the live log: a compacted segment's records all lie below the watermark (they stand for
records already exported), so exporting it adds a marker and no records.

Readers take the history below the watermark and the live log at and above it. Because
every exporter writes its markers before the swap or prune that deletes the segments,
a reader that lists the live segments first and reads the markers second never misses
a record and never sees one twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from persistence.errors import LogError

DECLARATION = "history.json"
DEFAULT_DIR = "history"
EXPORTS_DIR = "_exports"
FORMAT = 1
DATA_SUFFIX = ".parquet"
MARKER_SUFFIX = ".json"
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000  # Kafka's retention.ms
MS_PER_DAY = 86_400_000


class _Segment(Protocol):
    """What the fingerprint is made of (persistence.segments.SegmentState has it)."""

    @property
    def name(self) -> str: ...

    size: int
    last_frame_crc: int | None


def fingerprint(name: str, size: int, last_frame_crc: int | None) -> str:
    """``<base>-<size>-<crc>`` of a segment named ``<base>.log`` (or any ``<base>.*``)."""
    base = name.split(".", 1)[0]
    crc = "empty" if last_frame_crc is None else str(last_frame_crc)
    return f"{base}-{size}-{crc}"


def day_of(timestamp_ms: int) -> str:
    """The UTC day a record's timestamp falls on: its history partition."""
    try:
        moment = datetime.fromtimestamp(timestamp_ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "1970-01-01" if timestamp_ms < 0 else "9999-12-31"
    return moment.strftime("%Y-%m-%d")


# -- the declaration -------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryConfig:
    """Where a data directory's history lives and how long it is kept (-1: forever)."""

    root: str  # absolute
    retention_ms: int


def declaration_path(data_dir: str) -> str:
    return os.path.join(data_dir, DECLARATION)


def resolve_dir(data_dir: str, directory: str | None) -> str:
    """The history root for a ``--history-dir`` value (None: the default, in DATA)."""
    chosen = directory or DEFAULT_DIR
    return os.path.abspath(chosen if os.path.isabs(chosen) else os.path.join(data_dir, chosen))


def read_declaration(data_dir: str) -> HistoryConfig | None:
    """The data directory's history, or None when it keeps none. Raises LogError for a
    declaration that cannot be read."""
    path = declaration_path(data_dir)
    try:
        with open(path, "rb") as f:
            document: Any = json.loads(f.read())
        if document.get("format") != FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        root = str(document["dir"])
        retention = int(document["retention_ms"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogError(f"{path} is not a valid history declaration: {exc}") from None
    return HistoryConfig(resolve_dir(data_dir, root), retention)


def write_declaration(data_dir: str, config: HistoryConfig) -> None:
    """Declare (atomically) that ``data_dir`` keeps its history at ``config.root``. The
    path is stored relative to DATA when it lies inside it, so the directory can move."""
    inside = os.path.relpath(config.root, os.path.abspath(data_dir))
    stored = inside if not inside.startswith("..") else config.root
    document = {"format": FORMAT, "dir": stored, "retention_ms": config.retention_ms}
    write_json_atomically(declaration_path(data_dir), document)


def remove_declaration(data_dir: str) -> bool:
    """Stop keeping a history (the files already written stay). True if there was one."""
    try:
        os.unlink(declaration_path(data_dir))
    except FileNotFoundError:
        return False
    fsync_dir(data_dir)
    return True


# -- markers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportedFile:
    path: str  # relative to the history root
    day: str
    records: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class SegmentExport:
    """One segment's export marker."""

    partition: int
    segment: str  # the fingerprint
    first_offset: int | None  # the segment's own first and last offsets
    last_offset: int | None
    records: int  # how many of them the history took (those at or above the watermark)
    files: tuple[ExportedFile, ...] = ()
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    exported_at: int = 0

    @property
    def covered_end(self) -> int:
        """One past the highest offset this export accounts for (0 if none)."""
        return 0 if self.last_offset is None else self.last_offset + 1

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["format"] = FORMAT
        return document

    @classmethod
    def from_json(cls, document: Any) -> SegmentExport:
        if document.get("format") != FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        files = tuple(ExportedFile(**f) for f in document["files"])
        fields = {k: v for k, v in document.items() if k not in ("format", "files")}
        return cls(files=files, **fields)


def exports_dir(root: str, partition: int) -> str:
    return os.path.join(root, EXPORTS_DIR, str(partition))


def marker_path(root: str, partition: int, segment: str) -> str:
    return os.path.join(exports_dir(root, partition), segment + MARKER_SUFFIX)


def data_path(root: str, partition: int, day: str, segment: str) -> str:
    return os.path.join(root, f"state_partition={partition}", f"day={day}", segment + DATA_SUFFIX)


def read_exports(root: str, partition: int) -> list[SegmentExport]:
    """Every export marker of a state partition, by first offset. A marker that cannot
    be read raises LogError: the history would silently lose records otherwise."""
    directory = exports_dir(root, partition)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    exports = []
    for name in names:
        if not name.endswith(MARKER_SUFFIX) or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                exports.append(SegmentExport.from_json(json.loads(f.read())))
        except FileNotFoundError:
            continue  # expired by retention meanwhile
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LogError(f"{path} is not a valid history export marker: {exc}") from None
    return sorted(exports, key=lambda e: (e.first_offset is None, e.first_offset or 0))


def watermark(exports: Iterable[SegmentExport]) -> int:
    """The offset below which the history holds every record it will ever hold."""
    return max((e.covered_end for e in exports), default=0)


def write_marker(root: str, export: SegmentExport) -> None:
    directory = exports_dir(root, export.partition)
    make_dirs(directory)
    write_json_atomically(marker_path(root, export.partition, export.segment), export.to_json())


class HistoryIndex:
    """What the daemon's prune asks: does the history hold this segment yet?"""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config

    @classmethod
    def load(cls, data_dir: str) -> HistoryIndex | None:
        config = read_declaration(data_dir)
        return None if config is None else cls(config)

    def holds(self, partition: int, segment: _Segment) -> bool:
        """Whether the segment was exported: its marker exists."""
        name = fingerprint(segment.name, segment.size, segment.last_frame_crc)
        return os.path.exists(marker_path(self.config.root, partition, name))


# -- retention -------------------------------------------------------------------------


@dataclass
class Expired:
    days: list[str] = field(default_factory=list)  # "<p>/<day>" directories removed
    markers: int = 0


def expire(
    root: str, data_dir: str, partitions: Sequence[int], now_ms: int, retention_ms: int
) -> Expired:
    """Delete the day directories wholly older than the retention, then the markers of
    segments no longer in the live log whose files are all gone, except the marker
    holding each partition's watermark (readers and exporters need it to know where the
    history ends). A live segment's marker stays: it is what lets a prune delete it."""
    result = Expired()
    if retention_ms < 0:
        return result
    oldest_kept = day_of(now_ms - retention_ms)
    for partition in partitions:
        partition_root = os.path.join(root, f"state_partition={partition}")
        try:
            days = sorted(os.listdir(partition_root))
        except FileNotFoundError:
            days = []
        for entry in days:
            if entry.startswith("day=") and entry[4:] < oldest_kept:
                shutil.rmtree(os.path.join(partition_root, entry), ignore_errors=True)
                result.days.append(f"{partition}/{entry[4:]}")
        exports = read_exports(root, partition)
        if not exports:
            continue
        top = max(exports, key=lambda e: e.covered_end)
        live = _live_fingerprints(os.path.join(data_dir, "partitions", str(partition)))
        for export in exports:
            if export is top or _prefix(export.segment) in live:
                continue
            if all(not os.path.exists(os.path.join(root, f.path)) for f in export.files):
                try:
                    os.unlink(marker_path(root, partition, export.segment))
                    result.markers += 1
                except FileNotFoundError:
                    pass
    return result


def _prefix(segment: str) -> str:
    """``<base>-<size>-`` of a fingerprint."""
    base, size, _ = segment.split("-", 2)
    return f"{base}-{size}-"


def _live_fingerprints(partition_dir: str) -> set[str]:
    """The base and size part of each live segment's fingerprint (a segment's size is
    enough to tell it from the compaction output that took its name)."""
    try:
        names = os.listdir(partition_dir)
    except FileNotFoundError:
        return set()
    live = set()
    for name in names:
        if name.endswith(".log"):
            try:
                size = os.stat(os.path.join(partition_dir, name)).st_size
            except FileNotFoundError:
                continue
            live.add(f"{name.split('.', 1)[0]}-{size}-")
    return live


# -- small file helpers (plain os: these files are not the log) --------------------------


def make_dirs(directory: str) -> None:
    """Create a directory and its missing parents, each made durable in its parent."""
    missing = []
    current = os.path.abspath(directory)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        fsync_dir(os.path.dirname(path))


def temp_name(path: str) -> str:
    """A temporary name beside ``path``, unique per writer (two exporters of the same
    segment must not write into one temporary file), hidden from Spark's listing."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")


def publish(temp: str, path: str) -> None:
    """fsync a finished temporary file and rename it into place, durably."""
    fd = os.open(temp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_dir(os.path.dirname(path))


def write_json_atomically(path: str, document: Any) -> None:
    temp = temp_name(path)
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        publish(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
