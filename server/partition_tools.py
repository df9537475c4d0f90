"""``sharecoord partition export | import | adopt``: moving a state partition from one
node to another (docs/operations.md#moving-a-state-partition).

**export** takes DATA/LOCK (the source daemon must be stopped), recovers the partition
as the daemon would (its frames still only in the journal are written into its files
first, a torn tail is cut), checks that every record replays, copies its segments into
a new directory with an ``EXPORT`` manifest (name, size and CRC-32 of each segment, the
offsets, the record count) and, when the data directory keeps a history, the
partition's history files below ``history/`` (listed likewise: path, size, CRC-32),
reads the copy back against the manifest, and only then
marks the source's OWNER as exported: from then on the source node refuses to serve it
(answers 15), even if its cluster file still gives it the partition.

**import** checks an export against its manifest (sizes, CRCs, every frame, every record
replays), takes the target's DATA/LOCK (the target daemon must be stopped), places the
segments as DATA/partitions/<p> with an OWNER naming the target node (after the
history files, into the target's history: records first, export markers last), records in
CHECKPOINT that the partition's files start afresh (no older journal frame of it is
ever applied to them) and in DATA/ASSIGNMENT that this node holds it. It refuses a
target that already holds records of the partition, or whose journal still holds
records of it that are in no file (the target crashed while it held the partition, and
its directory is gone): the import would drop them. After a clean stop (SIGTERM) the
journal holds nothing that the files lack.

**adopt** tells a node to serve partitions its data directory would refuse (moved here
although nobody held state for them, a copy made by hand, an export never imported):
it stamps them as this node's, creating any that is missing, empty.

Everything here is blocking file work; the CLI runs it. Errors are ``ToolError`` with
the exit code (2 usage, 1 failed) and one line.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from persistence import FileOps, LogError, StateLog, partition_dir, read_meta
from persistence.fileops import create_file_durably
from persistence.history import EXPORTS_DIR, read_declaration, resolve_dir
from persistence.ownership import (
    UNKNOWN,
    Assignment,
    Owner,
    absent_by_design,
    create_partition_dir,
    holds_records,
    now_ms,
    read_assignment,
    read_owner,
    write_assignment,
    write_owner,
)
from persistence.segments import list_log_files, scan_partition
from server.tools import replay_problem

EXPORT_FILE = "EXPORT"
HISTORY_DIR = "history"  # in an export: the partition's history, as below its root
EXPORT_FORMAT = 1
EXIT_FAILURE = 1
EXIT_USAGE = 2
_CHUNK = 1 << 20


class ToolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SegmentCopy:
    name: str
    size: int
    crc32: int


@dataclass(frozen=True)
class HistoryCopy:
    """One file of the partition's history: its path below the history root (and below
    the export's ``history`` directory), size and CRC-32."""

    path: str
    size: int
    crc32: int


@dataclass(frozen=True)
class ExportManifest:
    partition: int
    num_partitions: int
    source_node: int | None
    assignment: str
    exported_ms: int
    log_start_offset: int
    log_end_offset: int
    records: int
    segments: tuple[SegmentCopy, ...]
    # Empty when the source kept no history (and in exports made before it travelled).
    history: tuple[HistoryCopy, ...] = ()

    def to_json(self) -> bytes:
        document = {"format": EXPORT_FORMAT, **asdict(self)}
        return json.dumps(document, indent=1).encode() + b"\n"

    @classmethod
    def load(cls, directory: str) -> ExportManifest:
        path = os.path.join(directory, EXPORT_FILE)
        try:
            with open(path, "rb") as f:
                document: Any = json.loads(f.read())
            if document.get("format") != EXPORT_FORMAT:
                raise ValueError(f"unknown format {document.get('format')!r}")
            fields = {k: document[k] for k in cls.__dataclass_fields__ if k != "history"}
            fields["segments"] = tuple(SegmentCopy(**s) for s in document["segments"])
            history = tuple(HistoryCopy(**h) for h in document.get("history", ()))
            manifest = cls(**fields, history=history)
            if not all(isinstance(v, int) for v in _ints(manifest)):
                raise ValueError("a number field is not an integer")
            for copy in history:
                _check_history_path(copy.path, manifest.partition)
            return manifest
        except FileNotFoundError:
            raise ToolError(
                EXIT_USAGE, f"--from {directory} is not a partition export: {path} is missing"
            ) from None
        except IsADirectoryError:
            raise ToolError(EXIT_USAGE, f"--from {directory}: {path} is a directory") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ToolError(EXIT_USAGE, f"{path} is not a valid export manifest: {exc}") from None


