"""Audit: replay the whole state log and check the delivery counts it holds.

Run it with `sharecoord audit --data-dir DIR --out DIR [--delivery-limit N]`, or by hand
from the repository root, with a Python that has the project's dependencies as
PYSPARK_PYTHON (the zip ships the pure packages to the executors; `sharecoord audit`
does the same):

    python3 -m zipfile -c sharecoord.zip protocol persistence spark_jobs
    spark-submit --master 'local[*]' --py-files sharecoord.zip \\
        spark_jobs/audit.py --data-dir /data --out /data/audit --delivery-limit 5

One task per state partition reads every segment, the active one included (read-only:
a frame being written at its end is left out, as recovery would), and replays each
share-partition's history with the daemon's replay (protocol.replay), comparing each
record's resulting state with the state before it:

* delivery_limit_available: offsets Available (0) with a delivery count at or over the
  delivery limit (Kafka's group.share.delivery.count.limit, default 5): they should
  have been archived. Reported when they first become so.
* delivery_count_backwards: offsets covered before and after a record whose delivery
  count went down while the state epoch stayed the same.
* start_offset_backwards: the start offset went down within a state epoch (an unset
  start offset, -1, is not compared).

Every finding is a violation; any violation, or a partition that cannot be read, makes
the exit code 1. Also reported: the delivery-count histogram per group (each offset
counted once, with the count it had when it left the state or at the end), the most
redelivered offset ranges, and a state summary per share-partition. Output in --out:
summary.json, violations.parquet (the detail table), delivery_counts.png and
index.html (spark_jobs/audit_report.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from persistence import LogError, partition_dir, read_meta, read_partition
from protocol.batches import ACQUIRED, AVAILABLE, StateBatch
from protocol.records import RecordDecodeError, RecordDecoder, ShareKey
from protocol.replay import ShareGroupOffset, ShareStateMap
from spark_jobs.audit_report import DETAIL_TABLE, SAMPLE_ROWS, write_report
from spark_jobs.session import Progress, spark_session, task_count

DEFAULT_DELIVERY_LIMIT = 5  # Kafka's group.share.delivery.count.limit
MOST_REDELIVERED = 20
EXIT_OK = 0
EXIT_FAILURE = 1

DELIVERY_LIMIT_AVAILABLE = "delivery_limit_available"
DELIVERY_COUNT_BACKWARDS = "delivery_count_backwards"
START_OFFSET_BACKWARDS = "start_offset_backwards"

FINDINGS_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("state_partition", IntegerType(), False),
        StructField("log_offset", LongType(), False),
        StructField("group_id", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("state_epoch", IntegerType(), False),
        StructField("first_offset", LongType(), False),
        StructField("last_offset", LongType(), False),
        StructField("previous_value", LongType(), True),  # count or start offset before
        StructField("value", LongType(), False),  # ... and after the record
    ]
)
HISTOGRAM_SCHEMA = StructType(
    [
        StructField("group_id", StringType(), False),
        StructField("delivery_count", IntegerType(), False),
        StructField("offsets", LongType(), False),
    ]
)
RANGES_SCHEMA = StructType(
    [
        StructField("group_id", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("first_offset", LongType(), False),
        StructField("last_offset", LongType(), False),
        StructField("delivery_count", IntegerType(), False),
        StructField("delivery_state", IntegerType(), False),
    ]
)
SHARE_PARTITIONS_SCHEMA = StructType(
    [
        StructField("state_partition", IntegerType(), False),
        StructField("group_id", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("state_epoch", IntegerType(), False),
        StructField("leader_epoch", IntegerType(), False),
        StructField("start_offset", LongType(), False),
        StructField("batches", IntegerType(), False),
        StructField("in_flight", LongType(), False),  # offsets Available or Acquired
        StructField("delivery_complete_count", IntegerType(), False),
        StructField("log_records", LongType(), False),
    ]
)

Piece = tuple[int, int, int, int]  # first, last, delivery_state, delivery_count


@dataclass
class PartitionAudit:
    """One state partition's replay, as rows of the schemas above."""

    partition: int
    records: int = 0
    error: str = ""
    findings: list[tuple[Any, ...]] = field(default_factory=list)
    histogram: list[tuple[str, int, int]] = field(default_factory=list)
    ranges: list[tuple[Any, ...]] = field(default_factory=list)  # the most redelivered
    share_partitions: list[tuple[Any, ...]] = field(default_factory=list)


# -- one partition (runs in an executor) -----------------------------------------------


