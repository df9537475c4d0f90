"""The jobs and the data source through a real Spark standalone cluster (issue 24): a
master and one worker started from pyspark's own ``bin/spark-class``, on loopback, whose
Python lacks sharecoord's dependencies (a bare venv, first on the worker's PATH and its
PYSPARK_PYTHON). ``sharecoord compact``, ``sharecoord audit`` and the data source
(through the session helper) run on it with nothing installed in the worker's Python by
hand, and give what ``local[2]`` gives: the compacted log's state per key, the audit's
report, the rows. Same machine, so the executors see the data directory at its path.
On the PostgreSQL store the executors read the store themselves, with psycopg, which
only the shipped environment gives them.

Slow (a cluster, a packed environment and six Spark applications): the reliability
suite's. tests/spark/test_shipenv.py is the short slice ``make test`` runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from persistence import verify
from spark_jobs import audit, compact, shipenv
from spark_jobs.audit_report import SUMMARY_JSON
from tests.figures import Figures
from tests.figures import figures as figures  # noqa: PLC0414 - the fixture, used by name
from tests.harness.daemon import SHARECOORD, child_env
from tests.harness.wait import wait_until_blocking
from tests.postgres import PostgresServer
from tests.spark.histories import states_on_disk
from tests.spark.pg_stores import SECRET, PgLog, cli_dump, write_store
from tests.spark.test_audit import ANOMALOUS_LOG, appended_of, b, build, key, snap
from tests.spark.test_audit import NUM_PARTITIONS as AUDIT_PARTITIONS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

LOOPBACK = "127.0.0.1"
CLUSTER_START_TIMEOUT_S = 240.0
JOB_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 30.0

# The rows of a data directory (one argument after the cache) or of a PostgreSQL store
# (its URI and schema), with timestamps as `log dump --json` prints them.
ROWS_SCRIPT = """\
import json, sys
from pyspark.sql.functions import expr
from spark_jobs.datasource import register
from spark_jobs.session import spark_session

master, cache, *where = sys.argv[1:]
spark = spark_session("sharecoord-rows", master=master, env_cache=cache)
register(spark)
reader = spark.read.format("sharecoord")
if len(where) == 2:
    frame = reader.option("state_store", where[0]).option("state_store_schema", where[1]).load()
else:
    frame = reader.load(where[0])
frame = frame.withColumn("timestamp", expr("unix_millis(timestamp)"))
rows = [r.asDict(recursive=True) for r in frame.collect()]
rows.sort(key=lambda r: (r["state_partition"], r["log_offset"]))
print("ROWS " + json.dumps(rows, default=str, sort_keys=True))
spark.stop()
"""

DEFAULT_PYTHON_SCRIPT = """\
import sys
from pyspark.sql import SparkSession
from spark_jobs.datasource import register

