"""Compaction: fold each state partition's sealed segments into one segment holding one
ShareSnapshot per live key, staged for the crash-safe swap (docs/design.md#compaction-and-its-swap).

Run it with `sharecoord compact --data-dir DIR [--master URL]`, or by hand from the
repository root, with a Python that has the project's dependencies as PYSPARK_PYTHON
(the zip ships the pure packages to the executors; `sharecoord compact` does the same):

    python3 -m zipfile -c sharecoord.zip protocol persistence spark_jobs
    spark-submit --master 'local[*]' --py-files sharecoord.zip \\
        spark_jobs/compact.py --data-dir /data --tombstone-retention-ms 86400000

State partitions are the unit of parallelism: each is handled whole by one task (a
task takes a few partitions, session.TASKS_PER_CORE, grouped by their sealed bytes so
that the tasks weigh about the same: session.balanced_groups), which reads its sealed
segments present when it starts (all but the newest, which the daemon appends to and
which is never touched), folds them (spark_jobs/fold.py) and stages `<base>.cleaned` +
`<base>.manifest` in DATA/partitions/<p>/compaction/. No record is shuffled: a
partition's records never leave its task.

Then the handshake: whoever holds DATA/LOCK commits. The driver tries to take it; if it
can, it commits every staged output itself (in tasks again, while it holds the lock)
and prints `committed: self`; if the daemon holds it, it prints `staged: the
running daemon commits it` (the daemon's periodic scan, or
`POST /v1/admin/compaction/commit`). Then one summary line. Exit 0, or 1 if a partition
could not be compacted (damage, or records the daemon could not load).

Given `--state-store` (the URI best in $SHARECOORD_STATE_STORE, where `ps` does not show
it) instead of `--data-dir`, the job compacts a PostgreSQL store: spark_jobs/pgcompact.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING

from persistence import (
    DEFAULT_SEGMENT_BYTES,
    LogError,
    LogLockedError,
    SegmentInfo,
    StateLog,
    commit_staged,
    list_segments,
    partition_dir,
    pending_staged,
    read_meta,
    write_staged,
)
from persistence.history import (
    DEFAULT_RETENTION_MS,
    HistoryConfig,
    SegmentExport,
    expire,
    fingerprint,
    read_declaration,
    read_exports,
    remove_declaration,
    resolve_dir,
    watermark,
    write_declaration,
    write_marker,
)
from persistence.segments import segment_name
from persistence.staging import SegmentFingerprint
from protocol.records import RecordDecodeError, RecordDecoder
from spark_jobs.columns import DecodedValues, Value, collector_paused, decode_values
from spark_jobs.fold import encode_frames, fold_records
from spark_jobs.history import SegmentRecords, export_segment
from spark_jobs.preflight import anything_to_compact
from spark_jobs.sealed import RawRecord, iter_sealed_segments
from spark_jobs.session import Progress, balanced_groups, spark_session, stop_session, task_count
from spark_jobs.storeref import StoreRef, add_state_store_args, state_store_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Kafka's delete.retention.ms.
DEFAULT_TOMBSTONE_RETENTION_MS = 86_400_000

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

COMMITTED_SELF = "committed: self"
STAGED_FOR_DAEMON = "staged: the running daemon commits it"


NO_SEALED_SEGMENT = "no sealed segment"
NOTHING_SEALED = "nothing to compact: no sealed segments"
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
    exported_segments: int = 0  # segments written to the history by this run
    exported_records: int = 0


@dataclass
class CommitResult:
    partition: int
    committed: list[int] = field(default_factory=list)  # base offsets
    stale: list[int] = field(default_factory=list)
    error: str = ""


# -- one partition (runs in an executor) -----------------------------------------------


@collector_paused
def compact_partition(
    data_dir: str, partition: int, tombstone_cutoff_ms: int, history_root: str | None = None
) -> PartitionCompaction:
    """Export to the history (if `history_root`), fold and stage one state partition's
    sealed segments; never raises for the log's own problems (they come back as a
    "failed" result)."""
    directory = partition_dir(data_dir, partition)
    try:
        return _compact(directory, partition, tombstone_cutoff_ms, history_root)
    except FileNotFoundError as exc:
        # A prune or an earlier compaction's swap replaced a segment while it was read.
        return PartitionCompaction(
            partition, "skipped", f"the segments changed while being read ({exc}); run again"
        )
    except (LogError, RecordDecodeError, OSError, TypeError, ValueError) as exc:
        return PartitionCompaction(partition, "failed", f"{type(exc).__name__}: {exc}")


def _compact(
    directory: str, partition: int, tombstone_cutoff_ms: int, history_root: str | None
) -> PartitionCompaction:
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
    read = _read_sealed(segments)
    records: list[RawRecord] = list(chain.from_iterable(segment.records for segment in read))
    values: list[Value] = list(chain.from_iterable(segment.decoded.values for segment in read))
    result = PartitionCompaction(partition, "staged", base=base, segments_before=len(sealed))
    if history_root is not None:
        # Before anything is staged: the swap may only ever delete what the history has.
        _export(history_root, partition, read, result)
    folded = fold_records(records, tombstone_cutoff_ms=tombstone_cutoff_ms, values=values)
    frames = encode_frames(folded.records)
    result.bytes_before = sum(s.size for s in read)
    result.bytes_after = sum(len(frame) for frame in frames)
    result.records_before = len(records)
    result.records_after = len(frames)
    result.keys = folded.keys
    result.tombstones_dropped = folded.tombstones_dropped
    if len(sealed) == 1 and result.bytes_after >= result.bytes_before:
        result.status, result.reason = "skipped", NOTHING_TO_GAIN
        return result
    fingerprints = [s.fingerprint for s in read]
    write_staged(directory, base, frames, fingerprints)
    if history_root is not None and frames:
        # The output holds offsets below the watermark only (it stands for records
        # exported above): its marker takes no records, and lets a prune delete it.
        last = frames[-1]
        write_marker(
            history_root,
            SegmentExport(
                partition=partition,
                segment=fingerprint(
                    segment_name(base), result.bytes_after, int.from_bytes(last[4:8], "big")
                ),
                first_offset=folded.records[0][0],
                last_offset=folded.records[-1][0],
                records=0,
                exported_at=time.time_ns() // 1_000_000,
            ),
        )
    return result


@dataclass
class _SealedRead:
    """One sealed segment as read for compaction."""

    name: str
    fingerprint: SegmentFingerprint
    records: list[RawRecord]
    decoded: DecodedValues

    @property
    def size(self) -> int:
        return self.fingerprint.size


def _read_sealed(segments: Sequence[SegmentInfo]) -> list[_SealedRead]:
    """Every sealed segment (all but the newest), verified and decoded."""
    return [
        _SealedRead(
            os.path.basename(segment.path),
            read.fingerprint,
            read.records,
            decode_values(read.records),
        )
        for segment, read in iter_sealed_segments(segments)
    ]


def _export(
    root: str, partition: int, read: list[_SealedRead], result: PartitionCompaction
) -> None:
    """Write every sealed segment the history lacks (records at or above the watermark),
    oldest first, each finished by its marker."""
    exports = read_exports(root, partition)
    done = {e.segment for e in exports}
    high = watermark(exports)
    decoder = RecordDecoder()
    for segment in read:
        fp = segment.fingerprint
        name = fingerprint(segment.name, fp.size, fp.last_frame_crc)
        if name in done:
            continue
        export = export_segment(
            root,
            partition,
            SegmentRecords(segment.name, name, segment.records, segment.decoded),
            high,
            decoder,
        )
        high = max(high, export.covered_end)
        result.exported_segments += 1
        result.exported_records += export.records


def sealed_bytes(data_dir: str, partition: int) -> int:
    """The bytes of a state partition's sealed segments: what compacting it reads. Only
    a weight for grouping the partitions into tasks: a partition that cannot be listed
    now (a segment pruned meanwhile, a damaged manifest) weighs 0, and its task says
    what is wrong with it."""
    try:
        segments = list_segments(partition_dir(data_dir, partition))
    except (LogError, OSError, ValueError):
        return 0
    return sum(s.size_bytes for s in segments[:-1])


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
    spark: SparkSession,
    data_dir: str,
    tombstone_retention_ms: int,
    out: Progress | None = None,
    history: HistoryConfig | None = None,
) -> int:
    """The whole job on an existing session: export, stage, commit if DATA/LOCK is free,
    expire old history, print the outcome and the summary line. Returns the exit code.
    `history` None keeps no history (and drops the data directory's declaration)."""
    started = time.monotonic()
    data_dir = os.path.abspath(data_dir)
    num_partitions = int(read_meta(data_dir)["num_partitions"])
    cutoff = time.time_ns() // 1_000_000 - tombstone_retention_ms
    history_root = None if history is None else history.root
    if history is None:
        remove_declaration(data_dir)
    else:
        # Declared before the first export: from now on the daemon prunes only what the
        # history holds.
        write_declaration(data_dir, history)
    sc = spark.sparkContext
    with out or Progress(sc, "compact") as progress:
        progress.describe(
            f"fold the sealed segments of {num_partitions} state partitions"
            + ("" if history is None else ", exporting them to the history first")
        )
        groups = balanced_groups(
            [sealed_bytes(data_dir, p) for p in range(num_partitions)],
            task_count(sc, num_partitions),
        )
        results: list[PartitionCompaction] = sorted(
            sc.parallelize(groups, len(groups))
            .flatMap(
                lambda group: [compact_partition(data_dir, p, cutoff, history_root) for p in group]
            )
            .collect(),
            key=lambda result: result.partition,
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
    if history is not None:
        now = time.time_ns() // 1_000_000
        expired = expire(history.root, data_dir, range(num_partitions), now, history.retention_ms)
        if expired.days:
            print(f"history: expired {len(expired.days)} partition-days older than the retention")
    if all(r.reason == NO_SEALED_SEGMENT for r in results) and not commits:
        print(NOTHING_SEALED)
    else:
        print(COMMITTED_SELF if commits is not None else STAGED_FOR_DAEMON)
    print(summary_line(results, time.monotonic() - started, history))
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


def summary_line(
    results: Sequence[PartitionCompaction], seconds: float, history: HistoryConfig | None = None
) -> str:
    staged = [r for r in results if r.status == "staged"]
    skipped = sum(r.status == "skipped" for r in results)
    failed = sum(r.status == "failed" for r in results)
    if history is None:
        kept = "history: none kept"
    else:
        kept = (
            f"history: {sum(r.exported_records for r in results)} records of "
            f"{sum(r.exported_segments for r in results)} segments exported to {history.root}"
        )
    return (
        f"compaction: {len(staged)} of {len(results)} partitions compacted "
        f"({skipped} skipped, {failed} failed); "
        f"segments {sum(r.segments_before for r in staged)} -> {len(staged)}; "
        f"bytes {sum(r.bytes_before for r in staged)} -> {sum(r.bytes_after for r in staged)}; "
        f"records {sum(r.records_before for r in staged)} -> "
        f"{sum(r.records_after for r in staged)}; "
        f"keys {sum(r.keys for r in staged)}; "
        f"tombstones dropped {sum(r.tombstones_dropped for r in staged)}; "
        f"{kept}; {seconds:.1f} s"
    )


def history_config(
    data_dir: str, history_dir: str | None, retention_ms: int
) -> HistoryConfig | None:
    """The history the job keeps: None if `retention_ms` is 0. A data directory that
    already declares a history elsewhere is refused (ValueError): its history would be
    split in two."""
    if retention_ms == 0:
        return None
    root = resolve_dir(data_dir, history_dir)
    declared = read_declaration(data_dir)
    if declared is not None and history_dir is not None and declared.root != root:
        raise ValueError(
            f"{data_dir} keeps its history at {declared.root}, not {root}: move that "
            f"directory and remove {data_dir}/history.json first"
        )
    if declared is not None and history_dir is None:
        root = declared.root
    return HistoryConfig(root, retention_ms)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="compact.py", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None)
    add_state_store_args(parser)
    parser.add_argument(
        "--tombstone-retention-ms", type=int, default=DEFAULT_TOMBSTONE_RETENTION_MS
    )
    parser.add_argument("--history-dir", default=None)
    parser.add_argument("--history-retention-ms", type=int, default=DEFAULT_RETENTION_MS)
    parser.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    store = state_store_of(args, "compact")
    if store is not None:
        return _on_store(store, args, spark)
    try:
        history = history_config(args.data_dir, args.history_dir, args.history_retention_ms)
    except ValueError as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not anything_to_compact(args.data_dir):
        # Said before a Spark session starts: there is nothing for it to do.
        print(f"{NOTHING_SEALED} (segments roll at {args.segment_bytes} bytes)")
        return EXIT_OK
    own_session = spark is None
    spark = spark or spark_session("sharecoord-compact")
    try:
        return run_compaction(spark, args.data_dir, args.tombstone_retention_ms, history=history)
    finally:
        if own_session:
            stop_session(spark)


def _on_store(store: StoreRef, args: argparse.Namespace, spark: SparkSession | None) -> int:
    """The job over a PostgreSQL store (spark_jobs/pgcompact.py)."""
    # Only here: the driver (psycopg) is needed on the PostgreSQL store alone.
    from spark_jobs import pgcompact  # noqa: PLC0415

    own_session = spark is None
    spark = spark or spark_session("sharecoord-compact", reads_store=True)
    try:
        return pgcompact.run_compaction(
            spark, store, args.tombstone_retention_ms, args.history_retention_ms
        )
    except LogError as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if own_session:
            stop_session(spark)


if __name__ == "__main__":
    # spark-submit runs this file as __main__: import it as spark_jobs.compact (from the
    # --py-files zip) so the functions shipped to executors are found there by name.
    from spark_jobs.compact import main as _main

    sys.exit(_main())