# A running daemon may prune or swap segments while they are read: read again.
READ_ATTEMPTS = 3


def audit_partition(data_dir: str, partition: int, delivery_limit: int) -> PartitionAudit:
    """Replay one state partition and audit every record's effect."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        audit = _Auditor(partition, delivery_limit)
        decoder = RecordDecoder()
        try:
            for frame in read_partition(partition_dir(data_dir, partition)):
                record = decoder.decode(frame.record_type, frame.key, frame.value)
                audit.replay(frame.offset, record.key, record)
        except FileNotFoundError as exc:
            if attempt == READ_ATTEMPTS:
                return PartitionAudit(partition, audit.records, f"the log kept changing: {exc}")
            continue
        except (LogError, RecordDecodeError, OSError, TypeError, ValueError) as exc:
            return PartitionAudit(partition, audit.records, f"{type(exc).__name__}: {exc}")
        return audit.finish()
    raise AssertionError("unreachable")


class _Auditor:
    def __init__(self, partition: int, delivery_limit: int) -> None:
        self.partition = partition
        self.delivery_limit = delivery_limit
        self.records = 0
        self.state = ShareStateMap(records_per_snapshot=500)
        self.result = PartitionAudit(partition)
        self.histogram: dict[tuple[str, int], int] = {}
        self.log_records: dict[ShareKey, int] = {}
        self.open_range: dict[ShareKey, Piece] = {}  # retired pieces merge while contiguous
        self.redelivered: list[tuple[Any, ...]] = []

    def replay(self, offset: int, key: ShareKey, record: Any) -> None:
        self.records += 1
        self.log_records[key] = self.log_records.get(key, 0) + 1
        before = self.state.get(key)
        previous = before.state if before is not None else None
        self.state.replay(offset, record)
        after = self.state.get(key)
        current = after.state if after is not None else None
        if current is None:  # a tombstone: everything leaves
            if previous is not None:
                self._retire(key, previous.state_batches, [])
            self._close_range(key)
            self.log_records.pop(key, None)
            return
        same_epoch = previous is not None and previous.state_epoch == current.state_epoch
        if previous is not None:
            self._retire(key, previous.state_batches, current.state_batches)
        if previous is not None and same_epoch:
            self._check_backwards(offset, key, previous, current)
        limit_before = _over_limit(previous, self.delivery_limit) if same_epoch else []
        over_limit = _minus(_over_limit(current, self.delivery_limit), limit_before)
        for first, last, _, count in over_limit:
            self._finding(DELIVERY_LIMIT_AVAILABLE, offset, key, current, first, last, None, count)

    def _check_backwards(
        self, offset: int, key: ShareKey, previous: ShareGroupOffset, current: ShareGroupOffset
    ) -> None:
        afters = current.state_batches
        # Batches are sorted by first offset: those ending before this `before` starts
        # end before every later one starts too, so the scan resumes past them.
        start = 0
        for before in previous.state_batches:
            while start < len(afters) and afters[start].last_offset < before.first_offset:
                start += 1
            for after in afters[start:]:
                if after.first_offset > before.last_offset:
                    break
                first = max(before.first_offset, after.first_offset)
                last = min(before.last_offset, after.last_offset)
                if first <= last and after.delivery_count < before.delivery_count:
                    self._finding(
                        DELIVERY_COUNT_BACKWARDS,
                        offset,
                        key,
                        current,
                        first,
                        last,
                        before.delivery_count,
                        after.delivery_count,
                    )
        start_before, start_after = previous.start_offset, current.start_offset
        if 0 <= start_after < start_before:
            self._finding(
                START_OFFSET_BACKWARDS,
                offset,
                key,
                current,
                start_after,
                start_before - 1,
                start_before,
                start_after,
            )

    def _finding(
        self,
        kind: str,
        offset: int,
        key: ShareKey,
        state: ShareGroupOffset,
        first: int,
        last: int,
        previous_value: int | None,
        value: int,
    ) -> None:
        self.result.findings.append(
            (
                kind,
                self.partition,
                offset,
                key.group_id,
                key.topic_id,
                key.partition,
                state.state_epoch,
                first,
                last,
                previous_value,
                value,
            )
        )

    def _retire(self, key: ShareKey, before: list[StateBatch], after: list[StateBatch]) -> None:
        """Offsets covered before and not after leave the state with the count they had:
        into the histogram, and into the candidates for the most redelivered."""
        for piece in _minus(_pieces(before), _pieces(after)):
            first, last, state, count = piece
            bucket = (key.group_id, count)
            self.histogram[bucket] = self.histogram.get(bucket, 0) + last - first + 1
            open_piece = self.open_range.get(key)
            if (
                open_piece is not None
                and open_piece[1] + 1 == first
                and open_piece[2:]
                == (
                    state,
                    count,
                )
            ):
                self.open_range[key] = (open_piece[0], last, state, count)
                continue
            self._close_range(key)
            self.open_range[key] = piece

    def _close_range(self, key: ShareKey) -> None:
        piece = self.open_range.pop(key, None)
        if piece is None or piece[3] < 2:  # redelivered: delivered more than once
            return
        first, last, state, count = piece
        self.redelivered.append(
            (key.group_id, key.topic_id, key.partition, first, last, count, state)
        )
        if len(self.redelivered) > 50 * MOST_REDELIVERED:
            self.redelivered = _most_redelivered(self.redelivered)

    def finish(self) -> PartitionAudit:
        result = self.result
        result.records = self.records
        for key, entry in self.state.keys.items():
            state = entry.state
            self._retire(key, state.state_batches, [])
            self._close_range(key)
            in_flight = sum(
                b.last_offset - max(b.first_offset, state.start_offset, 0) + 1
                for b in state.state_batches
                if b.delivery_state in (AVAILABLE, ACQUIRED)
                and b.last_offset >= max(state.start_offset, 0)
            )
            result.share_partitions.append(
                (
                    self.partition,
                    key.group_id,
                    key.topic_id,
                    key.partition,
                    state.state_epoch,
                    state.leader_epoch,
                    state.start_offset,
                    len(state.state_batches),
                    in_flight,
                    state.delivery_complete_count,
                    self.log_records.get(key, 0),
                )
            )
        result.histogram = [(g, c, n) for (g, c), n in sorted(self.histogram.items())]
        result.ranges = _most_redelivered(self.redelivered)
        return result


def _pieces(batches: list[StateBatch]) -> list[Piece]:
    """The batches as ``(first, last, state, count)`` tuples, sorted."""
    return sorted(
        (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in batches
    )


def _over_limit(state: ShareGroupOffset | None, limit: int) -> list[Piece]:
    if state is None:
        return []
    return [p for p in _pieces(state.state_batches) if p[2] == AVAILABLE and p[3] >= limit]


def _minus(pieces: list[Piece], remove: list[Piece]) -> list[Piece]:
    """The parts of `pieces` (sorted) not covered by any of `remove`."""
    out: list[Piece] = []
    start = 0  # removals ending before a piece starts end before every later piece too
    for first, last, state, count in pieces:
        cursor = first
        while start < len(remove) and remove[start][1] < first:
            start += 1
        for index in range(start, len(remove)):
            r_first, r_last, _, _ = remove[index]
            if r_first > last:
                break
            if r_last < cursor:
                continue
            if r_first > cursor:
                out.append((cursor, r_first - 1, state, count))
            cursor = max(cursor, r_last + 1)
            if cursor > last:
                break
        if cursor <= last:
            out.append((cursor, last, state, count))
    return out


def _most_redelivered(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=_redelivered_order)[:MOST_REDELIVERED]


def _redelivered_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    group_id, topic_id, partition, first, _, count, _ = row
    return (-count, group_id, topic_id, partition, first)


# -- DataFrames (the driver) -----------------------------------------------------------


def delivery_histogram(histogram: DataFrame) -> DataFrame:
    """Offsets per (group, delivery count), over all state partitions."""
    return (
        histogram.groupBy("group_id", "delivery_count")
        .agg(F.sum("offsets").cast(LongType()).alias("offsets"))
        .orderBy("group_id", "delivery_count")
    )


def most_redelivered(ranges: DataFrame, limit: int = MOST_REDELIVERED) -> DataFrame:
    """The offset ranges with the highest delivery counts."""
    return ranges.orderBy(
        F.desc("delivery_count"), "group_id", "topic_id", "partition", "first_offset"
    ).limit(limit)


def violation_counts(findings: DataFrame) -> DataFrame:
    return findings.groupBy("kind").agg(F.count("*").alias("violations")).orderBy("kind")


FINDINGS_ORDER = ("state_partition", "log_offset", "kind", "first_offset")
SHARE_PARTITION_ORDER = ("group_id", "topic_id", "partition")


def ordered_findings(findings: DataFrame) -> DataFrame:
    return findings.orderBy(*FINDINGS_ORDER)


@dataclass
class AuditReport:
    """What the driver collected, for the report files (audit_report.py)."""

    data_dir: str
    delivery_limit: int
    partitions: int
    records: int
    damaged: list[dict[str, Any]]
    violation_counts: dict[str, int]
    violation_sample: list[dict[str, Any]]
    histogram: list[dict[str, Any]]
    most_redelivered: list[dict[str, Any]]
    share_partitions: list[dict[str, Any]]

    @property
    def violations(self) -> int:
        return sum(self.violation_counts.values())


def run_audit(
    spark: SparkSession, data_dir: str, out_dir: str, delivery_limit: int
) -> tuple[AuditReport, str]:
    """Audit every state partition; write the detail table to `out_dir`; return the
    collected report and the detail table's path."""
    data_dir = os.path.abspath(data_dir)
    num_partitions = int(read_meta(data_dir)["num_partitions"])
    sc = spark.sparkContext
    # The tables besides the findings are small: a few shuffle partitions are plenty.
    spark.conf.set("spark.sql.shuffle.partitions", str(sc.defaultParallelism))
    with Progress(sc, "audit") as progress:
        progress.describe(f"replay and audit {num_partitions} state partitions")
        audits = (
            sc.parallelize(range(num_partitions), task_count(sc, num_partitions))
            .map(lambda p: audit_partition(data_dir, p, delivery_limit))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            # Everything but the findings is small: one job brings it to the driver.
            partials = audits.map(lambda a: replace(a, findings=[])).collect()
            findings = spark.createDataFrame(audits.flatMap(lambda a: a.findings), FINDINGS_SCHEMA)
            detail_path = os.path.join(out_dir, DETAIL_TABLE)
            progress.describe("write the detail table")
            sorted_findings = findings.coalesce(1).sortWithinPartitions(*FINDINGS_ORDER)
            sorted_findings.write.mode("overwrite").parquet(detail_path)
            progress.describe("summarize")
            report = AuditReport(
                data_dir=data_dir,
                delivery_limit=delivery_limit,
                partitions=num_partitions,
                records=sum(a.records for a in partials),
                damaged=[{"partition": a.partition, "error": a.error} for a in partials if a.error],
                violation_counts={
                    row["kind"]: row["violations"] for row in violation_counts(findings).collect()
                },
                violation_sample=_rows(ordered_findings(findings).limit(SAMPLE_ROWS)),
                histogram=_rows(delivery_histogram(_local(spark, partials, "histogram"))),
                most_redelivered=_rows(most_redelivered(_local(spark, partials, "ranges"))),
                share_partitions=_rows(
                    _local(spark, partials, "share_partitions").orderBy(*SHARE_PARTITION_ORDER)
                ),
            )
        finally:
            audits.unpersist()
    return report, detail_path


_SCHEMAS = {
    "histogram": HISTOGRAM_SCHEMA,
    "ranges": RANGES_SCHEMA,
    "share_partitions": SHARE_PARTITIONS_SCHEMA,
}


def _local(spark: SparkSession, partials: list[PartitionAudit], table: str) -> DataFrame:
    rows = [row for audit in partials for row in getattr(audit, table)]
    return spark.createDataFrame(rows, _SCHEMAS[table])


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="audit.py", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--delivery-limit", type=int, default=DEFAULT_DELIVERY_LIMIT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    own_session = spark is None
    spark = spark or spark_session("sharecoord-audit")
    try:
        out_dir = os.path.abspath(args.out)
        os.makedirs(out_dir, exist_ok=True)
        report, _ = run_audit(spark, args.data_dir, out_dir, args.delivery_limit)
        page = write_report(report, out_dir)
    finally:
        if own_session:
            spark.stop()
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(report.violation_counts.items()))
    print(
        f"audit result: {report.partitions} partitions ({len(report.damaged)} unreadable), "
        f"{report.records} records, {len(report.share_partitions)} share-partitions, "
        f"{report.violations} violations{f' ({kinds})' if kinds else ''}; "
        f"report {page}; {time.monotonic() - started:.1f} s"
    )
    sys.stdout.flush()
    return EXIT_FAILURE if report.violations or report.damaged else EXIT_OK


if __name__ == "__main__":
    # spark-submit runs this file as __main__: import it as spark_jobs.audit (from the
    # --py-files zip) so the functions shipped to executors are found there by name.
    from spark_jobs.audit import main as _main

    sys.exit(_main())
