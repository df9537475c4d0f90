"""``sharecoord partition import``: an export made on another node becomes this node's
state partition (docs/operations.md#moving-a-state-partition).

Every check comes before the first write, cheapest first, so that a refused import
leaves the data directory exactly as it was, byte for byte:

1. the manifest, every field (export_manifest.py): exit 2;
2. the target, read-only: its meta (partition count), its node (ASSIGNMENT or
   --node-id), that it holds no records of the partition, that its journal holds none
   that are in no file (the target crashed while it held the partition, and its
   directory is gone: the import would drop them; a clean stop (SIGTERM) leaves the
   journal nothing the files lack), and that the history files the export brings are
   not there with other bytes: exit 1 (2 for --node-id);
3. the export's bytes against the manifest: sizes, CRCs, every frame, every record
   replays (partition_tools.check_export): exit 1.

Then it takes DATA/LOCK (the target daemon must be stopped; a new data directory is
created first, with its ASSIGNMENT naming --node-id), checks 2 again under it, and
writes, in this order:

a. the segments and an OWNER naming this node, into DATA/partitions/.import-<p>;
b. the history files, into the history this data directory keeps (or DATA/history,
   where its first compaction finds them): records first, export markers last;
c. an empty DATA/partitions/<p> (it holds no records: checked) moved aside, to
   DATA/partitions/.import-<p>.replaced;
d. CHECKPOINT: the partition's entry starts at the journal's end, so that no older
   journal frame of it is ever laid over the new files;
e. DATA/ASSIGNMENT: this node holds the partition;
f. the commit point: DATA/partitions/.import-<p> renamed to DATA/partitions/<p>. Until
   this rename the daemon sees no imported record;
g. the directory moved aside in c removed.

A failure before f undoes what was done, in reverse order (a new data directory is
removed whole), so the data directory is as it was but for what opening it under the
lock does whenever anything opens it (the journal's recovery, the pid in LOCK). A
crash before f leaves the partition absent or empty, never half imported: the daemon
refuses or serves it as before, or, after d or e, refuses it as missing (it had
records, or this node holds it) until the import is run again. A rerun finishes the
job: it replaces a leftover .import-<p>, keeps history files with the export's bytes,
puts a directory moved aside in c back first (or removes it when DATA/partitions/<p>
is there again), and writes d and e anew. After f, a rerun finds the partition holding
this very export (its OWNER says imported for this node, its segments have the
manifest's names, sizes and CRC-32s): it only removes what a crash between f and g
left (.import-<p>.replaced, an empty partition directory) and says there was nothing
else to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from persistence import FileOps, LogError, StateLog, partition_dir
from persistence.history import EXPORTS_DIR, resolve_dir
from persistence.journal import JournalView
from persistence.ownership import (
    UNKNOWN,
    Assignment,
    Owner,
    holds_records,
    now_ms,
    read_owner,
    write_assignment,
    write_owner,
)
from persistence.segments import list_log_files
from persistence.statelog import META_FILE, PARTITIONS_DIR
from server.export_manifest import HISTORY_DIR, ExportManifest, HistoryCopy
from server.partition_tools import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ToolError,
    assignment_of,
    check_export,
    copy_file,
    copy_segments,
    history_root,
    load_export,
    node_of,
    num_partitions_of,
    open_locked,
    remove_tree,
    size_and_crc,
)

_log = logging.getLogger("sharecoord.tools")

Undo = Callable[[], None]


@dataclass(frozen=True)
class Imported:
    manifest: ExportManifest
    node: int  # the node the partition now belongs to
    history_root: str | None  # where its history went (None: the export had none)
    history_declared: bool  # whether this data directory keeps a history yet
    already: bool = False  # an import of this export had finished: nothing was done


@dataclass(frozen=True)
class _Target:
    """What the read-only checks found out about the data directory imported into."""

    fresh: bool  # no meta yet: the import creates the data directory
    recorded: Assignment | None  # its ASSIGNMENT (made up for a fresh one)
    node: int
    history_root: str | None  # where the export's history goes (None: it has none)
    history: tuple[tuple[HistoryCopy, str], ...]  # each file not there yet, and where
    done: bool  # the partition holds this export already: an import of it reached (f)


@dataclass
class _Progress:
    undo: list[Undo] = field(default_factory=list)
    committed: bool = False


def import_partition(
    data_dir: str, source: str, node_id: int | None, *, fs: FileOps | None = None
) -> Imported:
    fs = fs or FileOps()
    if not os.path.isdir(source):
        raise ToolError(EXIT_USAGE, f"--from {source} is not a directory")
    manifest = load_export(source)
    target = _check_target(fs, data_dir, manifest, node_id)
    if target.done:
        _finish_done(fs, data_dir, manifest.partition, manifest.num_partitions)
        declared = history_root(data_dir) is not None
        return Imported(manifest, target.node, target.history_root, declared, already=True)
    check_export(source, manifest)
    existed = sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else None
    progress = _Progress()
    try:
        if target.fresh:
            # A new data directory: its record first, then meta (its commit point, written
            # by the open). Nobody held any partition here before; the daemon creates the
            # others when it first starts.
            os.makedirs(data_dir, exist_ok=True)
            assert target.recorded is not None
            write_assignment(fs, data_dir, target.recorded)
        log = open_locked(data_dir, manifest.num_partitions, set(), fs)
        try:
            _place(fs, log, data_dir, source, manifest, target, progress)
        finally:
            log.close()
    except BaseException:
        if target.fresh and not progress.committed:
            _remove_created(data_dir, existed)
        raise
    return Imported(manifest, target.node, target.history_root, history_root(data_dir) is not None)


# --- the checks -------------------------------------------------------------------------


def _check_target(
    fs: FileOps, data_dir: str, manifest: ExportManifest, node_id: int | None
) -> _Target:
    """Step 2 of the module docstring: reads only."""
    if os.path.lexists(data_dir) and not os.path.isdir(data_dir):
        raise ToolError(EXIT_USAGE, f"--data-dir {data_dir} is not a directory")
    fresh = not os.path.lexists(os.path.join(data_dir, META_FILE))
    if not fresh:
        found = num_partitions_of(data_dir)
        if found != manifest.num_partitions:
            raise ToolError(
                EXIT_FAILURE,
                f"{data_dir} has {found} state partitions, the export comes from a data "
                f"directory with {manifest.num_partitions}: a partition cannot move between "
                "them",
            )
    recorded = None if fresh else assignment_of(fs, data_dir)
    node = node_of(recorded, node_id, data_dir)
    done = False
    if fresh:
        recorded = Assignment(node, "imported", (UNKNOWN,) * manifest.num_partitions)
    elif _holds_this_export(fs, partition_dir(data_dir, manifest.partition), manifest, node):
        done = True
    else:
        _refuse_records_there(fs, data_dir, manifest.partition, _journal_holds(fs, data_dir))
    root = _history_destination(data_dir, manifest)
    history = () if done or root is None else _history_to_copy(root, manifest)
    return _Target(fresh, recorded, node, root, history, done)


def _holds_this_export(fs: FileOps, directory: str, manifest: ExportManifest, node: int) -> bool:
    """Whether a partition directory is this export as an import placed it for this
    node: its OWNER says imported, and its segments are the manifest's, byte for byte
    (as far as names, sizes and CRC-32s tell). Nothing was written to it since."""
    try:
        owner = read_owner(fs, directory) if os.path.isdir(directory) else None
    except LogError:
        return False
    if owner is None or (owner.node_id, owner.origin, owner.exported_ms) != (
        node,
        "imported",
        None,
    ):
        return False
    files = list_log_files(fs, directory)
    if [os.path.basename(path) for _, path in files] != [s.name for s in manifest.segments]:
        return False
    return all(
        size_and_crc(path) == (segment.size, segment.crc32)
        for (_, path), segment in zip(files, manifest.segments, strict=True)
    )


def _finish_done(fs: FileOps, data_dir: str, partition: int, num_partitions: int) -> None:
    """A rerun of an import that reached its commit point: only step g may be left."""
    aside = os.path.join(data_dir, PARTITIONS_DIR, f".import-{partition}.replaced")
    if not os.path.lexists(aside):
        return
    log = open_locked(data_dir, num_partitions, set(), fs)  # the daemon must be stopped
    try:
        remove_tree(aside)
        fs.fsync_dir(os.path.dirname(aside))
    finally:
        log.close()


def _journal_holds(fs: FileOps, data_dir: str) -> Callable[[int], bool]:
    """Whether the journal holds frames of a partition that no checkpoint has synced:
    frames in no file, or not surely on disk there (read-only)."""
    try:
        journal = JournalView.load(data_dir, fs)
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, f"{data_dir}: the journal cannot be read: {exc}") from None
    return lambda partition: (
        journal is not None and next(journal.entries(partition), None) is not None
    )


def _refuse_records_there(
    fs: FileOps, data_dir: str, partition: int, journal_holds: Callable[[int], bool]
) -> None:
    target = partition_dir(data_dir, partition)
    if os.path.isdir(target) and holds_records(fs, target):
        raise ToolError(
            EXIT_FAILURE,
            f"{target} already holds records of state partition {partition}: move it "
            "aside first (it is this node's older copy, or another import)",
        )
    if journal_holds(partition):
        # The import would start the partition's CHECKPOINT entry past them: lost.
        raise ToolError(
            EXIT_FAILURE,
            f"the journal of {data_dir} still holds records of state partition {partition} "
            "that are in no file here (this node wrote them and did not stop cleanly): put "
            "the partition's directory back if it was moved, start the daemon and stop it "
            "with SIGTERM, then import again",
        )


def _history_destination(data_dir: str, manifest: ExportManifest) -> str | None:
    """Where the export's history goes: the history this data directory keeps, or where
    it would keep one by default (DATA/history, for its first compaction to find); None
    for an export without history."""
    if not manifest.history:
        return None
    return history_root(data_dir) or resolve_dir(data_dir, None)


def _history_to_copy(root: str, manifest: ExportManifest) -> tuple[tuple[HistoryCopy, str], ...]:
    """The export's history files not below ``root`` yet, each with its destination,
    markers last. A file there with other bytes refuses the import: it is another copy
    of that partition's history."""
    to_copy = []
    for copy in manifest.history:
        destination = os.path.join(root, *copy.path.split("/"))
        if not os.path.lexists(destination):
            to_copy.append((copy, destination))
        elif not os.path.isfile(destination) or size_and_crc(destination) != (
            copy.size,
            copy.crc32,
        ):
            raise ToolError(
                EXIT_FAILURE,
                f"{destination} already exists with other contents than the export's: "
                f"the history of state partition {manifest.partition} there is another "
                "copy's; move it aside first",
            )
    # The markers last, whatever order the manifest lists them in.
    to_copy.sort(key=lambda pair: pair[0].path.startswith(f"{EXPORTS_DIR}/"))
    return tuple(to_copy)