spark = SparkSession.builder.master(sys.argv[1]).getOrCreate()
register(spark)
"""


@dataclass
class Cluster:
    url: str
    logs: list[Path]
    bare_python: Path  # the workers' own, without the dependencies

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs if p.exists())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def python_without_the_dependencies(tmp_path: Path) -> Path:
    """A bare venv of the driver's base interpreter (the minor version Spark needs on
    both sides), which has none of sharecoord's dependencies."""
    bare = tmp_path / "bare-python"
    made = subprocess.run(
        [shipenv.base_python(), "-m", "venv", "--without-pip", str(bare)],
        capture_output=True,
        text=True,
        check=False,
    )
    python = bare / "bin" / "python"
    if made.returncode != 0 or not python.exists():
        pytest.fail(f"cannot make a bare venv for the worker: {made.stderr.strip()}")
    probe = subprocess.run([str(python), "-c", "import msgspec"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.fail(f"{python} imports msgspec: no Python without the dependencies found")
    return python


def spark_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Spark's processes' environment: on loopback only (their UIs too), no Python of
    this test run's chosen for them."""
    env = child_env()
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "SPARK_CONF_DIR"):
        env.pop(name, None)
    env.update(SPARK_LOCAL_IP=LOOPBACK, HOME=str(home))
    env.update(extra or {})
    return env


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (a worker's executors and their Pythons with it), then
    SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(STOP_TIMEOUT_S)
            if sig == signal.SIGTERM:
                os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def master_status(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/json/", timeout=5) as reply:
            status: dict[str, Any] = json.load(reply)
            return status
    except OSError:
        return {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and one worker (2 cores) whose Python lacks the dependencies."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    bare = python_without_the_dependencies(tmp_path)
    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://{LOOPBACK}:{port}"
    worker_env = spark_env(
        tmp_path,
        {
            "SPARK_HOME": spark_home,
            "PYSPARK_PYTHON": str(bare),
            "PATH": os.pathsep.join([str(bare.parent), os.environ.get("PATH", "")]),
        },
    )
    worker_env.pop("PYTHONPATH", None)
    logs = [tmp_path / "master.log", tmp_path / "worker.log"]
    deploy = "org.apache.spark.deploy"
    master = ["--host", LOOPBACK, "--port", str(port), "--webui-port", str(master_ui)]
    worker = ["--host", LOOPBACK, "--cores", "2", "--memory", "2g"]
    worker += ["--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "worker-dir"), url]
    commands = [
        [spark_class, f"{deploy}.master.Master", *master],
        [spark_class, f"{deploy}.worker.Worker", *worker],
    ]
    processes: list[subprocess.Popen[bytes]] = []
    running = Cluster(url, logs, bare)
    try:
        for command, log in zip(commands, logs, strict=True):
            with open(log, "wb") as out:
                processes.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=worker_env,
                        start_new_session=True,
                    )
                )
        try:
            wait_until_blocking(
                lambda: master_status(master_ui),
                "the master ALIVE with one ALIVE worker",
                until=lambda s: s.get("status") == "ALIVE" and s.get("aliveworkers", 0) >= 1,
                timeout=CLUSTER_START_TIMEOUT_S,
            )
        except Exception:
            pytest.fail(f"the standalone cluster did not start:\n{running.log_tail()}")
        yield running
    finally:
        for process in reversed(processes):
            stop_group(process)


def run_sharecoord(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [*SHARECOORD, *args],
        env=spark_env(home, env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    return done, time.monotonic() - started


def read_rows(
    home: Path, master: str, cache: str, *where: str
) -> tuple[list[dict[str, Any]], float]:
    """The data source's rows through a session of the helper: `where` is a data
    directory, or a store's URI and schema."""
    script = home / "rows.py"
    script.write_text(ROWS_SCRIPT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), master, cache, *where],
        env=spark_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("ROWS ")]
    rows: list[dict[str, Any]] = json.loads(line[len("ROWS ") :])
    return rows, seconds


def report_of(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((out / SUMMARY_JSON).read_text())
    summary.pop("generated_at")
    return summary


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    both = done.stdout + done.stderr
    assert "Traceback" not in both and "Exception in thread" not in both, both


def audit_on_both(
    cluster: Cluster, tmp_path: Path, cache: str, source: list[str], figures: Figures, prefix: str
) -> dict[str, subprocess.CompletedProcess[str]]:
    """The audit of `source` (a data directory's or a store's flags) on the cluster and
    on local[2], a report each: both find the planted violations, and the reports are
    the same. The runs, by master's name."""
    runs = {}
    for master, name in ((cluster.url, "cluster"), ("local[2]", "local")):
        out = str(tmp_path / f"audit-{name}")
        runs[name], seconds = run_sharecoord(
            tmp_path, "audit", *source, "--out", out, "--master", master,
            "--spark-env-cache", cache,
        )  # fmt: skip
        figures.set(f"{prefix}audit_{name}_s", round(seconds, 1))
    for done in runs.values():
        assert done.returncode == audit.EXIT_FAILURE, done.stdout + done.stderr  # violations
        no_traceback(done)
    assert report_of(tmp_path / "audit-cluster") == report_of(tmp_path / "audit-local")
    assert report_of(tmp_path / "audit-local")["violations"] > 0
    return runs


def test_compact_audit_and_the_data_source_on_a_standalone_cluster_match_local(
    cluster: Cluster, tmp_path: Path, figures: Figures
) -> None:
    cache = str(tmp_path / "env-cache")
    on_cluster, here = str(tmp_path / "cluster-data"), str(tmp_path / "local-data")
    for data_dir in (on_cluster, here):
        build(data_dir, ANOMALOUS_LOG * 3, segment_bytes=300)
    before = states_on_disk(here)

    # The audit, into a report per master; the first run on the cluster packs the
    # environment into the cache.
    runs = audit_on_both(cluster, tmp_path, cache, ["--data-dir", on_cluster], figures, "")
    packed = re.search(r"\((\d+) MiB, packed in ([\d.]+) s\)", runs["cluster"].stdout)
    assert packed is not None, runs["cluster"].stdout
    figures.set("archive_mib", int(packed[1]))
    figures.set("pack_s", float(packed[2]))

    # The data source, through the session helper (which ships the same archive).
    rows, seconds = read_rows(tmp_path, cluster.url, cache, on_cluster)
    figures.set("data_source_cluster_s", round(seconds, 1))
    expected, seconds = read_rows(tmp_path, "local[2]", cache, here)
    figures.set("data_source_local_s", round(seconds, 1))
    figures.set("rows", len(rows))
    assert rows and rows == expected

    # Compaction of two copies of one log.
    for master, data_dir, name in (
        (cluster.url, on_cluster, "cluster"),
        ("local[2]", here, "local"),
    ):
        runs[name], seconds = run_sharecoord(
            tmp_path, "compact", "--data-dir", data_dir, "--master", master,
            "--spark-env-cache", cache,
        )  # fmt: skip
        figures.set(f"compact_{name}_s", round(seconds, 1))
        assert runs[name].returncode == 0, runs[name].stdout + runs[name].stderr
        assert compact.COMMITTED_SELF in runs[name].stdout.splitlines()
        no_traceback(runs[name])
        assert verify(data_dir).ok
    assert states_on_disk(on_cluster) == states_on_disk(here) == before

    # One archive, packed once and shipped by every cluster run.
    archives = [n for n in os.listdir(cache) if n.startswith(shipenv.ARCHIVE_PREFIX)]
    assert len(archives) == 1
    assert re.search(r"\(\d+ MiB, cached\)", runs["cluster"].stdout), runs["cluster"].stdout


def on_store(log: PgLog) -> list[str]:
    return ["--state-store", log.store.uri, "--state-store-schema", log.store.schema]


def test_compact_audit_and_the_data_source_on_postgres_on_a_standalone_cluster_match_local(
    cluster: Cluster, postgres: PostgresServer, tmp_path: Path, figures: Figures
) -> None:
    """The same on two identical PostgreSQL stores: the executors COPY the state
    partitions out themselves, with the psycopg of the shipped environment (the
    worker's own Python has none)."""
    cache = str(tmp_path / "env-cache")
    written = appended_of(ANOMALOUS_LOG * 3)
    on_cluster = write_store(postgres, written, AUDIT_PARTITIONS)
    here = write_store(postgres, written, AUDIT_PARTITIONS)
    before = here.states()

    # The audit of one store (its report names it), into a report per master.
    runs = audit_on_both(cluster, tmp_path, cache, on_store(on_cluster), figures, "pg_")
    for done in runs.values():
        assert SECRET not in done.stdout + done.stderr
    assert re.search(r"\(\d+ MiB, packed in [\d.]+ s\)", runs["cluster"].stdout)

    # The data source through the cluster: what `log dump --json` prints.
    store = on_cluster.store
    rows, seconds = read_rows(tmp_path, cluster.url, cache, store.uri, store.schema)
    figures.set("pg_data_source_cluster_s", round(seconds, 1))
    figures.set("pg_rows", len(rows))
    assert rows and rows == cli_dump(on_cluster)

    # Compaction of two identical stores.
    for master, log, name in ((cluster.url, on_cluster, "cluster"), ("local[2]", here, "local")):
        runs[name], seconds = run_sharecoord(
            tmp_path, "compact", *on_store(log), "--master", master,
            "--history-retention-ms", "-1", "--spark-env-cache", cache,
        )  # fmt: skip
        figures.set(f"pg_compact_{name}_s", round(seconds, 1))
        assert runs[name].returncode == 0, runs[name].stdout + runs[name].stderr
        assert "0 refused, 0 failed" in runs[name].stdout, runs[name].stdout
        no_traceback(runs[name])
        assert log.states() == before
        log.every_record_once()
    # Both compactions folded and moved the same records.
    for p in range(AUDIT_PARTITIONS):
        for table in ("records", "history"):
            assert on_cluster.rows(table, p) == here.rows(table, p), (table, p)
    assert any(here.rows("history", p) for p in range(AUDIT_PARTITIONS))
    assert re.search(r"\(\d+ MiB, cached\)", runs["cluster"].stdout), runs["cluster"].stdout


def test_executors_without_the_dependencies_are_one_line_and_exit_1(
    cluster: Cluster, tmp_path: Path, figures: Figures
) -> None:
    """PYSPARK_PYTHON names the executors' Python, so nothing is shipped: that Python
    lacks msgpack, and the job says so in one line instead of the JVM's and Python's
    stack traces (what every cluster run ended in before)."""
    data_dir = str(tmp_path / "data")
    build(data_dir, [snap(key("fine"), 1, 0, b(0, 9, 0, 1))])  # an audit would pass: exit 0
    done, seconds = run_sharecoord(
        tmp_path, "audit", "--data-dir", data_dir, "--out", str(tmp_path / "audit"),
        "--master", cluster.url, env={"PYSPARK_PYTHON": str(cluster.bare_python)},
    )  # fmt: skip
    figures.set("refused_s", round(seconds, 1))
    assert done.returncode == 1, done.stdout + done.stderr
    no_traceback(done)
    # spark-submit hands the driver's stderr on with its stdout.
    output = (done.stdout + done.stderr).splitlines()
    lines = [x for x in output if x.startswith("sharecoord: ")]
    assert len(lines) == 1, output
    (line,) = lines
    assert f"the executors of {cluster.url} cannot run {cluster.bare_python}" in line
    assert "ModuleNotFoundError: No module named 'msgpack'" in line
    assert "shipping" not in done.stdout

    # A session of one's own, started on the cluster with Spark's default python3: the
    # data source cannot send its workers elsewhere, and says what to do in one line.
    script = tmp_path / "default_python.py"
    script.write_text(DEFAULT_PYTHON_SCRIPT)
    own = subprocess.run(
        [sys.executable, str(script), cluster.url],
        env=spark_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    assert own.returncode == 1, own.stdout + own.stderr
    no_traceback(own)
    (line,) = [x for x in own.stderr.splitlines() if x.startswith("sharecoord: ")]
    assert f"the executors of {cluster.url} run Spark's default python3" in line
    assert "spark_session" in line and "PYSPARK_PYTHON" in line
