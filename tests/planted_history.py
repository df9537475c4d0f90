"""A history planted by hand (no Spark), for the tests of what copies one."""

from __future__ import annotations

import os
from pathlib import Path

from persistence.history import (
    ExportedFile,
    HistoryConfig,
    SegmentExport,
    data_path,
    fingerprint,
    marker_path,
    resolve_dir,
    write_declaration,
    write_marker,
)


def plant_history(data: Path, partitions: list[int]) -> dict[int, dict[str, bytes]]:
    """A history as compaction leaves one (history.json, a Parquet file and its export
    marker per partition), its bytes by path below the root, per partition. The tools
    copy bytes; what the files say is the Spark jobs' business."""
    root = resolve_dir(str(data), None)
    write_declaration(str(data), HistoryConfig(root, -1))
    planted: dict[int, dict[str, bytes]] = {}
    for p in partitions:
        segment = fingerprint(f"{0:020d}.log", 1000 + p, 7)
        day = "2026-11-20"
        parquet = data_path(root, p, day, segment)
        os.makedirs(os.path.dirname(parquet))
        Path(parquet).write_bytes(os.urandom(300 + p))
        relative = os.path.relpath(parquet, root)
        write_marker(
            root,
            SegmentExport(p, segment, 0, 9, 10, (ExportedFile(relative, day, 10, 0, 9),)),
        )
        marker = marker_path(root, p, segment)
        planted[p] = {
            os.path.relpath(path, root): Path(path).read_bytes() for path in (parquet, marker)
        }
    return planted


def history_of(root: Path, partition: int) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for top in (root / f"state_partition={partition}", root / "_exports" / str(partition))
        for path in top.rglob("*")
        if path.is_file()
    }