# --- the writes -------------------------------------------------------------------------


def _place(
    fs: FileOps,
    log: StateLog,
    data_dir: str,
    source: str,
    manifest: ExportManifest,
    target: _Target,
    progress: _Progress,
) -> None:
    """Steps a-g of the module docstring, under the lock; undoes a-e if one fails."""
    partition = manifest.partition
    partitions = os.path.join(data_dir, PARTITIONS_DIR)
    final = partition_dir(data_dir, partition)
    staging = os.path.join(partitions, f".import-{partition}")
    aside = f"{staging}.replaced"
    _settle_leftover(fs, final, aside)
    _refuse_records_there(fs, data_dir, partition, lambda p: p in log.held)
    undo = progress.undo
    try:
        undo.append(lambda: remove_tree(staging) if os.path.lexists(staging) else None)
        copies = copy_segments(
            fs, [os.path.join(source, s.name) for s in manifest.segments], staging
        )
        if [c.crc32 for c in copies] != [s.crc32 for s in manifest.segments]:
            raise ToolError(EXIT_FAILURE, f"{source} changed while it was copied; run again")
        fingerprint = target.recorded.fingerprint if target.recorded is not None else "imported"
        write_owner(fs, staging, Owner(target.node, fingerprint, "imported", now_ms()))
        _copy_history(fs, source, target.history, undo)
        if os.path.lexists(final):
            _rename(fs, final, aside)
            undo.append(lambda: _rename(fs, aside, final))
        # Each undo below goes first: a write that fails half way is undone too.
        before = log.checkpoint.partitions.get(partition)
        undo.append(lambda: log.restore_entry(partition, before))
        last = manifest.segments[-1]
        log.record_replaced(partition, (last.base_offset, last.size, manifest.log_end_offset))
        recorded = target.recorded
        if recorded is not None:  # else a directory no daemon of this version ran on yet
            undo.append(lambda: write_assignment(fs, data_dir, recorded))
            owners = list(recorded.owners)
            owners[partition] = target.node
            write_assignment(fs, data_dir, replace(recorded, owners=tuple(owners)))
        fs.rename(staging, final)  # the commit point
        progress.committed = True
    except BaseException:
        if not progress.committed:
            _undo(undo)
        raise
    fs.fsync_dir(partitions)
    if os.path.lexists(aside):
        remove_tree(aside)  # the empty directory the import replaced
        fs.fsync_dir(partitions)


