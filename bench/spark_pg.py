"""The Spark jobs on the PostgreSQL store beside the local store, in one run, on the same
1M records (`--only spark-pg`): compaction and the full audit end to end
(`sharecoord compact|audit --master local[2]`, JVM start included), the data source's
scan on a warm session, and the raw read of every record (a task's COPY out, in one
process), each on a data directory and on a store holding the same records; and the raw
read of the store by Spark tasks, by Spark's JDBC source and by the Python route, with
the Python fold it feeds (`--only spark-pg-read` runs these reads alone).

The log is bench/logs.py's (the daemon's own records); the store is a PostgreSQL server
the bench starts (tests/postgres.py, as `--only cluster` does), filled with the same
records through the store's own commit cycle. Each compaction runs on a fresh copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.logs import NUM_PARTITIONS, build_log
from bench.spark import REPO, _cli, _label, _row, segment_bytes_for
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
    (what a task of the jobs runs, before any decoding); then the same records decoded
    and folded as compaction folds them."""
    from spark_jobs.fold import fold_records as fold  # noqa: PLC0415
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
    read_s = fold_s = 0.0
    count = 0
    for p in range(NUM_PARTITIONS):
        started = time.perf_counter()
        records = read_store(store, p)
        read_s += time.perf_counter() - started
        count += len(records)
        started = time.perf_counter()
        fold(records, tombstone_cutoff_ms=-(2**62))
        fold_s += time.perf_counter() - started
    rows.append(_row("raw read, PostgreSQL store (COPY out, one process)", count, read_s))
    # What every route does next, in Python whichever way the rows came: the share of
    # the read in a job's work.
    rows.append(
        _row(
            "decode and fold of the same records (compaction's fold, one process)",
            count,
            fold_s,
            f"the COPY read is {read_s / (read_s + fold_s):.0%} of read + fold",
        )
    )
    return rows


# The JDBC route's driver, fetched from Maven Central by Spark itself (--packages): the
# version Maven Central serves here.
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.14"
# Named, not looked up: the jar spark.jars.packages fetches joins Spark's own class
# loader after the JVM started, where java.sql.DriverManager does not look, so without
# the class `spark.read.jdbc` fails with "java.sql.SQLException: No suitable driver".
JDBC_DRIVER = "org.postgresql.Driver"
# Every column a task's COPY reads, each one used, so that no route prunes any away.
RAW_READ = (
    "count(*) AS n",
    "sum(length(key)) + sum(coalesce(length(value), 0)) AS bytes",
    "sum(`offset` % 7) + sum(`timestamp` % 7) + sum(record_type) AS mixed",
)


