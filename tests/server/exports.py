"""An export of state partition MOVED (its records in several segments, its history) and
data directories to import it into, made without a daemon, for the tests of
`sharecoord partition import` (server/partition_import.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from persistence import FileOps, LogError, LogRecord, StateLog
from persistence.journal import journal_dir, read_checkpoint
from persistence.ownership import Assignment, read_assignment, read_owner
from protocol.records import ShareKey, ShareSnapshot, encode_record
from server.commands.cli import main
from server.partition_tools import export_partition
from server.tools import log_verify
from tests.planted_history import plant_history

N = 50
MOVED = 3
NODE = 1  # the node imported into; the export comes from node 0
FINGERPRINT = "fp"
TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"
RECORDS = 8


@dataclass(frozen=True)
class Export:
    path: Path
    records: list[LogRecord]  # partition MOVED as the source served it
    history: dict[str, bytes]  # its history files, by path below the history root

    @property
    def manifest(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.path / "EXPORT").read_text())
        return document


def make_export(root: Path) -> Export:
    """Node 0's data directory with RECORDS records in MOVED (three segments) and a
    history, exported to root/export."""
    source = root / "source"
    owners = (0,) * N
    log = StateLog.open(
        str(source), N, segment_bytes=256, assignment=Assignment(0, FINGERPRINT, owners)
    )
    try:
        part = log.partition(MOVED)
        part.open()
        for i in range(RECORDS):
            snapshot = ShareSnapshot(ShareKey("group", TOPIC, i), 0, 1, 1, 10 * i, 1, 1, [])
            part.append(*encode_record(snapshot), 1_700_000_000_000 + i)
        part.commit()
        records = list(part.read())
    finally:
        log.close()
    history = plant_history(source, [MOVED])[MOVED]
    out = root / "export"
    export_partition(str(source), MOVED, str(out))
    return Export(out, records, history)


# The data directories imported into, each as node NODE's daemon left it.
TARGETS = {
    # Node 1 held MOVED and never wrote to it: an empty directory with its OWNER.
    "held-empty": (NODE,) * N,
    # MOVED belonged to node 0 in the last cluster map node 1 ran with: no directory.
    "moved-here": tuple(0 if p == MOVED else NODE for p in range(N)),
}


def make_target(path: Path, owners: tuple[int, ...]) -> str:
    log = StateLog.open(str(path), N, assignment=Assignment(NODE, FINGERPRINT, owners))
    try:
        for p in range(N):
            if owners[p] == NODE:
                log.partition(p).open()
    finally:
        log.close()
    return str(path)


def copied(template: str, path: Path) -> str:
    shutil.copytree(template, path, symlinks=True)
    return str(path)


def run_import(
    capsys: pytest.CaptureFixture[str], data_dir: str, source: Path | str, *extra: str
) -> tuple[int, list[str], str]:
    """`sharecoord partition import` in this process: exit code, stderr lines, stdout."""
    code = main(["partition", "import", "--data-dir", data_dir, "--from", str(source), *extra])
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


def served(data_dir: str) -> list[LogRecord] | str:
    """What node 1's daemon makes of MOVED when its cluster map gives it every partition
    (ownership settled, the journal caught up, the partition opened): its records, or why
    it refuses it. The same path a daemon start takes, without the HTTP around it."""
    log = StateLog.open(data_dir, N, assignment=Assignment(NODE, FINGERPRINT, (NODE,) * N))
    try:
        part = log.partition(MOVED)
        try:
            part.open()
        except LogError as exc:
            return str(exc)
        return list(part.read())
    finally:
        log.close()


def checkpoint_positions(data_dir: str) -> dict[int, tuple[int, int, int]]:
    """Every partition's CHECKPOINT entry without its LSN (which any open moves on)."""
    checkpoint = read_checkpoint(FileOps(), journal_dir(data_dir))
    return {p: (c.segment, c.size, c.next_offset) for p, c in checkpoint.partitions.items()}


def owner_of_moved(data_dir: str) -> int:
    assignment = read_assignment(FileOps(), data_dir)
    assert assignment is not None
    return assignment.owners[MOVED]


def check_imported(data_dir: str, export: Export) -> None:
    """The end state of an import: node 1 serves exactly the export's records; its
    OWNER, ASSIGNMENT and CHECKPOINT say so; the history is in place; nothing is left
    over; `log verify` passes."""
    assert served(data_dir) == export.records
    directory = os.path.join(data_dir, "partitions", str(MOVED))
    owner = read_owner(FileOps(), directory)
    assert owner is not None and (owner.node_id, owner.origin) == (NODE, "imported")
    assert owner_of_moved(data_dir) == NODE
    partitions = os.listdir(os.path.join(data_dir, "partitions"))
    assert not [name for name in partitions if name.startswith(".")], partitions
    for path, data in export.history.items():
        placed = Path(data_dir, "history", path)
        assert placed.read_bytes() == data
        assert not [n for n in os.listdir(placed.parent) if n.startswith(".import-")]
    out = io.StringIO()
    assert log_verify(data_dir, out) == 0, out.getvalue()
