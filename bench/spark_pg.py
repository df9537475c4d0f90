"""The Spark jobs on the PostgreSQL store beside the local store, in one run, on the same
1M records (`--only spark-pg`): compaction and the full audit end to end
(`sharecoord compact|audit --master local[2]`, JVM start included), the data source's
scan on a warm session, and the raw read of every record (a task's COPY out, in one
process), each on a data directory and on a store holding the same records.

The log is bench/logs.py's (the daemon's own records); the store is a PostgreSQL server
the bench starts (tests/postgres.py, as `--only cluster` does), filled with the same
records through the store's own commit cycle. Each compaction runs on a fresh copy.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.logs import NUM_PARTITIONS, build_log
from bench.spark import _cli, _label, _row, segment_bytes_for
from persistence import partition_dir, read_partition
from persistence.postgres import PostgresStore
from tests.postgres import PostgresServer, running_servers, server_root

SCHEMA = "bench_spark"
COPY_SCHEMA = "bench_spark_compact"
CYCLE_RECORDS = 20_000
LEASE_MS = 3_600_000


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    with server_root() as root, running_servers() as servers:
        server = PostgresServer.primary(root, "bench-spark")
        servers.append(server)
        yield server


def fill_store(data_dir: Path, uri: str, schema: str) -> int:
    """Every record of the data directory, at its offsets, into a new store."""
    written = 0
    with PostgresStore.open(uri, NUM_PARTITIONS, 1, schema=schema) as store:
        for p in range(NUM_PARTITIONS):
            assert store.claim(p, LEASE_MS) is not None
            part = store.partition(p)
            part.open()
            for frame in read_partition(partition_dir(str(data_dir), p)):
                part.append(frame.record_type, frame.key, frame.value, frame.timestamp)
                written += 1
                if part.log_end_offset % CYCLE_RECORDS == 0:
                    _commit(store, p)
            _commit(store, p)
    return written


def _commit(store: PostgresStore, p: int) -> None:
    batch = store.partition(p).take_pending()
    if batch is not None:
        result = store.commit_cycle([(p, batch)])
        if result.shared is not None or any(result.errors):
            raise RuntimeError(f"filling the store: {result}")


def raw_reads(data_dir: Path, uri: str, schema: str) -> list[dict[str, Any]]:
    """Every record read once, in one process: the segments, and the store by COPY out
    (what a task of the jobs runs, before any decoding)."""
    from spark_jobs.pgsource import read_partition as read_store  # noqa: PLC0415
    from spark_jobs.storeref import StoreRef  # noqa: PLC0415

    rows = []
    started, count = time.perf_counter(), 0
    for p in range(NUM_PARTITIONS):
        count += sum(1 for _ in read_partition(partition_dir(str(data_dir), p)))
    rows.append(
        _row("raw read, local store (segments, one process)", count, time.perf_counter() - started)
    )
    store = StoreRef(uri, schema)
    started, count = time.perf_counter(), 0
    for p in range(NUM_PARTITIONS):
        count += len(read_store(store, p))
    rows.append(
        _row(
            "raw read, PostgreSQL store (COPY out, one process)",
            count,
            time.perf_counter() - started,
        )
    )
    return rows


# The JDBC route's driver, fetched from Maven Central by Spark itself (--packages).
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"


def spark_reads(server: PostgresServer, records: int) -> list[dict[str, Any]]:
    """Every row of the store read by Spark tasks on local[2], once by Spark's JDBC source
    (the JVM reads the rows; partitioned by state partition) and once by the Python
    route (each task COPYs its state partitions out): the raw read, before any decoding,
    both forcing every byte of every value."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark loads only when asked

    from spark_jobs.pgsource import read_partition as read_store  # noqa: PLC0415
    from spark_jobs.storeref import StoreRef  # noqa: PLC0415

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sharecoord-bench-jdbc")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars.packages", JDBC_PACKAGE)
        .getOrCreate()
    )
    rows = []
    store = StoreRef(server.uri(), SCHEMA)
    try:
        spark.sparkContext.setLogLevel("WARN")

        def jdbc() -> int:
            frame = spark.read.jdbc(
                f"jdbc:postgresql://127.0.0.1:{server.port}/postgres",
                f"{SCHEMA}.sharecoord_records",
                column="state_partition", lowerBound=0, upperBound=NUM_PARTITIONS,
                numPartitions=8, properties={"user": "postgres", "fetchsize": "5000"},
            )  # fmt: skip
            (row,) = frame.selectExpr("count(*) AS n", "sum(length(value)) AS b").collect()
            return int(row["n"])

        def python() -> int:
            def read(p: int) -> tuple[int, int]:
                found = read_store(store, p, with_history=False)
                return len(found), sum(len(r[4] or b"") for r in found)

            sc = spark.sparkContext
            counted = sc.parallelize(range(NUM_PARTITIONS), 8).map(read).collect()
            return sum(n for n, _ in counted)

        routes = {"JDBC source (JVM)": jdbc, "Python, COPY out in the tasks": python}
        for route in routes.values():
            route()  # warm up: the JVM's classes, the Python workers
        for _round in range(2):  # interleaved, twice
            for name, route in routes.items():
                started = time.perf_counter()
                count = route()
                seconds = time.perf_counter() - started
                assert count == records, (name, count, records)
                rows.append(_row(f"Spark raw read {_label(records)}, {name} (local[2])",
                                 count, seconds, "count and value bytes of every row"))  # fmt: skip
                print(f"  raw read, {name}: {seconds:.1f}s", flush=True)
    except Exception as exc:  # the jar unreachable, say: a row that says so, not a crash
        rows.append(_row(f"Spark raw read, JDBC source: failed: {exc!r}"[:300], 0, 0.0))
    finally:
        spark.stop()
    return rows


