"""The Spark jobs on the PostgreSQL store (issue 24), through Spark: the data source
returns the rows `log dump --json` prints, the incremental audit equals the full one
on random histories, compaction SIGKILLed (the whole spark-submit process tree) at
each statement of its swap loses nothing, and compaction with a node writing
throughout keeps every acknowledged state. The story test (a violation still reported
after compaction and pruning) is tests/spark/test_history.py's, over both stores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.functions import expr

from protocol.records import RecordDecoder, encode_record, record_row
from spark_jobs import audit, datasource
from spark_jobs import compact as compact_job
from spark_jobs.datasource import register
from spark_jobs.pgcompact import EXIT_OK
from tests.harness import (
    REPO_ROOT,
    SHARECOORD,
    child_env,
    run_cli,
    wait_until,
    wait_until_blocking,
)
from tests.postgres import PostgresServer, _children
from tests.server.postgres_cluster import check_on_a_fresh_node, start_cluster, writing
from tests.spark.histories import Appended, rpc_histories, run_rpcs
from tests.spark.pg_stores import (
    PgLog,
    cli_dump,
    prune_after_new_snapshots,
    write_more,
    write_store,
)
from tests.spark.test_compact_crash import many_keys_history
from tests.spark.test_history import planted_log_records

NUM_PARTITIONS = 3
JOB_TIMEOUT_S = 300


def dumped(log: PgLog) -> list[dict[str, Any]]:
    """The records written, as `log dump --json` prints a record (protocol.records'
    record_row): what the store held before compaction moved any of it away."""
    decoder = RecordDecoder()
    rows = []
    for item in log.written:
        record = decoder.decode(*_encoded(item))
        rows.append(record_row(item.state_partition, item.offset, item.timestamp, record))
    return sorted(rows, key=lambda r: (r["state_partition"], r["log_offset"]))


def _encoded(item: Appended) -> tuple[int, bytes, bytes | None]:
    return encode_record(item.record)


def source_rows(spark: SparkSession, log: PgLog, **options: str) -> list[dict[str, Any]]:
    register(spark)
    frame = (
        spark.read.format("sharecoord")
        .option("state_store", log.store.uri)
        .option("state_store_schema", log.store.schema)
        .options(**options)
        .load()
        .withColumn("timestamp", expr("unix_millis(timestamp)"))
    )
    rows = [r.asDict(recursive=True) for r in frame.collect()]
    return sorted(rows, key=lambda r: (r["state_partition"], r["log_offset"]))


def compact(spark: SparkSession, log: PgLog, *extra: str) -> int:
    return compact_job.main(
        ["--state-store", log.store.uri, "--state-store-schema", log.store.schema,
         "--history-retention-ms", "-1", *extra],
        spark=spark,
    )  # fmt: skip


def run_audit(spark: SparkSession, log: PgLog, out: Path, *extra: str) -> tuple[int, dict]:
    code = audit.main(
        ["--state-store", log.store.uri, "--state-store-schema", log.store.schema,
         "--out", str(out), *extra],
        spark=spark,
    )  # fmt: skip
    return code, json.loads((out / "summary.json").read_text())


# -- the data source ---------------------------------------------------------------------


def test_the_data_source_over_postgres_returns_what_log_dump_json_prints(
    spark: SparkSession, postgres: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_store(postgres, planted_log_records()[0], 2)
    original = dumped(log)
    assert cli_dump(log) == original  # nothing compacted yet: the log as written
    assert source_rows(spark, log) == cli_dump(log)
    assert compact(spark, log) == EXIT_OK
    p = log.written[0].state_partition
    prune_after_new_snapshots(log, p)
    capsys.readouterr()
    original = dumped(log)
    assert len(log.rows("records", p)) < len([a for a in log.written if a.state_partition == p])
    # The history below the watermark and the log above it: the rows as written.
    assert source_rows(spark, log) == original
    assert source_rows(spark, log, partitioning="state_partition") == original
    assert source_rows(spark, log, partitions=str(p)) == [
        r for r in original if r["state_partition"] == p
    ]
    # Without the history: the log as it is now, folded.
    live = source_rows(spark, log, history="false")
    assert [r["log_offset"] for r in live if r["state_partition"] == p] == [
        r[0] for r in log.rows("records", p)
    ]


# -- incremental == full -------------------------------------------------------------------


def audit_in_steps(
    spark: SparkSession, postgres: PostgresServer, tmp_path: Path, written: list[Appended], cut: int
) -> tuple[dict, dict]:
    """--since-last after the first `cut` records, then a compaction (which moves them
    all into the history), then --since-last after the rest; and a full audit at the
    end."""
    log = write_store(postgres, written[:cut], NUM_PARTITIONS)
    daily = tmp_path / f"daily-{log.store.schema}"
    run_audit(spark, log, daily, "--since-last")
    assert compact(spark, log) == EXIT_OK
    write_more(log, written[cut:])
    _, last = run_audit(spark, log, daily, "--since-last")
    _, full = run_audit(spark, log, tmp_path / f"full-{log.store.schema}")
    return last, full


def assert_same_audit(last: dict, full: dict) -> None:
    total: dict[str, int] = {}
    for counts in (last["violation_counts"], last["earlier_violations"]):
        for kind, n in counts.items():
            total[kind] = total.get(kind, 0) + n
    assert total == full["violation_counts"]
    assert last["histogram"] == full["histogram"]
    assert last["share_partitions"] == full["share_partitions"]


def test_since_last_on_postgres_equals_a_full_audit(
    spark: SparkSession,
    postgres: PostgresServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    written, _ = planted_log_records()
    # The planted violation lands in the first run, one more in the second.
    last, full = audit_in_steps(spark, postgres, tmp_path, written, len(written) // 2)
    capsys.readouterr()
    assert sum(full["violation_counts"].values()) >= 1
    assert_same_audit(last, full)


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rpc_histories, st.floats(0, 1))
def test_since_last_on_postgres_equals_a_full_audit_on_random_histories(
    spark: SparkSession, postgres: PostgresServer, tmp_path: Path, ops: list, at: float
) -> None:
    written = run_rpcs(ops, NUM_PARTITIONS, 3)
    last, full = audit_in_steps(spark, postgres, tmp_path, written, int(len(written) * at))
    assert_same_audit(last, full)


# -- SIGKILL at each step ------------------------------------------------------------------

# Where the test holds a lock the job's next statement waits for: the job is killed
# there, its transaction open (the statements of pgcompact.swap, in order, and the
# declaration of the history before every swap).
STEPS = {
    "declare": "SELECT 1 FROM {schema}.sharecoord_schema FOR UPDATE",
    "lock": "SELECT pg_advisory_lock({lock_id})",
    "history": "LOCK TABLE {schema}.sharecoord_history IN SHARE MODE",
    "delete": "SELECT 1 FROM {schema}.sharecoord_records "
    'WHERE state_partition = {p} AND "offset" = 0 FOR UPDATE',
    "keys": "SELECT 1 FROM {schema}.sharecoord_keys WHERE state_partition = {p} FOR UPDATE",
}
WAITING_ON = {
    "declare": "UPDATE",
    "lock": "pg_advisory_xact_lock",
    "history": "INSERT INTO",
    "delete": "DELETE FROM",
    "keys": "UPDATE",
}


def descendants(pid: int) -> list[int]:
    found = [pid]
    for child in _children(pid):
        found += descendants(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it (spark-submit, its JVM, pyspark's
    daemon and its workers), all of them found before any is killed."""
    for member in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


