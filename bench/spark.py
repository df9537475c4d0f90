"""The Spark jobs' throughput: compaction and audit on logs of 1M and 10M records,
next to a single-process Python fold of the same log.

The logs come from bench/logs.py (the daemon's own records, about ten segments per
state partition so most of the log is sealed). Each compaction runs on a fresh copy:
`sharecoord compact --master local[2]`, end to end (JVM start, the job, the commit
under DATA/LOCK since no daemon runs). The audit reads the whole log (1M only). The
single-process folds read the same sealed segments: spark_jobs.fold (what each Spark
task runs), and the plain replay of every record through ShareStateMap (the obvious
fold).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.logs import NUM_PARTITIONS, build_log
from persistence import list_segments, partition_dir, read_partition
from protocol.records import RecordDecoder
from protocol.replay import ShareStateMap
from spark_jobs.fold import fold_records
from spark_jobs.sealed import read_sealed_segments

REPO = Path(__file__).resolve().parent.parent
BYTES_PER_RECORD = 80  # about, for the logs bench/logs.py writes
# The audit diffs every state change batch by batch (about 16k records/s per core):
# it runs on the 1M log, not the 10M one.
AUDIT_MAX_RECORDS = 1_000_000


def segment_bytes_for(records: int) -> int:
    """About ten segments per state partition: most of the log sealed, as compaction
    finds a log that has been running for a while."""
    return max(64 * 1024, records * BYTES_PER_RECORD // NUM_PARTITIONS // 10)


def _cli(*args: str) -> tuple[float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):  # audit exits 1 when it finds violations
        raise RuntimeError(f"sharecoord {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout


def python_fold(data_dir: Path) -> tuple[float, int]:
    """spark_jobs.fold over every partition's sealed segments, in this one process."""
    started, count = time.perf_counter(), 0
    for p in range(NUM_PARTITIONS):
        records, _ = read_sealed_segments(list_segments(partition_dir(str(data_dir), p)))
        count += len(records)
        fold_records(records, tombstone_cutoff_ms=0)
    return time.perf_counter() - started, count


def python_replay(data_dir: Path) -> tuple[float, int]:
    """Every record of the log replayed through ShareStateMap, in this one process."""
    started, count = time.perf_counter(), 0
    for p in range(NUM_PARTITIONS):
        state, decoder = ShareStateMap(500), RecordDecoder()
        for frame in read_partition(partition_dir(str(data_dir), p)):
            state.replay(frame.offset, decoder.decode(frame.record_type, frame.key, frame.value))
            count += 1
    return time.perf_counter() - started, count


def _row(name: str, records: int, seconds: float, note: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds if seconds else 0.0,
        "note": note,
    }


def run_spark_scenarios(work: Path, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for size in (100_000,) if quick else (1_000_000, 10_000_000):
        label = f"{size / 1e6:g}M" if size >= 1_000_000 else f"{size / 1e3:g}k"
        print(f"spark: building a log of {size:,} records", flush=True)
        pristine = work / f"spark-{label}"
        built = build_log(pristine, size, segment_bytes=segment_bytes_for(size), progress=False)
        copy = work / f"spark-{label}-compact"
        shutil.copytree(pristine, copy)
        seconds, out = _cli("compact", "--data-dir", str(copy), "--master", "local[2]")
        summary = next((line for line in out.splitlines() if line.startswith("compaction: ")), "")
        match = re.search(r"records (\d+) ->", summary)
        compacted = int(match.group(1)) if match else built.records
        rows.append(
            _row(f"sharecoord compact {label} (local[2], end to end)", compacted, seconds, summary)
        )
        print(f"  compact: {seconds:.1f}s; {summary}", flush=True)
        shutil.rmtree(copy)
        if size <= AUDIT_MAX_RECORDS:
            seconds, _ = _cli(
                "audit", "--data-dir", str(pristine), "--out", str(work / f"audit-{label}"),
                "--master", "local[2]",
            )  # fmt: skip
            rows.append(
                _row(f"sharecoord audit {label} (local[2], end to end)", built.records, seconds)
            )
            print(f"  audit: {seconds:.1f}s", flush=True)
        seconds, count = python_fold(pristine)
        rows.append(
            _row(f"Python fold {label}, one process (what a Spark task runs)", count, seconds)
        )
        seconds, count = python_replay(pristine)
        rows.append(_row(f"Python replay {label}, one process (every record)", count, seconds))
        shutil.rmtree(pristine)
    return rows
