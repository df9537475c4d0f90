"""One durable flush per commit cycle versus one per state partition (a measurement).

    python -m bench.group_commit [DIR]

For 1, 16 and 50 dirty state partitions, runs cycles of: append one 2 KB record to each
of them, wait until all are durable. Two ways of making a cycle durable:

- ``journal``: the GroupCommitter as the daemon runs it; one journal record and one
  fdatasync per cycle, the partition files written without fsync and synced by the
  checkpoints running beside it (their cost is in the figures);
- ``per-partition``: each partition's batch written and fdatasynced in its own file, one
  after the other in a commit thread, as the log did before the journal
  (``PartitionLog.commit``).

Reports ms per cycle and the per-cycle fsync time's median and p99 (the journal's from
``sharecoord_fsync_duration_seconds``' own measurement point, the commit cycle). DIR
should be on the disk the daemon will use; the default is a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from persistence import GroupCommitter, StateLog

NUM_PARTITIONS = 50
VALUE = os.urandom(2000)
WARMUP = 50  # cycles run before the clock starts, in both ways


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _journal_cycles(log: StateLog, dirty: int, cycles: int) -> dict[str, float]:
    fsyncs: list[float] = []
    committer = GroupCommitter(log, on_cycle=lambda _, seconds: fsyncs.extend(seconds))
    committer.start()
    try:
        started = time.perf_counter()
        for cycle in range(-WARMUP, cycles):
            if cycle == 0:  # after the start's own work (the journal's spare segment)
                started = time.perf_counter()
                fsyncs.clear()
            waits = []
            for p in range(dirty):
                offset = log.partition(p).append(1, b"key", VALUE, cycle)
                waits.append(committer.wait_durable(p, offset))
            await asyncio.gather(*waits)
        elapsed = time.perf_counter() - started
    finally:
        await committer.close()
    median, p99 = _quantiles(fsyncs)
    return {
        "ms_per_cycle": elapsed / cycles * 1000,
        "flush_median_ms": median * 1000,
        "flush_p99_ms": p99 * 1000,
        "checkpoints": committer.checkpoints,
    }


async def _per_partition_cycles(log: StateLog, dirty: int, cycles: int) -> dict[str, float]:
    """As the committer did before the journal: a commit thread takes each cycle's
    batches and writes and fdatasyncs them partition after partition."""
    flushes: list[float] = []

    def commit_all(parts: list[Any]) -> None:
        for part in parts:
            began = time.perf_counter()
            part.commit()
            flushes.append(time.perf_counter() - began)

    loop = asyncio.get_running_loop()
    parts = [log.partition(p) for p in range(dirty)]
    with ThreadPoolExecutor(1, thread_name_prefix="bench-commit") as pool:
        started = time.perf_counter()
        for cycle in range(-WARMUP, cycles):
            if cycle == 0:
                started = time.perf_counter()
                flushes.clear()
            for part in parts:
                part.append(1, b"key", VALUE, cycle)
            await loop.run_in_executor(pool, commit_all, parts)
        elapsed = time.perf_counter() - started
    median, p99 = _quantiles(flushes)
    return {
        "ms_per_cycle": elapsed / cycles * 1000,
        "flush_median_ms": median * 1000,
        "flush_p99_ms": p99 * 1000,
        "checkpoints": 0,
    }


def _with_log(parent: str | None, run: Callable[[StateLog], Any]) -> Any:
    data_dir = tempfile.mkdtemp(prefix="bench-gc-", dir=parent)
    try:
        log = StateLog.open(data_dir, NUM_PARTITIONS)
        try:
            for p in range(NUM_PARTITIONS):
                log.partition(p).open()
            return run(log)
        finally:
            log.close()
    finally:
        shutil.rmtree(data_dir)


def measure(parent: str | None = None, cycles: int = 200) -> list[dict[str, Any]]:
    """One row per (way, dirty partitions)."""
    rows = []
    for dirty in (1, 16, 50):
        journal = _with_log(
            parent, lambda log, n=dirty: asyncio.run(_journal_cycles(log, n, cycles))
        )
        per_partition = _with_log(
            parent, lambda log, n=dirty: asyncio.run(_per_partition_cycles(log, n, cycles))
        )
        rows.append({"way": "journal", "dirty_partitions": dirty, **journal})
        rows.append({"way": "per-partition fsync", "dirty_partitions": dirty, **per_partition})
    return rows


def main() -> None:
    parent = sys.argv[1] if len(sys.argv) > 1 else None
    print("way                   dirty  ms/cycle  flush p50  flush p99  (one flush: the cycle's")
    print("                                                             journal fsync, or one")
    print("                                                             partition's)")
    for row in measure(parent):
        print(
            f"{row['way']:<20}  {row['dirty_partitions']:5d}  {row['ms_per_cycle']:8.2f}  "
            f"{row['flush_median_ms']:9.2f}  {row['flush_p99_ms']:9.2f}"
        )


if __name__ == "__main__":
    main()