def _ints(manifest: ExportManifest) -> Iterable[object]:
    yield from (manifest.partition, manifest.num_partitions, manifest.exported_ms)
    yield from (manifest.log_start_offset, manifest.log_end_offset, manifest.records)
    for segment in manifest.segments:
        yield from (segment.size, segment.crc32)
    for copy in manifest.history:
        yield from (copy.size, copy.crc32)


def _check_history_path(path: object, partition: int) -> None:
    """A history path of the manifest names a file of this partition's history, below
    the root: an export cannot make an import write anywhere else."""
    if not isinstance(path, str):
        raise ValueError(f"history path {path!r} is not text")
    parts = path.split("/")
    mine = (f"state_partition={partition}",), (EXPORTS_DIR, str(partition))
    if (
        os.path.isabs(path)
        or any(part in ("", ".", "..") for part in parts)
        or not any(tuple(parts[: len(prefix)]) == prefix for prefix in mine)
        or len(parts) < 3
    ):
        raise ValueError(f"history path {path!r} is not a file of state partition {partition}")


# --- export ------------------------------------------------------------------------------


def export_partition(
    data_dir: str, partition: int, out: str, *, fs: FileOps | None = None
) -> ExportManifest:
    fs = fs or FileOps()
    num_partitions = _num_partitions(data_dir)
    _check_partition(partition, num_partitions)
    out = os.path.abspath(out)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ToolError(EXIT_USAGE, f"--out {out} exists and is not an empty directory")
    if not os.path.isdir(os.path.dirname(out)):
        raise ToolError(EXIT_USAGE, f"--out {out}: {os.path.dirname(out)} is not a directory")
    elsewhere = absent_by_design(fs, data_dir, partition)
    if elsewhere is not None:
        raise ToolError(EXIT_FAILURE, f"state partition {partition} is {elsewhere}")
    log = _open_locked(data_dir, num_partitions, {partition}, fs)
    try:
        directory = partition_dir(data_dir, partition)
        owner = _owner_or_none(fs, directory)
        if owner is not None and owner.exported_ms is not None:
            raise ToolError(
                EXIT_FAILURE,
                f"state partition {partition} was already exported from {data_dir}; its "
                "first export holds its state (or `sharecoord partition adopt` it back here "
                "before exporting it again)",
            )
        part = log.partition(partition)
        try:
            report = part.open()  # recovery: journal frames are in its files by now
        except LogError as exc:
            raise ToolError(EXIT_FAILURE, f"state partition {partition}: {exc}") from None
        problem = replay_problem(directory)
        if problem is not None:
            raise ToolError(EXIT_FAILURE, f"state partition {partition} does not replay: {problem}")
        recorded = read_assignment(fs, data_dir)
        node = owner.node_id if owner is not None else (recorded.node_id if recorded else None)
        segments = [(s.base_offset, s.path) for s in part.segments]
        manifest = ExportManifest(
            partition,
            num_partitions,
            node,
            owner.assignment if owner is not None else "",
            now_ms(),
            report.log_start_offset,
            report.log_end_offset,
            report.record_count,
            (),
        )
        partial = out + ".partial"
        copies = _copy_segments(fs, [path for _, path in segments], partial)
        history = _copy_history(fs, data_dir, partition, os.path.join(partial, HISTORY_DIR))
        manifest = replace(manifest, segments=tuple(copies), history=tuple(history))
        create_file_durably(fs, os.path.join(partial, EXPORT_FILE), manifest.to_json())
        if os.path.isdir(out):
            os.rmdir(out)  # the empty directory it was given
        fs.rename(partial, out)
        fs.fsync_dir(os.path.dirname(out))
        check_export(out, manifest)
        # Handed over: the source refuses it from now on, whatever its cluster file says.
        stamp = owner or Owner(node if node is not None else UNKNOWN, "", "migrated", now_ms())
        write_owner(fs, directory, replace(stamp, exported_ms=manifest.exported_ms))
    finally:
        log.close()
    return manifest


def _copy_segments(fs: FileOps, paths: list[str], target: str) -> list[SegmentCopy]:
    if os.path.exists(target):
        _remove_tree(target)  # a copy an earlier export left half done
    os.mkdir(target)
    copies = []
    for path in paths:
        size, crc = _copy_file(fs, path, os.path.join(target, os.path.basename(path)))
        copies.append(SegmentCopy(os.path.basename(path), size, crc))
    fs.fsync_dir(target)
    return copies


