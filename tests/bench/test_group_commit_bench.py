"""bench/group_commit.py measures what it says: in the journal way every cycle is one
flush whatever the number of dirty partitions; in the per-partition way, one per
partition. Counted from the FileOps calls, never timed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from blockbuster import BlockBuster

from bench import group_commit
from persistence import StateLog
from persistence.fileops import FileOps


class CountingFileOps(FileOps):
    def __init__(self) -> None:
        super().__init__()
        self.fdatasyncs = 0

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        super().fdatasync(fd)


def flushes_per_cycle(tmp_path: Path, way: str, dirty: int, cycles: int = 20) -> float:
    fs = CountingFileOps()
    log = StateLog.open(str(tmp_path / f"{way}-{dirty}"), group_commit.NUM_PARTITIONS, fs=fs)
    try:
        for p in range(group_commit.NUM_PARTITIONS):
            log.partition(p).open()
        run = (
            group_commit._journal_cycles if way == "journal" else group_commit._per_partition_cycles
        )
        before = fs.fdatasyncs
        row = asyncio.run(run(log, dirty, cycles))
        assert row["ms_per_cycle"] > 0
        return (fs.fdatasyncs - before) / (cycles + group_commit.WARMUP)
    finally:
        log.close()


def test_the_journal_flushes_once_per_cycle_and_the_old_way_once_per_partition(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    # The old way takes the partition lock on the loop between its cycles, as the bench
    # means it to (the bench's loop serves no one); the daemon's own paths stay checked.
    blockbuster.deactivate()
    # Checkpoints add a few fdatasyncs of partition files over the whole run, not per cycle.
    assert flushes_per_cycle(tmp_path, "journal", 16) < 2
    assert flushes_per_cycle(tmp_path, "per-partition", 16) == 16


def test_measure_gives_both_ways_for_each_count(tmp_path: Path, blockbuster: BlockBuster) -> None:
    blockbuster.deactivate()
    rows = group_commit.measure(str(tmp_path), cycles=3)
    assert [(r["way"], r["dirty_partitions"]) for r in rows] == [
        (way, n) for n in (1, 16, 50) for way in ("journal", "per-partition fsync")
    ]