def spark_reads(server: PostgresServer, records: int) -> list[dict[str, Any]]:
    """Every row of the store read by Spark tasks on local[2], by three routes
    interleaved, twice, after a warm-up of each: Spark's JDBC source (the JVM reads the
    rows, partitioned by state partition, and sums them); the same rows handed on to
    Python workers (what the jobs would need: their decoding and fold run in Python; as
    an RDD's rows, since Arrow's way there, mapInArrow, needs pandas, which the jobs'
    environment does not carry); and the Python route (each task COPYs its state
    partitions out). Each reads every column of every row and must find the same count
    and bytes as the others.

    In a process of its own: spark.jars.packages is read when a JVM starts, and under
    `--only spark` bench/spark.py's scan has started this process's JVM already (the
    driver class is then not found at all)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "bench.spark_pg", server.uri(), str(server.port), str(records)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    for line in lines:
        if not line.startswith(ROWS):
            print(line, flush=True)
    found = [json.loads(line[len(ROWS) :]) for line in lines if line.startswith(ROWS)]
    if done.returncode != 0 or not found:
        return [_row(f"Spark raw read: failed (exit {done.returncode}), see above", 0, 0.0)]
    rows: list[dict[str, Any]] = found[0]
    return rows


ROWS = "ROWS "


def _spark_reads_here(uri: str, port: int, records: int) -> list[dict[str, Any]]:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark loads only when asked

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
    try:
        spark.sparkContext.setLogLevel("WARN")
        routes = _read_routes(spark, uri, port)
        seen = {name: route() for name, route in routes.items()}  # warm up: JVM, workers
        assert len(set(seen.values())) == 1, seen  # the same rows, whichever route
        assert next(iter(seen.values()))[0] == records, (seen, records)
        for _round in range(2):  # interleaved, twice
            for name, route in routes.items():
                started = time.perf_counter()
                count, value_bytes = route()
                seconds = time.perf_counter() - started
                assert (count, value_bytes) == seen[name], (name, count, value_bytes)
                load = os.getloadavg()[0]
                note = f"every column of every row, 8 tasks; load {load:.1f}"
                label = f"Spark raw read {_label(records)}, {name} (local[2])"
                rows.append(_row(label, count, seconds, note))
                print(f"  raw read, {name}: {seconds:.1f}s (load {load:.1f})", flush=True)
    except Exception as exc:  # the jar unreachable, say: a row that says so, not a crash
        rows.append(_row(f"Spark raw read, JDBC source: failed: {_first_line(exc)}", 0, 0.0))
    finally:
        spark.stop()
    return rows


def _read_routes(spark: Any, uri: str, port: int) -> dict[str, Any]:
    """The raw read's routes by name, each returning (rows, key and value bytes)."""
    from spark_jobs.pgsource import read_partition as read_store  # noqa: PLC0415
    from spark_jobs.storeref import StoreRef  # noqa: PLC0415

    store = StoreRef(uri, SCHEMA)

    def table() -> Any:
        return spark.read.jdbc(
            f"jdbc:postgresql://127.0.0.1:{port}/postgres",
            f"{SCHEMA}.sharecoord_records",
            column="state_partition", lowerBound=0, upperBound=NUM_PARTITIONS,
            numPartitions=8,
            properties={"user": "postgres", "driver": JDBC_DRIVER, "fetchsize": "5000"},
        )  # fmt: skip

    def jdbc() -> tuple[int, int]:
        (row,) = table().selectExpr(*RAW_READ).collect()
        return int(row["n"]), int(row["bytes"])

    def jdbc_to_python() -> tuple[int, int]:
        def sizes(rows: Iterator[Any]) -> Iterator[tuple[int, int]]:
            n = size = 0
            for _offset, _timestamp, _record_type, key, value in rows:
                n += 1
                size += len(key) + len(value or b"")
            yield n, size

        frame = table().select("offset", "timestamp", "record_type", "key", "value")
        counted = frame.rdd.mapPartitions(sizes).collect()
        return sum(n for n, _ in counted), sum(size for _, size in counted)

    def python() -> tuple[int, int]:
        def read(p: int) -> tuple[int, int]:
            found = read_store(store, p, with_history=False)
            return len(found), sum(len(r[3]) + len(r[4] or b"") for r in found)

        counted = spark.sparkContext.parallelize(range(NUM_PARTITIONS), 8).map(read).collect()
        return sum(n for n, _ in counted), sum(size for _, size in counted)

    return {
        "JDBC source (JVM)": jdbc,
        "JDBC source, rows on to Python workers": jdbc_to_python,
        "Python, COPY out in the tasks": python,
    }


def _first_line(exc: Exception) -> str:
    """The Java exception's own line of a Py4JJavaError (its repr says only which call
    failed), else the exception's first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    java = [line.lstrip(": ") for line in lines if "Exception:" in line or "Error:" in line]
    return ((java or lines or [repr(exc)])[0])[:300]


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


def run(work: Path, quick: bool, reads_only: bool = False) -> list[dict[str, Any]]:
    """`--only spark-pg`: every row above, local and PostgreSQL side by side;
    `--only spark-pg-read`: the raw reads alone (one process, and the Spark routes)."""
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
        if not reads_only:
            rows += source_rows(pristine, filled, uri)
            rows += audit_rows(work, pristine, filled, uri)
            rows += compact_rows(work, pristine, filled, uri)
    shutil.rmtree(pristine)
    return rows


if __name__ == "__main__":  # spark_reads' own process: URI, port, records
    found = _spark_reads_here(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(ROWS + json.dumps(found), flush=True)
