"""`sharecoord compact` / `sharecoord audit`: settings from flags, env and the config
file reach the job; the runner ships the pure packages and runs pyspark's spark-submit;
the spark-submit lines the job modules document work as written."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

import spark_jobs
from protocol.records import ShareKey, ShareSnapshot
from server.commands.cli import main as sharecoord
from spark_jobs import audit, compact, submit
from spark_jobs.audit_report import CHART_PNG, INDEX_HTML, SUMMARY_JSON
from spark_jobs.storeref import STATE_STORE_ENV
from tests.postgres import PostgresServer
from tests.spark.conftest import REPO_ROOT
from tests.spark.histories import Appended, state_partition_of, write_log
from tests.spark.pg_stores import write_store
from tests.spark.test_audit import ANOMALOUS_LOG, appended_of, b, build, key, snap, upd

JOB_TIMEOUT_S = 300


@dataclass(frozen=True)
class Submitted:
    """A job the CLI would have submitted: what run_job was given."""

    job: str
    master: str
    job_args: list[str]
    env_cache: str | None = None
    class_cache: str | None = None


def record_jobs(monkeypatch: pytest.MonkeyPatch) -> list[Submitted]:
    """Record the jobs the CLI would submit instead of starting Spark."""
    runs: list[Submitted] = []

    def run_job(
        job: str,
        master: str,
        job_args: list[str],
        env_cache: str | None = None,
        class_cache: str | None = None,
        compiled_root: str | None = None,
    ) -> int:
        runs.append(Submitted(job, master, list(job_args), env_cache, class_cache))
        return 0

    monkeypatch.setattr(submit, "run_job", run_job)
    return runs


@pytest.fixture
def job_runs(monkeypatch: pytest.MonkeyPatch) -> list[Submitted]:
    """The jobs the CLI would submit, with no SHARECOORD_ setting in the environment."""
    runs = record_jobs(monkeypatch)
    for name in list(os.environ):
        if name.startswith("SHARECOORD_"):
            monkeypatch.delenv(name)
    return runs


@pytest.fixture
def small_log(data_dir: str) -> str:
    write_log(data_dir, [], num_partitions=2, segment_bytes=1024)
    return data_dir


@pytest.fixture
def sealed_log(data_dir: str) -> str:
    """A log with a sealed segment: something for compaction to do."""
    k = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0)
    p = state_partition_of(k, 2)
    snapshot = ShareSnapshot(k, 0, 0, 0, 0, 1, 1, [], -1, 0, 0)
    write_log(data_dir, [Appended(p, o, 1, snapshot) for o in range(40)], 2, 1024)
    return data_dir


def compact_args(data_dir: str, retention: str) -> list[str]:
    return [
        "--data-dir", data_dir, "--tombstone-retention-ms", retention,
        "--history-retention-ms", "604800000", "--segment-bytes", "104857600",
    ]  # fmt: skip


def test_compact_takes_its_flags(job_runs: list[Submitted], sealed_log: str) -> None:
    code = sharecoord(
        [
            "compact",
            "--data-dir",
            sealed_log,
            "--master",
            "spark://m:7077",
            "--tombstone-retention-ms",
            "5",
        ]
    )
    assert code == 0
    assert job_runs == [Submitted("compact", "spark://m:7077", compact_args(sealed_log, "5"))]


def test_compact_reads_the_environment_and_the_config_file(
    job_runs: list[Submitted],
    sealed_log: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "sharecoord.toml"
    config.write_text(
        f'data_dir = "{sealed_log}"\nmaster = "local[3]"\ntombstone_retention_ms = 7\n'
    )
    monkeypatch.setenv("SHARECOORD_TOMBSTONE_RETENTION_MS", "9")  # env wins over the file
    monkeypatch.chdir(tmp_path)
    assert sharecoord(["compact", "--config", str(config)]) == 0
    assert job_runs == [Submitted("compact", "local[3]", compact_args(sealed_log, "9"))]


def test_audit_takes_its_settings_and_makes_paths_absolute(
    job_runs: list[Submitted],
    small_log: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(Path(small_log).parent)
    monkeypatch.setenv("SHARECOORD_DELIVERY_LIMIT", "8")
    assert sharecoord(["audit", "--data-dir", "data", "--out", "report"]) == 0
    out = str(Path(small_log).parent / "report")
    job_args = ["--out", out, "--data-dir", small_log, "--delivery-limit", "8"]
    assert job_runs == [Submitted("audit", "local[*]", job_args)]


def test_usage_errors_exit_2_before_any_spark(
    job_runs: list[Submitted],
    small_log: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sharecoord(["audit", "--data-dir", small_log]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert sharecoord(["compact", "--data-dir", str(tmp_path / "nothing")]) == 2
    assert "not a sharecoord data directory" in capsys.readouterr().err
    assert sharecoord(["compact", "--data-dir", small_log, "--tombstone-retention-ms", "-1"]) == 2
    assert job_runs == []


def test_the_py_files_zip_holds_the_pure_packages_and_nothing_else(tmp_path: Path) -> None:
    path = submit.build_py_files(str(tmp_path / "sharecoord.zip"))
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    expected = {
        f"{package}/{name}"
        for package in ("protocol", "persistence", "persistence/postgres", "spark_jobs")
        for name in os.listdir(REPO_ROOT / package)
        if name.endswith(".py")
    }
    assert names == expected
    probe = (
        f"import sys; sys.path.insert(0, {path!r}); import spark_jobs.fold as m; print(m.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert done.stdout.strip() == os.path.join(path, "spark_jobs", "fold.py")


def test_the_command_runs_pyspark_s_spark_submit_with_the_job_file(tmp_path: Path) -> None:
    command = submit.submit_command("audit", "spark://m:7077", ["--data-dir", "/d"], str(tmp_path))
    assert command[0] == os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    assert os.access(command[0], os.X_OK)
    assert command[command.index("--master") + 1] == "spark://m:7077"
    assert command[command.index("--py-files") + 1] == str(tmp_path / "sharecoord.zip")
    assert command[-3:] == [
        os.path.join(os.path.dirname(spark_jobs.__file__), "audit.py"),
        "--data-dir",
        "/d",
    ]
    assert (tmp_path / "log4j2.properties").read_text() == submit.LOG4J2_PROPERTIES


def test_local_runs_use_this_interpreter_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/elsewhere/python")
    local = submit.job_environment("local[2]")
    assert (local["PYSPARK_PYTHON"], local["PYSPARK_DRIVER_PYTHON"]) == (sys.executable,) * 2
    # On a cluster the executors' Python is the cluster's business.
    assert submit.job_environment("spark://m:7077")["PYSPARK_PYTHON"] == "/elsewhere/python"


def documented_spark_submit(module: object) -> list[list[str]]:
    """The command lines of a job module's docstring."""
    doc = str(module.__doc__)
    start = doc.index("    python3 -m zipfile")
    block = doc[start : doc.index("\n\n", start)].replace("\\\n", " ")
    return [shlex.split(line) for line in block.splitlines()]