def _compacted(out: str) -> tuple[str, int | None]:
    summary = next((line for line in out.splitlines() if line.startswith("compaction: ")), "")
    match = re.search(r"records (\d+) ->", summary)
    return summary, int(match.group(1)) if match else None


def compact_rows(work: Path, pristine: Path, records: int, uri: str) -> list[dict[str, Any]]:
    label = _label(records)
    copy = work / "spark-pg-compact"
    shutil.copytree(pristine, copy)
    seconds, out = _cli(
        "compact", "--data-dir", str(copy), "--master", "local[2]", "--history-retention-ms", "-1"
    )
    summary, compacted = _compacted(out.replace(f" to {copy / 'history'}", ""))
    rows = [
        _row(f"sharecoord compact {label}, local store (local[2], end to end)",
             compacted or records, seconds, summary)
    ]  # fmt: skip
    print(f"  compact, local store: {seconds:.1f}s; {summary}", flush=True)
    shutil.rmtree(copy)
    fill_store(pristine, uri, COPY_SCHEMA)
    seconds, out = _cli(
        "compact", "--state-store", uri, "--state-store-schema", COPY_SCHEMA,
        "--master", "local[2]", "--history-retention-ms", "-1",
    )  # fmt: skip
    summary, compacted = _compacted(out)
    rows.append(
        _row(f"sharecoord compact {label}, PostgreSQL store (local[2], end to end)",
             compacted or records, seconds, summary)
    )  # fmt: skip
    print(f"  compact, PostgreSQL store: {seconds:.1f}s; {summary}", flush=True)
    return rows


def audit_rows(work: Path, pristine: Path, records: int, uri: str) -> list[dict[str, Any]]:
    label = _label(records)
    rows = []
    for name, where in (
        ("local store", ["--data-dir", str(pristine)]),
        ("PostgreSQL store", ["--state-store", uri, "--state-store-schema", SCHEMA]),
    ):
        out = work / f"spark-pg-audit-{name.split()[0]}"
        seconds, _ = _cli("audit", *where, "--out", str(out), "--master", "local[2]")
        rows.append(
            _row(f"sharecoord audit {label}, full, {name} (local[2], end to end)", records, seconds)
        )
        print(f"  audit, {name}: {seconds:.1f}s", flush=True)
    return rows


def source_rows(pristine: Path, records: int, uri: str) -> list[dict[str, Any]]:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark loads only when asked

    from spark_jobs.datasource import register  # noqa: PLC0415

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sharecoord-bench-source-pg")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    rows = []
    query = ("count(*) AS n", "sum(size(state_batches)) AS b", "count(DISTINCT group_id) AS g")
    try:
        spark.sparkContext.setLogLevel("WARN")
        register(spark)
        readers = {
            "local store": lambda: spark.read.format("sharecoord").load(str(pristine)),
            "PostgreSQL store": lambda: (
                spark.read.format("sharecoord")
                .option("state_store", uri)
                .option("state_store_schema", SCHEMA)
                .load()
            ),
        }
        for read in readers.values():
            read().limit(10).collect()  # warm up
        for name, read in readers.items():
            started = time.perf_counter()
            (row,) = read().selectExpr(*query).collect()
            seconds = time.perf_counter() - started
            assert row["n"] == records, (row, records)
            rows.append(
                _row(f'spark.read.format("sharecoord") scan {_label(records)}, {name} (local[2])',
                     row["n"], seconds, "count, batches, distinct groups over every row")
            )  # fmt: skip
            print(f"  source scan, {name}: {seconds:.1f}s", flush=True)
    finally:
        spark.stop()
    return rows


def run(work: Path, quick: bool) -> list[dict[str, Any]]:
    """`--only spark-pg`: every row above, local and PostgreSQL side by side."""
    size = 100_000 if quick else 1_000_000
    print(f"spark-pg: building a log of {size:,} records", flush=True)
    pristine = work / f"spark-pg-{_label(size)}"
    built = build_log(pristine, size, segment_bytes=segment_bytes_for(size), progress=False)
    with postgres_server() as server:
        uri = server.uri()
        started = time.perf_counter()
        filled = fill_store(pristine, uri, SCHEMA)
        print(f"  filled the store: {filled:,} records in {time.perf_counter() - started:.1f}s")
        assert filled == built.records, (filled, built.records)
        rows = raw_reads(pristine, uri, SCHEMA)
        rows += spark_reads(server, filled)
        rows += source_rows(pristine, filled, uri)
        rows += audit_rows(work, pristine, filled, uri)
        rows += compact_rows(work, pristine, filled, uri)
    shutil.rmtree(pristine)
    return rows