def _copy_file(fs: FileOps, path: str, destination: str) -> tuple[int, int]:
    """Copy and fsync a file (``destination`` must not exist); its size and CRC-32."""
    data_crc, size = 0, 0
    out_fd = fs.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with open(path, "rb") as source:
            while chunk := source.read(_CHUNK):
                fs.write_all(out_fd, chunk)
                data_crc = zlib.crc32(chunk, data_crc)
                size += len(chunk)
        fs.fsync(out_fd)
    finally:
        fs.close(out_fd)
    return size, data_crc


def _history_root(data_dir: str) -> str | None:
    """Where the data directory keeps its history, or None when it keeps none."""
    try:
        config = read_declaration(data_dir)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None
    return config.root if config is not None else None


def _history_files(root: str, partition: int) -> list[str]:
    """The partition's history files, as paths below the root: its records first, its
    export markers after them (a marker counts only once the files it names exist).
    The markers are listed before the records: a compaction exporting meanwhile writes
    a marker after its files, so every marker listed has its files listed too."""

    def listed(top: str) -> list[str]:
        found = []
        for directory, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(names):
                if not name.startswith("."):  # a writer's temporary file
                    path = os.path.relpath(os.path.join(directory, name), root)
                    found.append(path.replace(os.sep, "/"))
        return found

    markers = listed(f"{EXPORTS_DIR}/{partition}")
    return listed(f"state_partition={partition}") + markers


