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

Given `--state-store` (the URI best in $SHARECOORD_STATE_STORE) instead of `--data-dir`,
each task reads a state partition of a PostgreSQL store, its history and its log, by
COPY out (spark_jobs/pgsource.py); the rest is the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from persistence import LogError, read_meta
from persistence.history import read_declaration
from protocol.records import (
    DELIVERY_COMPLETE_COUNT,
    GROUP_ID,
    KEY_FIELDS,
    LEADER_EPOCH,
    LOG_OFFSET,
    START_OFFSET,
    STATE_EPOCH,
    STATE_PARTITION,
    FieldType,
    RecordField,
)
from spark_jobs import checkpoint
from spark_jobs.audit_report import DETAIL_TABLE, SAMPLE_ROWS, AuditReport, write_report
from spark_jobs.auditor import (
    DELIVERY_COUNT_BACKWARDS,
    DELIVERY_LIMIT_AVAILABLE,
    MOST_REDELIVERED,
    START_OFFSET_BACKWARDS,
    PartitionAudit,
    Window,
    audit_partition,
    finding_order,
)
from spark_jobs.session import Progress, spark_session, stop_session, task_count
from spark_jobs.storeref import StoreRef, add_state_store_args, state_store_of

__all__ = [
    "DELIVERY_COUNT_BACKWARDS",
    "DELIVERY_LIMIT_AVAILABLE",
    "START_OFFSET_BACKWARDS",
    "PartitionAudit",
    "audit_partition",
]

DEFAULT_DELIVERY_LIMIT = 5  # Kafka's group.share.delivery.count.limit
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_SPARK_TYPES = {
    FieldType.INT32: IntegerType(),
    FieldType.INT64: LongType(),
    FieldType.STRING: StringType(),
}


def _record_column(field: RecordField) -> StructField:
    """A report column that holds a record field: named and typed as the record's."""
    return StructField(field.name, _SPARK_TYPES[field.type], False)


_KEY_COLUMNS = [_record_column(f) for f in KEY_FIELDS]

FINDINGS_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),
        _record_column(STATE_PARTITION),
        _record_column(LOG_OFFSET),
        *_KEY_COLUMNS,
        _record_column(STATE_EPOCH),
        StructField("first_offset", LongType(), False),
        StructField("last_offset", LongType(), False),
        StructField("previous_value", LongType(), True),  # count or start offset before
        StructField("value", LongType(), False),  # ... and after the record
    ]
)
HISTOGRAM_SCHEMA = StructType(
    [
        _record_column(GROUP_ID),
        StructField("delivery_count", IntegerType(), False),
        StructField("offsets", LongType(), False),
    ]
)
RANGES_SCHEMA = StructType(
    [
        *_KEY_COLUMNS,
        StructField("first_offset", LongType(), False),
        StructField("last_offset", LongType(), False),
        StructField("delivery_count", IntegerType(), False),
        StructField("delivery_state", IntegerType(), False),
    ]
)
SHARE_PARTITIONS_SCHEMA = StructType(
    [
        _record_column(STATE_PARTITION),
        *_KEY_COLUMNS,
        _record_column(STATE_EPOCH),
        _record_column(LEADER_EPOCH),
        _record_column(START_OFFSET),
        StructField("batches", IntegerType(), False),  # how many the state holds
        StructField("in_flight", LongType(), False),  # offsets Available or Acquired
        _record_column(DELIVERY_COMPLETE_COUNT),
        StructField("log_records", LongType(), False),
    ]
)

# -- DataFrames (the driver) -----------------------------------------------------------


# The tables besides the findings are small (a row per group and count, the top ranges, a
# row per share-partition) and already on the driver: sorted there in plain Python, not in
# one Spark job each, which cost a daily --since-last run more than its records did.


