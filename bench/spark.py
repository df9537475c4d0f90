"""The Spark jobs' throughput: compaction on logs of 1M and 10M records (next to a
single-process Python fold of the same log), the audit of 1M records in full and
incrementally (a day's worth on top), and the data source's scan rate.

The logs come from bench/logs.py (the daemon's own records, about ten segments per
state partition so most of the log is sealed). Each compaction runs on a fresh copy:
`sharecoord compact --master local[2]`, end to end (JVM start, the job, the commit
under DATA/LOCK since no daemon runs; the driver JVM maps the classes the user's class
cache holds, and a row says so when its run was the one that wrote them). The audit
reads the whole log (1M only), then goes on from its checkpoint over one more day of
records. The single-process folds read the same sealed segments: spark_jobs.fold (what
each Spark task runs), and the plain replay of every record through ShareStateMap (the
obvious fold).
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
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, ShareStateMap
from spark_jobs.classcache import WRITING_NOTICE
from spark_jobs.fold import fold_records
from spark_jobs.sealed import read_sealed_segments

REPO = Path(__file__).resolve().parent.parent
BYTES_PER_RECORD = 80  # about, for the logs bench/logs.py writes
# The audit replays and diffs every state change (about 40k records/s per core on the
# 10M log's partitions, 2026-11-28): it runs on the 1M log, not the 10M one.
AUDIT_MAX_RECORDS = 1_000_000
# The single-process folds scale linearly: at 10M they take minutes and say nothing new.
SINGLE_PROCESS_MAX_RECORDS = 1_000_000
# Issue #14's targets for compaction on local[2], end to end.
COMPACT_TARGET_S = {1_000_000: 6, 10_000_000: 30}


def segment_bytes_for(records: int) -> int:
    """About ten segments per state partition: most of the log sealed, as compaction
    finds a log that has been running for a while."""
    return max(64 * 1024, records * BYTES_PER_RECORD // NUM_PARTITIONS // 10)


def _cli(*args: str) -> tuple[float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "server.commands.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):  # audit exits 1 when it finds violations
        raise RuntimeError(f"sharecoord {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    if wrote_class_archive(done.stdout):
        print(f"  sharecoord {args[0]}: this run wrote its driver JVM's class archive", flush=True)
    return seconds, done.stdout


def wrote_class_archive(out: str) -> bool:
    """Whether a job's run was its first on this machine (spark_jobs/classcache.py): it
    wrote the archive the next runs map, a few seconds that a later run does not pay."""
    return WRITING_NOTICE in out


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
        state, decoder = ShareStateMap(DEFAULT_RECORDS_PER_SNAPSHOT), RecordDecoder()
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


def _label(size: int) -> str:
    return f"{size / 1e6:g}M" if size >= 1_000_000 else f"{size / 1e3:g}k"


def _build(work: Path, size: int, name: str = "", **kwargs: Any) -> tuple[Path, Any]:
    print(f"spark: building a log of {size:,} records", flush=True)
    pristine = work / (name or f"spark-{_label(size)}")
    built = build_log(
        pristine, size, segment_bytes=segment_bytes_for(size), progress=False, **kwargs
    )
    return pristine, built


def compact_scenarios(work: Path, quick: bool) -> list[dict[str, Any]]:
    """`sharecoord compact` end to end on 1M and 10M records (its history export
    included), and the single-process folds of the same sealed segments."""
    rows = []
    for size in (100_000,) if quick else (1_000_000, 10_000_000):
        label = _label(size)
        pristine, built = _build(work, size)
        copy = work / f"spark-{label}-compact"
        shutil.copytree(pristine, copy)
        # Kept forever: the bench's records are dated, and expiry is not what is measured.
        seconds, out = _cli(
            "compact", "--data-dir", str(copy), "--master", "local[2]",
            "--history-retention-ms", "-1",
        )  # fmt: skip
        summary = next((line for line in out.splitlines() if line.startswith("compaction: ")), "")
        summary = summary.replace(f" to {copy / 'history'}", "")  # no temporary path in the report
        match = re.search(r"records (\d+) ->", summary)
        compacted = int(match.group(1)) if match else built.records
        target = COMPACT_TARGET_S.get(size)
        note = summary + (f" (target: {target} s)" if target else "")
        if wrote_class_archive(out):
            note += "; this run wrote the driver JVM's class archive (once per machine)"
        rows.append(
            _row(f"sharecoord compact {label} (local[2], end to end)", compacted, seconds, note)
        )
        print(f"  compact: {seconds:.1f}s; {summary}", flush=True)
        shutil.rmtree(copy)
        if size <= SINGLE_PROCESS_MAX_RECORDS:
            seconds, count = python_fold(pristine)
            rows.append(
                _row(f"Python fold {label}, one process (what a Spark task runs)", count, seconds)
            )
            seconds, count = python_replay(pristine)
            rows.append(_row(f"Python replay {label}, one process (every record)", count, seconds))
        shutil.rmtree(pristine)
    return rows


def audit_scenarios(work: Path, quick: bool) -> list[dict[str, Any]]:
    """`sharecoord audit` on 1M records from scratch, then `--since-last` over a day's
    worth more: the log is a week of records, the daily run reads one seventh on top."""
    size = 100_000 if quick else AUDIT_MAX_RECORDS
    label, day = _label(size), size // 7
    out = work / f"audit-{label}"
    timings: list[float] = []
    notes: list[str] = []

    def full_audit_with_a_checkpoint() -> None:
        seconds, out_text = _cli(
            "audit", "--data-dir", str(work / f"audit-log-{label}"), "--out", str(out),
            "--master", "local[2]", "--since-last",
        )  # fmt: skip
        timings.append(seconds)
        if wrote_class_archive(out_text):
            notes.append("this run wrote the driver JVM's class archive (once per machine)")
        print(f"  audit, full: {seconds:.1f}s", flush=True)

    pristine, built = _build(
        work,
        size + day,
        f"audit-log-{label}",
        pause_at=size,
        on_pause=full_audit_with_a_checkpoint,
    )
    rows = [
        _row(f"sharecoord audit {label}, full (local[2], end to end)", size, timings[0], *notes)
    ]
    seconds, _ = _cli(
        "audit", "--data-dir", str(pristine), "--out", str(out), "--master", "local[2]",
        "--since-last",
    )  # fmt: skip
    print(f"  audit, --since-last over a day ({built.records - size:,} records): {seconds:.1f}s")
    rows.append(
        _row(
            f"sharecoord audit --since-last, a day on {label} (local[2], end to end)",
            built.records - size,
            seconds,
            "a day = a seventh of the log; the checkpoint holds every key's state",
        )
    )
    seconds, _ = _cli(
        "audit", "--data-dir", str(pristine), "--out", str(work / "audit-again"),
        "--master", "local[2]",
    )  # fmt: skip
    rows.append(
        _row(f"sharecoord audit {label} + a day, full again (local[2])", built.records, seconds)
    )
    shutil.rmtree(pristine)
    return rows


def source_scenarios(work: Path, quick: bool) -> list[dict[str, Any]]:
    """spark.read.format("sharecoord") scanning a 1M-record log on local[2]: every column
    of every row reaches the JVM (an aggregate over the batches column), the session
    already warm (the JVM start is not counted)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark loads only when asked

    from spark_jobs.datasource import register  # noqa: PLC0415

    size = 100_000 if quick else 1_000_000
    pristine, built = _build(work, size)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything on loopback
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sharecoord-bench-source")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    rows = []
    try:
        spark.sparkContext.setLogLevel("WARN")
        register(spark)
        query = "count(*) AS n, sum(size(state_batches)) AS b, count(DISTINCT group_id) AS g"
        spark.read.format("sharecoord").load(str(pristine)).limit(10).collect()  # warm up
        for partitioning in ("segment", "state_partition"):
            started = time.perf_counter()
            (row,) = (
                spark.read.format("sharecoord")
                .option("partitioning", partitioning)
                .load(str(pristine))
                .selectExpr(*query.split(", "))
                .collect()
            )
            seconds = time.perf_counter() - started
            assert row["n"] == built.records, (row, built.records)
            rows.append(
                _row(
                    f'spark.read.format("sharecoord") scan {_label(size)}, '
                    f"partitioning={partitioning} (local[2])",
                    row["n"],
                    seconds,
                    "count, batches, distinct groups over every row",
                )
            )
            print(f"  source scan ({partitioning}): {seconds:.1f}s", flush=True)
    finally:
        spark.stop()
    shutil.rmtree(pristine)
    return rows


def run_spark_scenarios(work: Path, quick: bool) -> list[dict[str, Any]]:
    """Everything above: `--only spark`."""
    return (
        compact_scenarios(work, quick)
        + audit_scenarios(work, quick)
        + source_scenarios(work, quick)
    )
