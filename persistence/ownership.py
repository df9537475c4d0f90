"""Which node a state partition's directory belongs to, and what a data directory knows
of the cluster's assignment (docs/operations.md#moving-a-state-partition).

A node keeps only the partitions it owns. Two small files let it tell its own state
from an empty or foreign directory after the cluster file changes:

DATA/partitions/<p>/OWNER  JSON, written atomically when the directory is created (or
                           migrated, imported, adopted): {"format": 1, "node_id": N,
                           "assignment": F, "origin": "created", "at_ms": T}, and
                           "exported_ms" once `sharecoord partition export` handed the
                           partition over. The node that may serve it is N.
DATA/ASSIGNMENT            JSON, rewritten at a daemon start that changes it: {"format": 1,
                           "node_id": N, "assignment": F, "owners": [o0, o1, ...]}: this
                           data directory's node, and the owner of every state partition
                           in the last cluster map it ran with (-1: not known).

F is the fingerprint of a cluster map's assignment (server.cluster), for people and
logs; the decisions use node ids. ``settle`` applies the rules when a daemon opens the
data directory; the read-only tools use ``absent_by_design`` to tell a partition that
was never meant to be here from one that went missing.

Directories made before OWNER files existed (every node then made all of them) are
migrated: on the first open without DATA/ASSIGNMENT, each partition directory this node
owns is stamped as its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any

from persistence.errors import LogError
from persistence.fileops import FileOps, read_file, write_file_atomically
from persistence.staging import LOG_SUFFIX, SWAP_SUFFIX, parse_base

_log = logging.getLogger("sharecoord.log")

OWNER_FILE = "OWNER"
ASSIGNMENT_FILE = "ASSIGNMENT"
OWNERSHIP_FORMAT = 1
UNKNOWN = -1  # an owner no record names
MOVING = "docs/operations.md#moving-a-state-partition"


class PartitionOwnershipError(LogError):
    """This node may not serve a state partition from this data directory (its
    directory belongs to another node, was handed over, is missing, or holds the state
    of another node's tenure). The partition answers 15; the others serve."""

    def __init__(self, partition: int, reason: str) -> None:
        self.partition = partition
        self.reason = reason
        super().__init__(f"state partition {partition} {reason} (see {MOVING})")


class DataDirectoryOwnerError(LogError):
    """The data directory belongs to another node: a wrong --data-dir or --node-id."""


@dataclass(frozen=True)
class Owner:
    """The OWNER file of one partition directory."""

    node_id: int
    assignment: str
    origin: str  # created, migrated, imported, adopted
    at_ms: int
    exported_ms: int | None = None


@dataclass(frozen=True)
class Assignment:
    """A node and the owner of every state partition: what a daemon opens its data
    directory with, and what DATA/ASSIGNMENT records."""

    node_id: int
    fingerprint: str
    owners: tuple[int, ...]

    def owned(self) -> frozenset[int]:
        return frozenset(p for p, owner in enumerate(self.owners) if owner == self.node_id)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- the files ---------------------------------------------------------------------------


def partition_path(data_dir: str, partition: int) -> str:
    return os.path.join(data_dir, "partitions", str(partition))


def read_owner(fs: FileOps, directory: str) -> Owner | None:
    """The OWNER of a partition directory; None when it has none. LogError when it
    cannot be read: nobody can say whose it is."""
    path = os.path.join(directory, OWNER_FILE)
    try:
        document = _json(fs, path)
        if document.get("format") != OWNERSHIP_FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        exported = document.get("exported_ms")
        return Owner(
            _int(document["node_id"]),
            str(document["assignment"]),
            str(document["origin"]),
            _int(document["at_ms"]),
            None if exported is None else _int(exported),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogError(f"{path} is not a valid OWNER file: {exc}") from None


def write_owner(fs: FileOps, directory: str, owner: Owner) -> None:
    document: dict[str, Any] = {
        "format": OWNERSHIP_FORMAT,
        "node_id": owner.node_id,
        "assignment": owner.assignment,
        "origin": owner.origin,
        "at_ms": owner.at_ms,
    }
    if owner.exported_ms is not None:
        document["exported_ms"] = owner.exported_ms
    write_file_atomically(fs, os.path.join(directory, OWNER_FILE), _dump(document))


def read_assignment(fs: FileOps, data_dir: str) -> Assignment | None:
    """DATA/ASSIGNMENT, or None for a data directory no daemon of this version ran on."""
    path = os.path.join(data_dir, ASSIGNMENT_FILE)
    try:
        document = _json(fs, path)
        if document.get("format") != OWNERSHIP_FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        owners = tuple(_int(o) for o in document["owners"])
        return Assignment(_int(document["node_id"]), str(document["assignment"]), owners)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogError(f"{path} is not a valid ASSIGNMENT file: {exc}") from None


def write_assignment(fs: FileOps, data_dir: str, assignment: Assignment) -> None:
    document = {
        "format": OWNERSHIP_FORMAT,
        "node_id": assignment.node_id,
        "assignment": assignment.fingerprint,
        "owners": list(assignment.owners),
    }
    write_file_atomically(fs, os.path.join(data_dir, ASSIGNMENT_FILE), _dump(document))


def create_partition_dir(fs: FileOps, data_dir: str, partition: int, owner: Owner) -> None:
    """DATA/partitions/<p> with its OWNER, both durable (a crash in between leaves an
    empty directory without OWNER, which the next open treats as missing)."""
    root = os.path.join(data_dir, "partitions")
    if not fs.exists(root):
        fs.mkdir(root)
        fs.fsync_dir(data_dir)
    directory = os.path.join(root, str(partition))
    if not fs.exists(directory):
        fs.mkdir(directory)
        fs.fsync_dir(root)
    write_owner(fs, directory, owner)


def holds_records(fs: FileOps, directory: str) -> bool:
    """Whether a partition directory has anything a log could be rebuilt from: a
    segment with bytes in it, or a compaction swap in progress."""
    names = fs.listdir(directory)
    if any(parse_base(name, SWAP_SUFFIX) is not None for name in names):
        return True
    for name in names:
        if parse_base(name, LOG_SUFFIX) is None:
            continue
        fd = fs.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            if fs.size(fd) > 0:
                return True
        finally:
            fs.close(fd)
    return False


# --- the daemon's rules --------------------------------------------------------------------


def create_fresh(fs: FileOps, data_dir: str, current: Assignment) -> None:
    """A new data directory: the partitions this node owns, each with its OWNER, and
    ASSIGNMENT. Called before DATA/meta is written, which is the commit point."""
    stamp = Owner(current.node_id, current.fingerprint, "created", now_ms())
    root = os.path.join(data_dir, "partitions")
    if not fs.exists(root):
        fs.mkdir(root)
        fs.fsync_dir(data_dir)
    for partition in sorted(current.owned()):
        create_partition_dir(fs, data_dir, partition, stamp)
    write_assignment(fs, data_dir, current)


@dataclass(frozen=True)
class Settlement:
    """What ``settle`` decided."""

    refused: dict[int, str]  # partition -> why this node may not serve it
    # Partitions a disk error kept from deciding, each with the check to run (given the
    # FileOps to run it on) when it opens: it raises PartitionOwnershipError, or the
    # disk error again, which the loader retries like any.
    undecided: dict[int, Callable[[FileOps], None]]
    # What DATA/ASSIGNMENT must say from now on, or None when it says it already. The
    # opener writes it (StateLog.finish_opening) before the first journal record.
    record: Assignment | None


def settle(
    fs: FileOps, data_dir: str, current: Assignment, checkpointed: Collection[int]
) -> Settlement:
    """Decide, for every partition ``current`` gives this node, whether it may serve it
    from this data directory; create the ones that are new here and migrate the ones an
    older version made. ``checkpointed``: the partitions DATA/journal's CHECKPOINT shows
    records of (a record that they had state here). Writes nothing but those creations
    and migrations (each partition's own: a disk error there leaves it undecided).

    Raises DataDirectoryOwnerError if the data directory is another node's."""
    last = read_assignment(fs, data_dir)
    node = current.node_id
    if last is not None and last.node_id != node:
        raise DataDirectoryOwnerError(
            f"{data_dir} is the data directory of node {last.node_id} (recorded in "
            f"{os.path.join(data_dir, ASSIGNMENT_FILE)}); refusing to run it as node {node}: "
            f"give --node-id {last.node_id}, or another --data-dir"
        )
    if last is not None and len(last.owners) != len(current.owners):
        raise LogError(
            f"{os.path.join(data_dir, ASSIGNMENT_FILE)} names {len(last.owners)} partitions, "
            f"not {len(current.owners)}"
        )
    refused: dict[int, str] = {}
    undecided: dict[int, Callable[[FileOps], None]] = {}
    stamp = Owner(node, current.fingerprint, "created", now_ms())
    for partition in sorted(current.owned()):
        previous = None if last is None else last.owners[partition]

        def decide(
            on: FileOps, partition: int = partition, previous: int | None = previous
        ) -> None:
            reason = _decide(
                on, data_dir, partition, node, previous, partition in checkpointed, stamp
            )
            if reason is not None:
                raise PartitionOwnershipError(partition, reason)

        try:
            decide(fs)
        except PartitionOwnershipError as exc:
            refused[partition] = exc.reason
            _log.error("state partition %d refused: %s", partition, exc.reason)
        except OSError as exc:
            undecided[partition] = decide
            _log.warning("state partition %d: ownership decided when it opens: %s", partition, exc)
    # What the record says next time: the new owners, except where this node refused a
    # partition or could not decide (the old owner still holds its state, as far as this
    # node knows).
    owners = list(current.owners)
    for partition in [*refused, *undecided]:
        owners[partition] = node if last is None else last.owners[partition]
    _warn_about_moves(fs, data_dir, current, last)
    record = replace(current, owners=tuple(owners))
    return Settlement(refused, undecided, None if record == last else record)


def _decide(
    fs: FileOps,
    data_dir: str,
    partition: int,
    node: int,
    previous: int | None,
    checkpointed: bool,
    stamp: Owner,
) -> str | None:
    directory = partition_path(data_dir, partition)
    exists = fs.exists(directory)
    owner = read_owner(fs, directory) if exists else None
    if exists and owner is None:
        if previous is None:
            # Made by a version without OWNER files, which gave every node every
            # directory: this node's own, by the upgrade's rule (module docstring).
            write_owner(fs, directory, replace(stamp, origin="migrated"))
            _log.info("state partition %d: migrated (OWNER written for node %d)", partition, node)
            return None
        if holds_records(fs, directory):
            return (
                f"has records in {directory} but no OWNER file: this node did not create "
                "it (a copy made by hand, or kept by an older version for another node); "
                "move it with `sharecoord partition export` and `import`"
            )
        exists = False  # an empty leftover, or a creation cut short: as if missing
    if exists:
        assert owner is not None
        if owner.exported_ms is not None:
            return (
                f"was exported from this node (`sharecoord partition export`, at "
                f"{_when(owner.exported_ms)}): its state lives where it was imported; import "
                "it back, or `sharecoord partition adopt` it if the export was never imported"
            )
        if owner.node_id != node:
            return (
                f"was created by node {owner.node_id}, not by this node ({OWNER_FILE} in "
                f"{directory}): a copy made by hand? move it with `sharecoord partition "
                "export` and `import`"
            )
        if previous is not None and previous not in (node, UNKNOWN):
            return (
                f"was given to node {previous} by the last cluster map this node ran with: "
                f"the copy in {directory} is from before, and node {previous} may have "
                "written since; import its state from there, or `sharecoord partition "
                f"adopt` it if node {previous} never served it"
            )
        return None
    # No directory.
    if previous == UNKNOWN:
        create_partition_dir(fs, data_dir, partition, stamp)  # nobody ever held it here
        return None
    if previous == node:
        return (
            f"is missing ({directory}), but this node held it (DATA/{ASSIGNMENT_FILE}): "
            "restore it from a backup or import it"
        )
    if checkpointed:
        return (
            f"is missing ({directory}), but the journal's CHECKPOINT shows it had records "
            "here: restore it from a backup or import it"
        )
    if previous is None:
        return (
            f"is missing ({directory}), but this data directory was made by a version "
            "that created every partition: restore it from a backup or import it"
        )
    return (
        f"moved to this node in the cluster file, but its state is on node {previous} (its "
        "owner in the last cluster map this node ran with): move it with `sharecoord "
        "partition export` there and `sharecoord partition import` here, or `sharecoord "
        f"partition adopt` it if node {previous} never held state for it"
    )


def _warn_about_moves(
    fs: FileOps, data_dir: str, current: Assignment, last: Assignment | None
) -> None:
    """Say what a cluster file change does to this node: partitions it gave away whose
    state is still here (the new owner starts them empty unless they are moved)."""
    if last is None or last.fingerprint == current.fingerprint:
        return
    node = current.node_id
    left = []
    for partition, owner in enumerate(current.owners):
        if owner == node or last.owners[partition] != node:
            continue
        directory = partition_path(data_dir, partition)
        stamp = read_owner(fs, directory) if fs.exists(directory) else None
        if stamp is not None and stamp.exported_ms is None and holds_records(fs, directory):
            left.append(partition)
    _log.info(
        "the cluster assignment changed since the last start (%s, now %s)",
        last.fingerprint,
        current.fingerprint,
    )
    if left:
        _log.warning(
            "state partitions %s moved to other nodes, but their state is here and was not "
            "exported: their new owners refuse them until it is moved (`sharecoord "
            "partition export`, then `import` there; %s)",
            left,
            MOVING,
        )


# --- what the other openers need -------------------------------------------------------------


def foreign_owner(fs: FileOps, directory: str, node: int | None) -> int | None:
    """The node named by the directory's OWNER when it is not ``node`` (None: it is
    this node's, has no OWNER, does not exist, or ``node`` is not known)."""
    if node is None or not fs.exists(directory):
        return None
    try:
        owner = read_owner(fs, directory)
    except LogError:
        return None
    if owner is None or owner.node_id == node:
        return None
    return owner.node_id


def absent_by_design(fs: FileOps, data_dir: str, partition: int) -> str | None:
    """Why a state partition has no directory here although nothing is wrong (it
    belongs to another node), or None: it should be here, and is, or is missing."""
    if fs.exists(partition_path(data_dir, partition)):
        return None
    try:
        last = read_assignment(fs, data_dir)
    except LogError:
        return None
    if last is None or not 0 <= partition < len(last.owners):
        return None
    owner = last.owners[partition]
    if owner == last.node_id:
        return None
    if owner == UNKNOWN:
        return "never held by this node"
    return f"not held by this node: node {owner} owns it"


def data_dir_of(partition_dir: str) -> tuple[str, int] | None:
    """(DATA, p) for DATA/partitions/<p>, else None."""
    parent, name = os.path.split(os.path.normpath(partition_dir))
    if not name.isdigit() or os.path.basename(parent) != "partitions":
        return None
    return os.path.dirname(parent) or ".", int(name)


def describe(partitions: Iterable[int]) -> str:
    return ", ".join(str(p) for p in sorted(partitions))


def _json(fs: FileOps, path: str) -> dict[str, Any]:
    document = json.loads(read_file(fs, path))
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


def _dump(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode() + b"\n"


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