def _settle_leftover(fs: FileOps, final: str, aside: str) -> None:
    """An import that stopped between steps c and g: the directory it moved aside goes
    back (before f), or away (f done, or the daemon made the partition anew since)."""
    if not os.path.lexists(aside):
        return
    if os.path.lexists(final):
        remove_tree(aside)
        fs.fsync_dir(os.path.dirname(aside))
    else:
        _rename(fs, aside, final)


def _copy_history(
    fs: FileOps, source: str, to_copy: tuple[tuple[HistoryCopy, str], ...], undo: list[Undo]
) -> None:
    """Each file through a temporary name beside it; the directories it makes and the
    files it places are undone in reverse if the import fails."""
    touched = set()
    for copy, destination in to_copy:
        directory = os.path.dirname(destination)
        _make_dirs(directory, undo)
        temp = os.path.join(directory, f".import-{os.path.basename(destination)}")
        if os.path.lexists(temp):
            os.unlink(temp)  # an import that stopped half way
        source_path = os.path.join(source, HISTORY_DIR, *copy.path.split("/"))
        undo.append(partial(_unlink_if_there, temp))
        if copy_file(fs, source_path, temp) != (copy.size, copy.crc32):
            raise ToolError(EXIT_FAILURE, f"{source} changed while it was copied; run again")
        fs.rename(temp, destination)
        undo.append(partial(_unlink_if_there, destination))
        touched.add(directory)
    for directory in sorted(touched, key=len, reverse=True):
        fs.fsync_dir(directory)


def _make_dirs(directory: str, undo: list[Undo]) -> None:
    """os.makedirs, each directory it makes removed again by the undo."""
    missing = []
    while not os.path.lexists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(path)
        undo.append(partial(os.rmdir, path))


def _rename(fs: FileOps, old: str, new: str) -> None:
    fs.rename(old, new)
    fs.fsync_dir(os.path.dirname(new))


def _unlink_if_there(path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)


def _undo(undo: list[Undo]) -> None:
    """Run the undo steps, newest first; one that fails is logged, and the rest run."""
    for step in reversed(undo):
        try:
            step()
        except (OSError, LogError) as exc:
            _log.error("undoing a failed import: %s", exc)


def _remove_created(data_dir: str, existed: list[str] | None) -> None:
    """A new data directory back to what it was: gone, or what it held before."""
    try:
        if existed is None:
            remove_tree(data_dir)
            return
        for name in os.listdir(data_dir):
            path = os.path.join(data_dir, name)
            if name in existed:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                remove_tree(path)
            else:
                os.unlink(path)
    except OSError as exc:
        _log.error("removing what a failed import created in %s: %s", data_dir, exc)