def delivery_histogram(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Offsets per (group, delivery count), over all state partitions, in that order."""
    totals: dict[tuple[str, int], int] = {}
    for group, count, offsets in rows:
        totals[group, count] = totals.get((group, count), 0) + offsets
    names = HISTOGRAM_SCHEMA.fieldNames()
    return [
        dict(zip(names, (group, count, offsets), strict=True))
        for (group, count), offsets in sorted(totals.items())
    ]


def most_redelivered(
    rows: Iterable[Sequence[Any]], limit: int = MOST_REDELIVERED
) -> list[dict[str, Any]]:
    """The offset ranges with the highest delivery counts; ties by key and first offset."""
    names = RANGES_SCHEMA.fieldNames()
    ordered = sorted(rows, key=lambda r: (-r[5], r[0], r[1], r[2], r[3]))
    return [dict(zip(names, row, strict=True)) for row in ordered[:limit]]


def share_partition_rows(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """The summary per share-partition, by group, topic and partition."""
    names = SHARE_PARTITIONS_SCHEMA.fieldNames()
    ordered = sorted(rows, key=lambda r: (r[1], r[2], r[3]))
    return [dict(zip(names, row, strict=True)) for row in ordered]


FINDINGS_ORDER = (STATE_PARTITION.name, LOG_OFFSET.name, "kind", "first_offset")


def run_audit(
    spark: SparkSession,
    data_dir: str | StoreRef,
    out_dir: str,
    delivery_limit: int,
    since_last: bool = False,
) -> tuple[AuditReport, str]:
    """Audit every state partition of a data directory or a PostgreSQL store (only what
    is new since the checkpoint in `out_dir` with `since_last`); write the detail table
    and the checkpoint to `out_dir`; return the collected report and the detail
    table's path."""
    location, name, num_partitions, history, kept = _location(data_dir)
    previous = checkpoint.read_checkpoint(out_dir) if since_last else None
    priors = checkpoint.load_states(out_dir, previous) if previous else {}
    sc = spark.sparkContext
    prior_states = sc.broadcast(priors)
    # The tables besides the findings are small: a few shuffle partitions are plenty.
    spark.conf.set("spark.sql.shuffle.partitions", str(sc.defaultParallelism))
    with Progress(sc, "audit") as progress:
        what = "what is new since the last audit in" if previous else "the history and log of"
        progress.describe(f"replay and audit {what} {num_partitions} state partitions")
        audits = (
            sc.parallelize(range(num_partitions), task_count(sc, num_partitions))
            .map(
                lambda p: audit_partition(
                    location,
                    p,
                    delivery_limit,
                    prior_states.value.get(p),
                    history=kept,
                    keep_state=True,
                )
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            # Everything but the findings is small: one job brings it to the driver.
            partials = audits.map(lambda a: a.summarized(SAMPLE_ROWS)).collect()
            findings = spark.createDataFrame(audits.flatMap(lambda a: a.findings), FINDINGS_SCHEMA)
            detail_path = os.path.join(out_dir, DETAIL_TABLE)
            progress.describe("write the detail table")
            sorted_findings = findings.coalesce(1).sortWithinPartitions(*FINDINGS_ORDER)
            sorted_findings.write.mode("overwrite").parquet(detail_path)
            counts: dict[str, int] = {}
            for partial in partials:
                for kind, n in partial.finding_counts.items():
                    counts[kind] = counts.get(kind, 0) + n
            sample = sorted((f for a in partials for f in a.first_findings), key=finding_order)
            report = AuditReport(
                data_dir=name,
                delivery_limit=delivery_limit,
                partitions=num_partitions,
                records=sum(a.records for a in partials),
                damaged=[
                    {STATE_PARTITION.name: a.partition, "error": a.error}
                    for a in partials
                    if a.error
                ],
                violation_counts=counts,
                violation_sample=[
                    dict(zip(FINDINGS_SCHEMA.fieldNames(), f, strict=True))
                    for f in sample[:SAMPLE_ROWS]
                ],
                histogram=delivery_histogram(r for a in partials for r in a.histogram),
                most_redelivered=most_redelivered(r for a in partials for r in a.ranges),
                share_partitions=share_partition_rows(
                    r for a in partials for r in a.share_partitions
                ),
                mode="since last" if previous else "full",
                history=history,
                windows=[window_row(a) for a in partials if not a.error],
                earlier_violations=_earlier(partials),
            )
        finally:
            audits.unpersist()
            prior_states.destroy()
    fresh = checkpoint.Checkpoint(
        name, delivery_limit, partitions=dict(previous.partitions) if previous else {}
    )
    states = {a.partition: a.state for a in partials if not a.error and a.state}
    written = checkpoint.write_checkpoint(out_dir, previous, fresh, states)
    report.runs = written.runs
    return report, detail_path


def window_row(audit: PartitionAudit) -> dict[str, Any]:
    """A state partition's window, this run's and since the checkpoint began."""

    def side(window: Window) -> dict[str, Any]:
        return {
            "first_offset": window.first_offset,
            "last_offset": window.last_offset,
            "first_time": _iso(window.first_timestamp),
            "last_time": _iso(window.last_timestamp),
            "records": window.records,
        }

    return {
        STATE_PARTITION.name: audit.partition,
        **side(audit.window),
        "missing_offsets": audit.since.missing,
        "gaps": [list(g) for g in audit.since.gaps],
        "since": side(audit.since),
    }


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="seconds")


def _earlier(partials: list[PartitionAudit]) -> dict[str, int]:
    total: dict[str, int] = {}
    for audit in partials:
        for kind, n in audit.violations_before.items():
            total[kind] = total.get(kind, 0) + n
    return total


def _location(
    data_dir: str | StoreRef,
) -> tuple[str | StoreRef, str, int, str | None, bool]:
    """What the audit reads (a data directory's absolute path, or the store), its name
    in the report and the checkpoint, its number of state partitions, where its history
    is (None if it keeps none), and whether it keeps one."""
    if isinstance(data_dir, StoreRef):
        # Only here: the driver (psycopg) is needed on the PostgreSQL store alone.
        from spark_jobs.pgsource import store_facts  # noqa: PLC0415

        facts = store_facts(data_dir)
        kept = facts.history_retention_ms is not None
        table = f"{data_dir.schema}.sharecoord_history" if kept else None
        return data_dir, str(data_dir), facts.num_partitions, table, kept
    path = os.path.abspath(data_dir)
    num_partitions = int(read_meta(path)["num_partitions"])
    return path, path, num_partitions, _history_of(path), True


def _history_of(data_dir: str) -> str | None:
    try:
        config = read_declaration(data_dir)
    except LogError as exc:
        return f"unreadable: {exc}"
    return None if config is None else config.root


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="audit.py", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None)
    add_state_store_args(parser)
    parser.add_argument("--out", required=True)
    parser.add_argument("--delivery-limit", type=int, default=DEFAULT_DELIVERY_LIMIT)
    parser.add_argument("--since-last", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    out_dir = os.path.abspath(args.out)
    store = state_store_of(args, "audit")
    location: str | StoreRef = args.data_dir if store is None else store
    problem = checkpoint.problem(out_dir, str(location), args.delivery_limit, args.since_last)
    if problem is not None:
        print(f"audit: {problem}", file=sys.stderr)
        return EXIT_USAGE
    own_session = spark is None
    spark = spark or spark_session("sharecoord-audit", reads_store=store is not None)
    try:
        os.makedirs(out_dir, exist_ok=True)
        report, _ = run_audit(spark, location, out_dir, args.delivery_limit, args.since_last)
        page = write_report(report, out_dir)
    except LogError as exc:  # the store unreachable, or no store there: one line
        print(f"audit: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if own_session:
            stop_session(spark)
    print(summary_line(report, page, time.monotonic() - started))
    sys.stdout.flush()
    return EXIT_FAILURE if report.violations or report.damaged else EXIT_OK


def summary_line(report: AuditReport, page: str, seconds: float) -> str:
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(report.violation_counts.items()))
    earlier = sum(report.earlier_violations.values())
    scope = "new " if report.mode == "since last" else ""
    return (
        f"audit result: {report.partitions} partitions ({len(report.damaged)} unreadable), "
        f"{report.records} {scope}records, {len(report.share_partitions)} share-partitions, "
        f"{report.violations} {scope}violations{f' ({kinds})' if kinds else ''}"
        f"{f', {earlier} found by earlier runs' if earlier else ''}; "
        f"{window_summary(report)}; report {page}; {seconds:.1f} s"
    )


def window_summary(report: AuditReport) -> str:
    """The window an audit covered, in a phrase: its time span, and what is missing."""
    seen = [w for w in report.windows if w["records"]]
    if not seen:
        return "window: no records"
    first = min(w["first_time"] for w in seen)
    last = max(w["last_time"] for w in seen)
    missing = sum(w["missing_offsets"] for w in report.windows)
    holes = f", {missing} offsets missing (folded or expired before any history held them)"
    return (
        f"window: {first} .. {last} over {len(seen)} state partitions"
        f"{holes if missing else ''}; history: {report.history or 'none kept'}"
    )


if __name__ == "__main__":
    # spark-submit runs this file as __main__: import it as spark_jobs.audit (from the
    # --py-files zip) so the functions shipped to executors are found there by name.
    from spark_jobs.audit import main as _main

    sys.exit(_main())