def run_documented(
    module: object, tmp_path: Path, data_dir: str
) -> subprocess.CompletedProcess[str]:
    zip_line, submit_line = documented_spark_submit(module)
    assert zip_line[:4] == ["python3", "-m", "zipfile", "-c"]
    zip_path = str(tmp_path / zip_line[4])
    subprocess.run(
        [sys.executable, *zip_line[1:4], zip_path, *zip_line[5:]], cwd=REPO_ROOT, check=True
    )
    assert submit_line[:3] == ["spark-submit", "--master", "local[*]"]
    command = [submit.spark_submit_path(), "--master", "local[2]", *submit_line[3:]]
    command[command.index(zip_line[4])] = zip_path
    command = [
        data_dir + arg[len("/data") :] if arg.startswith("/data") else arg for arg in command
    ]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )


@pytest.mark.spark  # spark-submit, in a subprocess
def test_the_documented_compaction_command_works(tmp_path: Path, data_dir: str) -> None:
    build(data_dir, ANOMALOUS_LOG * 3, segment_bytes=300)
    done = run_documented(compact, tmp_path, data_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert compact.COMMITTED_SELF in lines
    assert any(line.startswith("compaction: 2 of 2 partitions compacted") for line in lines), lines


@pytest.mark.spark  # spark-submit, in a subprocess
def test_the_documented_audit_command_works(tmp_path: Path, data_dir: str) -> None:
    build(data_dir, ANOMALOUS_LOG)
    done = run_documented(audit, tmp_path, data_dir)
    # Written to DATA/audit, as documented: the log holds violations, so exit 1.
    assert done.returncode == audit.EXIT_FAILURE, done.stdout + done.stderr
    report = Path(data_dir) / "audit"
    assert json.loads((report / SUMMARY_JSON).read_text())["violations"] == 5
    assert (report / CHART_PNG).is_file() and (report / INDEX_HTML).is_file()


@pytest.mark.spark  # spark-submit, in a subprocess
def test_sharecoord_audit_streams_progress_and_exits_0_on_a_clean_log(
    tmp_path: Path, data_dir: str
) -> None:
    k = key("fine")
    build(data_dir, [snap(k, 1, 0), upd(k, 0, b(0, 9, 1, 1)), upd(k, 5, b(5, 9, 2, 1))])
    out = tmp_path / "report"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.commands.cli",
            "audit",
            "--data-dir",
            data_dir,
            "--out",
            str(out),
            "--master",
            "local[2]",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "audit: replay and audit the history and log of 2 state partitions" in lines
    assert any(line.startswith("audit: stage ") and "finished" in line for line in lines)
    assert lines[-1].startswith(
        "audit result: 2 partitions (0 unreadable), 3 records, 1 share-partitions, 0 violations"
    )
    assert (out / CHART_PNG).read_bytes().startswith(b"\x89PNG")
    assert "Using Spark's default log4j profile" not in done.stderr  # the runner's quiet config


def test_without_spark_submit_the_command_fails_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> str:
        raise FileNotFoundError("/nowhere/bin/spark-submit: pyspark's spark-submit is missing")

    monkeypatch.setattr(submit, "spark_submit_path", missing)
    assert submit.run_job("compact", "local[2]", ["--data-dir", "/d"]) == 1
    assert "sharecoord compact: /nowhere/bin/spark-submit" in capsys.readouterr().err


# -- issue #14: Spark ergonomics --------------------------------------------------------


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", ["compact", "audit"])
def test_no_java_is_a_one_line_usage_error_before_spark_submit(
    job_runs: list[Submitted],
    sealed_log: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    extra = ["--out", str(tmp_path / "report")] if command == "audit" else []
    assert sharecoord([command, "--data-dir", sealed_log, *extra]) == 2
    line = one_line(capsys.readouterr().err)
    assert "Java 17" in line and "PATH" in line
    assert job_runs == []


@pytest.mark.parametrize("master", ["bogus://x", "spark://host", "local[0]", "yarn cluster"])
def test_a_malformed_master_is_a_one_line_usage_error_before_spark_submit(
    job_runs: list[Submitted],
    sealed_log: str,
    capsys: pytest.CaptureFixture[str],
    master: str,
) -> None:
    assert sharecoord(["compact", "--data-dir", sealed_log, "--master", master]) == 2
    assert "master" in one_line(capsys.readouterr().err)
    assert job_runs == []


def test_compact_with_nothing_sealed_says_so_in_one_line_and_starts_no_job(
    job_runs: list[Submitted],
    small_log: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sharecoord(["compact", "--data-dir", small_log, "--segment-bytes", "4096"]) == 0
    out = capsys.readouterr().out
    assert one_line(out) == "nothing to compact: no sealed segments (segments roll at 4096 bytes)"
    assert compact.COMMITTED_SELF not in out and compact.STAGED_FOR_DAEMON not in out
    assert job_runs == []


def test_a_cluster_master_runs_the_driver_with_this_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Whatever python3 comes first on PATH (or was set before) lacks msgpack: the driver
    # runs in client mode here, with the interpreter that has the project installed.
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "python3")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    for master in ("spark://m:7077", "yarn", "k8s://https://k:6443"):
        env = submit.job_environment(master)
        assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable
        assert "PYSPARK_PYTHON" not in env  # the executors' Python is the cluster's


def test_the_caches_reach_the_job_on_either_store(
    sealed_log: str, postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--spark-env-cache is where a cluster's environment archive is packed and kept,
    --spark-class-cache where the driver JVM's classes are, over a data directory and
    over the PostgreSQL store alike."""
    runs = record_jobs(monkeypatch)
    # The CLI hands the URI on to the job in the environment: set and unset here, so
    # that the test's end undoes what the CLI leaves there.
    monkeypatch.setenv(STATE_STORE_ENV, "unset")
    monkeypatch.delenv(STATE_STORE_ENV)
    log = write_store(postgres, appended_of(ANOMALOUS_LOG), 2)
    cache = str(tmp_path / "env-cache")
    where = ["--state-store", log.store.uri, "--state-store-schema", log.store.schema]
    classes = str(tmp_path / "class-cache")
    shipping = ["--master", "spark://m:7077", "--spark-env-cache", cache]
    shipping += ["--spark-class-cache", classes]
    assert sharecoord(["compact", "--data-dir", sealed_log, *shipping]) == 0
    assert sharecoord(["compact", *where, *shipping]) == 0
    assert sharecoord(["audit", *where, "--out", str(tmp_path / "out"), *shipping]) == 0
    assert [(r.job, r.env_cache, r.class_cache) for r in runs] == [
        (job, cache, classes) for job in ("compact", "compact", "audit")
    ]
