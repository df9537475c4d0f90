"""Compaction: fold each state partition's sealed segments into one segment holding one
ShareSnapshot per live key, staged for the crash-safe swap (docs/design.md#compaction-and-its-swap).

Run it with `sharecoord compact --data-dir DIR [--master URL]`, or by hand from the
repository root, with a Python that has the project's dependencies as PYSPARK_PYTHON
(the zip ships the pure packages to the executors; `sharecoord compact` does the same):

    python3 -m zipfile -c sharecoord.zip protocol persistence spark_jobs
    spark-submit --master 'local[*]' --py-files sharecoord.zip \\
        spark_jobs/compact.py --data-dir /data --tombstone-retention-ms 86400000

State partitions are the unit of parallelism: each is handled whole by one task (a
task takes a few partitions, session.TASKS_PER_CORE), which reads its sealed segments
present when it starts (all but the newest, which the daemon appends to and which is
never touched), folds them (spark_jobs/fold.py) and stages `<base>.cleaned` +
`<base>.manifest` in DATA/partitions/<p>/compaction/. No record is shuffled: a
partition's records never leave its task.

Then the handshake: whoever holds DATA/LOCK commits. The driver tries to take it; if it
can, it commits every staged output itself (in tasks again, while it holds the lock)
and prints `committed: self`; if the daemon holds it, it prints `staged: the
running daemon commits it` (the daemon's periodic scan, or
`POST /v1/admin/compaction/commit`). Then one summary line. Exit 0, or 1 if a partition
could not be compacted (damage, or records the daemon could not load).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from persistence import (
    LogError,
    LogLockedError,
    StateLog,
    commit_staged,
    list_segments,
    partition_dir,
    pending_staged,
    read_meta,
    write_staged,
)
from protocol.records import RecordDecodeError
from spark_jobs.fold import encode_frames, fold_records
from spark_jobs.sealed import read_sealed_segments
from spark_jobs.session import Progress, spark_session, task_count

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Kafka's delete.retention.ms.
DEFAULT_TOMBSTONE_RETENTION_MS = 86_400_000

EXIT_OK = 0
EXIT_FAILURE = 1

COMMITTED_SELF = "committed: self"
STAGED_FOR_DAEMON = "staged: the running daemon commits it"


NO_SEALED_SEGMENT = "no sealed segment"
NOTHING_TO_GAIN = "already compacted: nothing to gain"
ROUTINE_SKIPS = ("", NO_SEALED_SEGMENT, NOTHING_TO_GAIN)


@dataclass
class PartitionCompaction:
    """What one task did to one state partition."""

    partition: int
    status: str  # "staged", "skipped" or "failed"
    reason: str = ""
    base: int | None = None
    segments_before: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_before: int = 0
    records_after: int = 0
    keys: int = 0
    tombstones_dropped: int = 0


@dataclass
class CommitResult:
    partition: int
    committed: list[int] = field(default_factory=list)  # base offsets
    stale: list[int] = field(default_factory=list)
    error: str = ""


# -- one partition (runs in an executor) -----------------------------------------------


def compact_partition(
    data_dir: str, partition: int, tombstone_cutoff_ms: int
) -> PartitionCompaction:
    """Fold and stage one state partition's sealed segments; never raises for the log's
    own problems (they come back as a "failed" result)."""
    directory = partition_dir(data_dir, partition)
    try:
        return _compact(directory, partition, tombstone_cutoff_ms)
    except FileNotFoundError as exc:
        # A prune or an earlier compaction's swap replaced a segment while it was read.
        return PartitionCompaction(
            partition, "skipped", f"the segments changed while being read ({exc}); run again"
        )
    except (LogError, RecordDecodeError, OSError, TypeError, ValueError) as exc:
        return PartitionCompaction(partition, "failed", f"{type(exc).__name__}: {exc}")


def _compact(directory: str, partition: int, tombstone_cutoff_ms: int) -> PartitionCompaction:
    segments = list_segments(directory)
    if any(not s.path.endswith(".log") for s in segments):
        return PartitionCompaction(
            partition, "skipped", "a half-done compaction swap waits for the next open"
        )
    sealed = segments[:-1]
    if not sealed:
        return PartitionCompaction(partition, "skipped", NO_SEALED_SEGMENT)
    base = sealed[0].base_offset
    if base in pending_staged(directory):
        return PartitionCompaction(
            partition, "skipped", f"output is already staged at base {base}, waiting to commit"
        )
    records, fingerprints = read_sealed_segments(segments)
    folded = fold_records(records, tombstone_cutoff_ms=tombstone_cutoff_ms)
    frames = encode_frames(folded.records)
    result = PartitionCompaction(
        partition,
        "staged",
        base=base,
        segments_before=len(sealed),
        bytes_before=sum(f.size for f in fingerprints),
        bytes_after=sum(len(frame) for frame in frames),
        records_before=len(records),
        records_after=len(frames),
        keys=folded.keys,
        tombstones_dropped=folded.tombstones_dropped,
    )
    if len(sealed) == 1 and result.bytes_after >= result.bytes_before:
        result.status, result.reason = "skipped", NOTHING_TO_GAIN
        return result
    write_staged(directory, base, frames, fingerprints)
    return result


def commit_partition(data_dir: str, partition: int) -> CommitResult:
    """Commit every output staged for one partition. The caller holds DATA/LOCK."""
    directory = partition_dir(data_dir, partition)
    result = CommitResult(partition)
    try:
        for base in pending_staged(directory):
            outcome = commit_staged(directory, base)
            (result.committed if outcome == "committed" else result.stale).append(base)
    except (LogError, OSError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


# -- the driver ------------------------------------------------------------------------


def run_compaction(
    spark: SparkSession, data_dir: str, tombstone_retention_ms: int, out: Progress | None = None
) -> int:
    """The whole job on an existing session: stage, commit if DATA/LOCK is free, print
    the outcome and the summary line. Returns the exit code."""
    started = time.monotonic()
    data_dir = os.path.abspath(data_dir)
    num_partitions = int(read_meta(data_dir)["num_partitions"])
    cutoff = time.time_ns() // 1_000_000 - tombstone_retention_ms
    sc = spark.sparkContext
    with out or Progress(sc, "compact") as progress:
        progress.describe(f"fold the sealed segments of {num_partitions} state partitions")
        results: list[PartitionCompaction] = (
            sc.parallelize(range(num_partitions), task_count(sc, num_partitions))
            .map(lambda p: compact_partition(data_dir, p, cutoff))
            .collect()
        )
        for result in results:
            if result.status == "failed" or result.reason not in ROUTINE_SKIPS:
                progress.say(f"partition {result.partition}: {result.status}: {result.reason}")
        commits = _commit_if_lock_is_free(spark, data_dir, num_partitions, progress)
    failures = sum(r.status == "failed" for r in results)
    for commit in commits or []:
        if commit.error:
            failures += 1
            print(f"partition {commit.partition}: commit failed: {commit.error}")
        for base in commit.stale:
            print(f"partition {commit.partition}: output staged at {base} was stale: deleted")
    print(COMMITTED_SELF if commits is not None else STAGED_FOR_DAEMON)
    print(summary_line(results, time.monotonic() - started))
    sys.stdout.flush()
    return EXIT_FAILURE if failures else EXIT_OK


def _commit_if_lock_is_free(
    spark: SparkSession, data_dir: str, num_partitions: int, progress: Progress
) -> list[CommitResult] | None:
    """None if the running daemon holds DATA/LOCK (it commits); else the commits made
    under the lock — every staged output, this run's and any earlier run's."""
    try:
        lock = StateLog.open(data_dir, None, lock=True)
    except LogLockedError:
        return None
    with lock:
        waiting = [p for p in range(num_partitions) if pending_staged(partition_dir(data_dir, p))]
        if not waiting:
            return []
        # commit_staged re-verifies each partition's whole log: spread it over the
        # executors, which see the data directory at the same path.
        progress.describe(f"commit the staged output of {len(waiting)} state partitions")
        commits: list[CommitResult] = (
            spark.sparkContext.parallelize(waiting, task_count(spark.sparkContext, len(waiting)))
            .map(lambda p: commit_partition(data_dir, p))
            .collect()
        )
        return commits


def summary_line(results: Sequence[PartitionCompaction], seconds: float) -> str:
    staged = [r for r in results if r.status == "staged"]
    skipped = sum(r.status == "skipped" for r in results)
    failed = sum(r.status == "failed" for r in results)
    return (
        f"compaction: {len(staged)} of {len(results)} partitions compacted "
        f"({skipped} skipped, {failed} failed); "
        f"segments {sum(r.segments_before for r in staged)} -> {len(staged)}; "
        f"bytes {sum(r.bytes_before for r in staged)} -> {sum(r.bytes_after for r in staged)}; "
        f"records {sum(r.records_before for r in staged)} -> "
        f"{sum(r.records_after for r in staged)}; "
        f"keys {sum(r.keys for r in staged)}; "
        f"tombstones dropped {sum(r.tombstones_dropped for r in staged)}; "
        f"{seconds:.1f} s"
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="compact.py", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument(
        "--tombstone-retention-ms", type=int, default=DEFAULT_TOMBSTONE_RETENTION_MS
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    own_session = spark is None
    spark = spark or spark_session("sharecoord-compact")
    try:
        return run_compaction(spark, args.data_dir, args.tombstone_retention_ms)
    finally:
        if own_session:
            spark.stop()


if __name__ == "__main__":
    # spark-submit runs this file as __main__: import it as spark_jobs.compact (from the
    # --py-files zip) so the functions shipped to executors are found there by name.
    from spark_jobs.compact import main as _main

    sys.exit(_main())