@contextlib.contextmanager
def holding(log: PgLog, step: str, p: int) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding the step's lock until the block ends."""
    lock_id = zlib.crc32(f"sharecoord log {log.store.schema} {p}".encode())
    conn = psycopg.connect(log.store.uri)
    try:
        conn.execute(STEPS[step].format(schema=log.store.schema, p=p, lock_id=lock_id))  # type: ignore[arg-type]
        yield conn
    finally:
        conn.rollback()
        conn.close()


def waiting_backend(log: PgLog, step: str) -> int | None:
    """The job's backend, once it waits for the test's lock at the step's statement."""
    with psycopg.connect(log.store.uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'sharecoord' "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            (f"%{WAITING_ON[step]}%",),
        ).fetchone()
    return None if row is None else int(row[0])


def backend_gone(log: PgLog, pid: int) -> bool:
    with psycopg.connect(log.store.uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == 0


def compact_command(log: PgLog) -> list[str]:
    return [
        *SHARECOORD, "compact", "--state-store", log.store.uri,
        "--state-store-schema", log.store.schema, "--master", "local[2]",
        "--history-retention-ms", "-1",
    ]  # fmt: skip


def killed_at(postgres: PostgresServer, tmp_path: Path, step: str) -> None:
    written = many_keys_history(300)
    log = write_store(postgres, written, NUM_PARTITIONS)  # type: ignore[arg-type]
    before = log.states()
    p = 1
    with (
        holding(log, step, p),
        open(tmp_path / f"killed-at-{step}.out", "wb") as output,
        subprocess.Popen(
            compact_command(log), cwd=REPO_ROOT, env=child_env(), stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
        ) as job,
    ):  # fmt: skip
        try:
            backend = wait_until_blocking(
                lambda: waiting_backend(log, step),
                f"the compaction job to wait at its {step} step",
                timeout=JOB_TIMEOUT_S,
            )
        finally:
            kill_tree(job.pid)
            job.wait(timeout=60)
    # The lock released: the backend finishes its statement, finds its client gone, and
    # rolls back (nothing can send COMMIT for it).
    wait_until_blocking(lambda: backend_gone(log, backend), "the killed job's backend to end")
    log.every_record_once()
    assert log.states() == before
    log.keys_point_at_last_snapshots()
    # And compaction goes through afterwards.
    done = subprocess.run(
        compact_command(log), cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
        timeout=JOB_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    log.every_record_once()
    assert log.states() == before
    assert log.rows("history", p)  # it did move what it folded


@pytest.mark.spark  # spark-submit, in a subprocess
def test_compaction_killed_in_its_swap_leaves_every_record_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # The last statement before the COMMIT: everything else of the swap is done.
    killed_at(postgres, tmp_path, "keys")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("step", [s for s in STEPS if s != "keys"])
def test_compaction_killed_at_any_step_leaves_every_record_once(
    postgres: PostgresServer, tmp_path: Path, step: str
) -> None:
    killed_at(postgres, tmp_path, step)


# -- a node writing throughout ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
async def test_compaction_with_a_node_writing_throughout_keeps_every_acknowledged_state(
    spawn: Any, tmp_path: Path, postgres: PostgresServer
) -> None:
    """The model check: a node on the store serves writes (and prunes every 200 ms)
    while compaction runs twice; every acknowledged state reads back from it, and from
    a fresh node that loads the compacted store; every record is in exactly one of the
    log and the history."""
    cluster = await start_cluster(
        spawn, tmp_path, postgres, 1,
        "--prune-interval-ms", "200", "--snapshot-update-records-per-snapshot", "10",
    )  # fmt: skip
    schema = cluster.schema
    command = [
        "compact", "--state-store", postgres.uri(), "--state-store-schema", schema,
        "--master", "local[2]",
    ]  # fmt: skip

    def acked(writers: Any) -> int:
        return sum(len(times) for times in writers.written_at.values())

    async with writing(cluster) as writers:
        for _ in range(2):
            await wait_until(lambda: acked(writers) >= 300, "300 writes acknowledged")
            before = acked(writers)
            done = await asyncio.to_thread(run_cli, *command, timeout=JOB_TIMEOUT_S)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "0 refused" in done.stdout, done.stdout
            assert acked(writers) > before  # the node kept answering while the job ran
        await writers.stop()
        await writers.check()
    await asyncio.to_thread(once_each, postgres, schema)
    await check_on_a_fresh_node(spawn, tmp_path, cluster, writers.model, postgres.uri())


def once_each(postgres: PostgresServer, schema: str) -> None:
    """The offsets of the history and of the log at and above the watermark: each once,
    and together every offset from the first kept to the log's end (nothing expired)."""
    moved = 0
    for p in range(8):
        mark = postgres.execute(
            f"SELECT coalesce(max(watermark), 0) FROM {schema}.sharecoord_history_marks "
            f"WHERE state_partition = {p}"
        )
        history = postgres.execute(
            f'SELECT "offset" FROM {schema}.sharecoord_history WHERE state_partition = {p}'
        ).split()
        live = postgres.execute(
            f'SELECT "offset" FROM {schema}.sharecoord_records '
            f'WHERE state_partition = {p} AND "offset" >= {mark}'
        ).split()
        offsets = sorted(int(o) for o in history + live)
        # From where the log started when the first compaction declared the history
        # (the node pruned for good before that) to its end, each offset once.
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), f"partition {p}"
        moved += len(history)
    assert moved  # compaction and pruning did move records into the history


def test_an_executor_without_psycopg_is_told_what_to_do_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a task of the data source meets on an executor whose Python has no psycopg
    (a session the user built without reads_store=True): one line saying what to do,
    not a module missing deep in Spark's trace."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails
    monkeypatch.delitem(sys.modules, "spark_jobs.pgsource", raising=False)
    reader = datasource.ShareLogReader({"state_store": "postgresql://sharecoord@127.0.0.1/db"})
    assert reader.store is not None
    piece = ("store", reader.store, 0, -1, False)
    with pytest.raises(RuntimeError) as raised:
        next(iter(reader.read(datasource._Pieces([piece]))))
    assert str(raised.value) == datasource.NO_DRIVER
    assert "psycopg" in str(raised.value) and "\n" not in str(raised.value)