def _copy_history(fs: FileOps, data_dir: str, partition: int, target: str) -> list[HistoryCopy]:
    """The partition's history (when the data directory keeps one) copied below
    ``target``: an audit on the new owner still finds what compaction folded here."""
    root = _history_root(data_dir)
    if root is None:
        return []
    copies = []
    for path in _history_files(root, partition):
        destination = os.path.join(target, *path.split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        size, crc = _copy_file(fs, os.path.join(root, *path.split("/")), destination)
        copies.append(HistoryCopy(path, size, crc))
    for directory, _, _ in os.walk(target, topdown=False):
        fs.fsync_dir(directory)
    return copies


# --- checking an export ----------------------------------------------------------------------


def check_export(directory: str, manifest: ExportManifest | None = None) -> ExportManifest:
    """The export's files are exactly what its manifest lists, every frame verifies,
    the offsets and the record count are the manifest's, and every record replays."""
    manifest = manifest or ExportManifest.load(directory)
    fs = FileOps()

    def damaged(what: str) -> ToolError:
        return ToolError(EXIT_FAILURE, f"the export in {directory} is damaged: {what}")

    listed = {segment.name for segment in manifest.segments}
    found = {os.path.basename(path) for _, path in list_log_files(fs, directory)}
    if found != listed:
        raise damaged(f"its segments are {sorted(found)}, the manifest lists {sorted(listed)}")
    for segment in manifest.segments:
        size, crc = _size_and_crc(os.path.join(directory, segment.name))
        if (size, crc) != (segment.size, segment.crc32):
            raise damaged(
                f"{segment.name} has {size} bytes and CRC-32 {crc:#010x}; the manifest says "
                f"{segment.size} and {segment.crc32:#010x}"
            )
    history = os.path.join(directory, HISTORY_DIR)
    listed = {copy.path for copy in manifest.history}
    found = set()
    for place, _, names in os.walk(history):
        found |= {
            os.path.relpath(os.path.join(place, n), history).replace(os.sep, "/") for n in names
        }
    if found != listed:
        missing, extra = sorted(listed - found), sorted(found - listed)
        raise damaged(
            f"its history lacks {missing} and has {extra} that the manifest does not list"
        )
    for copy in manifest.history:
        size, crc = _size_and_crc(os.path.join(history, *copy.path.split("/")))
        if (size, crc) != (copy.size, copy.crc32):
            raise damaged(
                f"history file {copy.path} has {size} bytes and CRC-32 {crc:#010x}; the "
                f"manifest says {copy.size} and {copy.crc32:#010x}"
            )
    records, last = 0, None
    for scan in scan_partition(fs, list_log_files(fs, directory)):
        if scan.damage is not None:
            raise damaged(f"{scan.path}: byte {scan.damage.position}: {scan.damage.reason}")
        records += scan.record_count
        last = scan.last_offset if scan.last_offset is not None else last
    if records != manifest.records or (last is not None and last >= manifest.log_end_offset):
        raise damaged(
            f"{records} records up to offset {last}; the manifest says {manifest.records} "
            f"records below offset {manifest.log_end_offset}"
        )
    problem = replay_problem(directory)
    if problem is not None:
        raise damaged(f"a record does not replay: {problem}")
    return manifest


def _size_and_crc(path: str) -> tuple[int, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


# --- import ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Imported:
    manifest: ExportManifest
    node: int  # the node the partition now belongs to
    history_root: str | None  # where its history went (None: the export had none)
    history_declared: bool  # whether this data directory keeps a history yet


def import_partition(
    data_dir: str, source: str, node_id: int | None, *, fs: FileOps | None = None
) -> Imported:
    fs = fs or FileOps()
    if not os.path.isdir(source):
        raise ToolError(EXIT_USAGE, f"--from {source} is not a directory")
    manifest = check_export(source)
    partition, num_partitions = manifest.partition, manifest.num_partitions
    fresh = not os.path.exists(os.path.join(data_dir, "meta"))
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise ToolError(EXIT_USAGE, f"--data-dir {data_dir} is not a directory")
    if not fresh:
        found = _num_partitions(data_dir)
        if found != num_partitions:
            raise ToolError(
                EXIT_FAILURE,
                f"{data_dir} has {found} state partitions, the export comes from a data "
                f"directory with {num_partitions}: a partition cannot move between them",
            )
    recorded = None if fresh else _assignment(fs, data_dir)
    node = _node(recorded, node_id, data_dir)
    if fresh:
        # A new data directory: its record first, then meta (its commit point, written
        # by the open). Nobody held any partition here before; the daemon creates the
        # others when it first starts.
        os.makedirs(data_dir, exist_ok=True)
        recorded = Assignment(node, "imported", (UNKNOWN,) * num_partitions)
        write_assignment(fs, data_dir, recorded)
    log = _open_locked(data_dir, num_partitions, set(), fs)
    try:
        target = partition_dir(data_dir, partition)
        if partition in log.held:
            # The open wrote every frame it could into the partition's own directory;
            # these it could not (the directory is gone or another node's). The import
            # would start the partition's CHECKPOINT entry past them: they would be lost.
            raise ToolError(
                EXIT_FAILURE,
                f"the journal of {data_dir} still holds records of state partition "
                f"{partition} that are in no file here (this node wrote them and did not "
                "stop cleanly, and the partition's directory is gone or another node's): "
                "put the directory back, start the daemon and stop it with SIGTERM, then "
                "import again",
            )
        if os.path.exists(target) and holds_records(fs, target):
            raise ToolError(
                EXIT_FAILURE,
                f"{target} already holds records of state partition {partition}: move it "
                "aside first (it is this node's older copy, or another import)",
            )
        history_root = _place_history(fs, data_dir, source, manifest)
        staging = os.path.join(data_dir, "partitions", f".import-{partition}")
        copies = _copy_segments(
            fs, [os.path.join(source, s.name) for s in manifest.segments], staging
        )
        if [c.crc32 for c in copies] != [s.crc32 for s in manifest.segments]:
            raise ToolError(EXIT_FAILURE, f"{source} changed while it was copied; run again")
        fingerprint = recorded.fingerprint if recorded is not None else "imported"
        write_owner(fs, staging, Owner(node, fingerprint, "imported", now_ms()))
        if os.path.exists(target):
            _remove_tree(target)  # an empty directory: nothing of it is lost
        fs.rename(staging, target)
        fs.fsync_dir(os.path.dirname(target))
        last = manifest.segments[-1] if manifest.segments else None
        base = int(last.name.split(".")[0]) if last is not None else manifest.log_end_offset
        size = last.size if last is not None else 0
        log.record_replaced(partition, (base, size, manifest.log_end_offset))
        if recorded is not None:  # else a directory no daemon of this version ran on yet
            owners = list(recorded.owners)
            owners[partition] = node
            write_assignment(fs, data_dir, replace(recorded, owners=tuple(owners)))
    finally:
        log.close()
    return Imported(manifest, node, history_root, _history_root(data_dir) is not None)


def _place_history(fs: FileOps, data_dir: str, source: str, manifest: ExportManifest) -> str | None:
    """The export's history, into the history this data directory keeps (or where it
    would keep one by default, DATA/history, for its first compaction to find), before
    the partition itself: its records first, its export markers last. A file already
    there with the same bytes is kept; one with other bytes stops the import before
    anything is written."""
    if not manifest.history:
        return None
    root = _history_root(data_dir) or resolve_dir(data_dir, None)
    to_copy = []
    for copy in manifest.history:
        destination = os.path.join(root, *copy.path.split("/"))
        if not os.path.exists(destination):
            to_copy.append((copy, destination))
        elif _size_and_crc(destination) != (copy.size, copy.crc32):
            raise ToolError(
                EXIT_FAILURE,
                f"{destination} already exists with other contents than the export's: "
                f"the history of state partition {manifest.partition} there is another "
                "copy's; move it aside first",
            )
    touched = set()
    # The markers last, whatever order the manifest lists them in.
    to_copy.sort(key=lambda pair: pair[0].path.startswith(f"{EXPORTS_DIR}/"))
    for copy, destination in to_copy:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        temp = os.path.join(
            os.path.dirname(destination), f".import-{os.path.basename(destination)}"
        )
        if os.path.exists(temp):
            os.unlink(temp)  # an import that stopped half way
        source_path = os.path.join(source, HISTORY_DIR, *copy.path.split("/"))
        if _copy_file(fs, source_path, temp) != (copy.size, copy.crc32):
            os.unlink(temp)
            raise ToolError(EXIT_FAILURE, f"{source} changed while it was copied; run again")
        fs.rename(temp, destination)
        touched.add(os.path.dirname(destination))
    for directory in sorted(touched, key=len, reverse=True):
        fs.fsync_dir(directory)
    return root


# --- adopt -------------------------------------------------------------------------------


def adopt_partitions(
    data_dir: str, partitions: list[int], node_id: int | None, *, fs: FileOps | None = None
) -> list[str]:
    """One line per partition saying what was done."""
    fs = fs or FileOps()
    num_partitions = _num_partitions(data_dir)
    for partition in partitions:
        _check_partition(partition, num_partitions)
    recorded = _assignment(fs, data_dir)
    node = _node(recorded, node_id, data_dir)
    log = _open_locked(data_dir, num_partitions, set(), fs)
    lines = []
    try:
        stamp = Owner(node, recorded.fingerprint if recorded else "adopted", "adopted", now_ms())
        owners = list(recorded.owners) if recorded is not None else None
        for partition in partitions:
            directory = partition_dir(data_dir, partition)
            if os.path.exists(directory):
                before = _owner_or_none(fs, directory)
                write_owner(fs, directory, stamp)
                kept = "its records" if holds_records(fs, directory) else "no records"
                was = "" if before is None else f", was node {before.node_id}'s"
                exported = " and exported" if before and before.exported_ms else ""
                lines.append(
                    f"state partition {partition}: adopted as node {node}'s with {kept}"
                    f"{was}{exported}"
                )
            else:
                create_partition_dir(fs, data_dir, partition, stamp)
                lines.append(f"state partition {partition}: created empty as node {node}'s")
            if owners is not None:
                owners[partition] = node
        if recorded is not None and owners is not None:
            write_assignment(fs, data_dir, replace(recorded, owners=tuple(owners)))
    finally:
        log.close()
    return lines


# --- shared ------------------------------------------------------------------------------


def _num_partitions(data_dir: str) -> int:
    if not os.path.isdir(data_dir):
        raise ToolError(EXIT_USAGE, f"--data-dir {data_dir} is not a directory")
    try:
        return int(read_meta(data_dir)["num_partitions"])
    except LogError as exc:
        raise ToolError(EXIT_USAGE, str(exc)) from None
    except OSError as exc:  # a meta that is a directory, or cannot be read
        raise ToolError(EXIT_USAGE, f"--data-dir {data_dir}: {exc.strerror or exc}") from None


def _check_partition(partition: int, num_partitions: int) -> None:
    if not 0 <= partition < num_partitions:
        raise ToolError(
            EXIT_USAGE,
            f"--partition {partition} is out of range 0..{num_partitions - 1}",
        )


def _assignment(fs: FileOps, data_dir: str) -> Assignment | None:
    try:
        return read_assignment(fs, data_dir)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None


def _owner_or_none(fs: FileOps, directory: str) -> Owner | None:
    if not os.path.isdir(directory):
        return None
    try:
        return read_owner(fs, directory)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None


def _node(recorded: Assignment | None, node_id: int | None, data_dir: str) -> int:
    """The node a data directory belongs to: its record, or --node-id when it has none."""
    if recorded is None:
        if node_id is None:
            raise ToolError(
                EXIT_USAGE,
                f"{data_dir} does not record its node yet: give --node-id (the node that "
                "will serve it)",
            )
        return node_id
    if node_id is not None and node_id != recorded.node_id:
        raise ToolError(
            EXIT_USAGE,
            f"{data_dir} is the data directory of node {recorded.node_id}, not of node "
            f"{node_id} (--node-id)",
        )
    return recorded.node_id


def _open_locked(data_dir: str, num_partitions: int, only: set[int], fs: FileOps) -> StateLog:
    try:
        return StateLog.open(data_dir, num_partitions, only=only, fs=fs)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None


def _remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)
