"""``sharecoord partition export | adopt``, and what ``import`` (partition_import.py)
shares with them: moving a state partition from one node to another
(docs/operations.md#moving-a-state-partition).

**export** takes DATA/LOCK (the source daemon must be stopped), recovers the partition
as the daemon would (its frames still only in the journal are written into its files
first, a torn tail is cut), checks that every record replays, copies its segments into
a new directory with an ``EXPORT`` manifest (export_manifest.py: name, size and CRC-32
of each segment, the offsets, the record count) and, when the data directory keeps a
history, the partition's history files below ``history/`` (listed likewise: path,
size, CRC-32), reads the copy back against the manifest, and only then marks the
source's OWNER as exported: from then on the source node refuses to serve it (answers
15), even if its cluster file still gives it the partition.

**check_export** is what an import trusts an export by: its files are exactly those
the manifest lists, with their sizes and CRCs, every frame verifies and every record
replays.

**adopt** tells a node to serve partitions its data directory would refuse (moved here
although nobody held state for them, a copy made by hand, an export never imported):
it stamps them as this node's, creating any that is missing, empty.

Everything here is blocking file work; the CLI runs it. Errors are ``ToolError`` with
the exit code (2 usage, 1 failed) and one line.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import replace

from persistence import FileOps, LogError, StateLog, partition_dir, read_meta
from persistence.fileops import create_file_durably
from persistence.history import EXPORTS_DIR, read_declaration
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
from server.export_manifest import (
    EXPORT_FILE,
    HISTORY_DIR,
    ExportManifest,
    HistoryCopy,
    ManifestError,
    SegmentCopy,
    read_manifest,
)
from server.tools import replay_problem

EXIT_FAILURE = 1
EXIT_USAGE = 2
_CHUNK = 1 << 20


class ToolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def load_export(directory: str) -> ExportManifest:
    """The manifest of the export in ``directory``, every field checked: a ToolError
    (exit 2) naming the field that breaks the format."""
    path = os.path.join(directory, EXPORT_FILE)
    try:
        return read_manifest(directory)
    except FileNotFoundError:
        raise ToolError(
            EXIT_USAGE, f"--from {directory} is not a partition export: {path} is missing"
        ) from None
    except IsADirectoryError:
        raise ToolError(EXIT_USAGE, f"--from {directory}: {path} is a directory") from None
    except OSError as exc:
        raise ToolError(EXIT_USAGE, f"{path} cannot be read: {exc.strerror or exc}") from None
    except ManifestError as exc:
        raise ToolError(EXIT_USAGE, f"{path} is not a valid export manifest: {exc}") from None


# --- export ------------------------------------------------------------------------------


def export_partition(
    data_dir: str, partition: int, out: str, *, fs: FileOps | None = None
) -> ExportManifest:
    fs = fs or FileOps()
    num_partitions = num_partitions_of(data_dir)
    _check_partition(partition, num_partitions)
    out = os.path.abspath(out)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ToolError(EXIT_USAGE, f"--out {out} exists and is not an empty directory")
    if not os.path.isdir(os.path.dirname(out)):
        raise ToolError(EXIT_USAGE, f"--out {out}: {os.path.dirname(out)} is not a directory")
    elsewhere = absent_by_design(fs, data_dir, partition)
    if elsewhere is not None:
        raise ToolError(EXIT_FAILURE, f"state partition {partition} is {elsewhere}")
    log = open_locked(data_dir, num_partitions, {partition}, fs)
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
        copies = copy_segments(fs, [path for _, path in segments], partial)
        history = _copy_history(fs, data_dir, partition, os.path.join(partial, HISTORY_DIR))
        manifest = replace(manifest, segments=tuple(copies), history=tuple(history))
        publish_export(fs, partial, out, manifest)
        # Handed over: the source refuses it from now on, whatever its cluster file says.
        stamp = owner or Owner(node if node is not None else UNKNOWN, "", "migrated", now_ms())
        write_owner(fs, directory, replace(stamp, exported_ms=manifest.exported_ms))
    finally:
        log.close()
    return manifest


def copy_segments(fs: FileOps, paths: list[str], target: str) -> list[SegmentCopy]:
    if os.path.exists(target):
        remove_tree(target)  # a copy an earlier export left half done
    os.mkdir(target)
    copies = []
    for path in paths:
        size, crc = copy_file(fs, path, os.path.join(target, os.path.basename(path)))
        copies.append(SegmentCopy(os.path.basename(path), size, crc))
    fs.fsync_dir(target)
    return copies


def copy_file(fs: FileOps, path: str, destination: str) -> tuple[int, int]:
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


def history_root(data_dir: str) -> str | None:
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
    root = history_root(data_dir)
    if root is None:
        return []
    copies = []
    for path in _history_files(root, partition):
        destination = os.path.join(target, *path.split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        size, crc = copy_file(fs, os.path.join(root, *path.split("/")), destination)
        copies.append(HistoryCopy(path, size, crc))
    for directory, _, _ in os.walk(target, topdown=False):
        fs.fsync_dir(directory)
    return copies


# --- checking an export ----------------------------------------------------------------------


def publish_export(fs: FileOps, partial: str, out: str, manifest: ExportManifest) -> None:
    """Finish an export made in `partial`: its manifest written durably, the directory
    renamed to `out` (the empty directory it was given, if any, replaced) and read back
    against the manifest."""
    create_file_durably(fs, os.path.join(partial, EXPORT_FILE), manifest.to_json())
    if os.path.isdir(out):
        os.rmdir(out)  # the empty directory it was given
    fs.rename(partial, out)
    fs.fsync_dir(os.path.dirname(out))
    check_export(out, manifest)


def check_export(directory: str, manifest: ExportManifest | None = None) -> ExportManifest:
    """The export's files are exactly what its manifest lists, every frame verifies,
    the offsets and the record count are the manifest's, and every record replays."""
    manifest = manifest or load_export(directory)
    fs = FileOps()

    def damaged(what: str) -> ToolError:
        return ToolError(EXIT_FAILURE, f"the export in {directory} is damaged: {what}")

    listed = {segment.name for segment in manifest.segments}
    found = {os.path.basename(path) for _, path in list_log_files(fs, directory)}
    if found != listed:
        raise damaged(f"its segments are {sorted(found)}, the manifest lists {sorted(listed)}")
    for segment in manifest.segments:
        size, crc = size_and_crc(os.path.join(directory, segment.name))
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
        size, crc = size_and_crc(os.path.join(history, *copy.path.split("/")))
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


def size_and_crc(path: str) -> tuple[int, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


# --- adopt -------------------------------------------------------------------------------


def adopt_partitions(
    data_dir: str, partitions: list[int], node_id: int | None, *, fs: FileOps | None = None
) -> list[str]:
    """One line per partition saying what was done."""
    fs = fs or FileOps()
    num_partitions = num_partitions_of(data_dir)
    for partition in partitions:
        _check_partition(partition, num_partitions)
    recorded = assignment_of(fs, data_dir)
    node = node_of(recorded, node_id, data_dir)
    log = open_locked(data_dir, num_partitions, set(), fs)
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


def num_partitions_of(data_dir: str) -> int:
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


def assignment_of(fs: FileOps, data_dir: str) -> Assignment | None:
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


def node_of(recorded: Assignment | None, node_id: int | None, data_dir: str) -> int:
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


def open_locked(data_dir: str, num_partitions: int, only: set[int], fs: FileOps) -> StateLog:
    try:
        return StateLog.open(data_dir, num_partitions, only=only, fs=fs)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None


def remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)
