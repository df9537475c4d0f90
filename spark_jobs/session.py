"""The driver side shared by the jobs: the Spark session, the Python its workers run,
and progress lines.

Which Python the workers run (``spark_session`` and ``register_data_source``):

* a local master (``local[*]``, ``local-cluster[...]``): this interpreter, the one
  sharecoord is installed in, for every Python worker;
* another master: the executors' Python is what the session was started with when it was
  chosen (``PYSPARK_PYTHON``, ``spark.pyspark.python``, or the environment `sharecoord
  compact` ships with ``--archives``); otherwise ``spark_session`` ships this
  environment itself (spark_jobs/shipenv.py: ``addArchive`` and the code zip) and makes
  the executors run it. ``register_data_source`` cannot change a running context's
  Python: on a cluster context started with Spark's default ``python3`` it stops with
  one line saying what to set. Either way the session's executors are checked to import
  what the jobs need before any work starts, and a failure is one line
  (``SparkEnvironmentError``), not the JVM's stack trace.

Progress is what a person running `sharecoord compact` wants to see: what the job is
doing (the Spark job description, also shown in the Spark UI) and one line per stage as
it starts, advances and ends — read from ``SparkContext.statusTracker()`` by a polling
thread, instead of the JVM's log and its console progress bar.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import TYPE_CHECKING, TextIO

from py4j.protocol import Py4JJavaError
from pyspark import SparkContext
from pyspark.sql import SparkSession

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSource

POLL_SECONDS = 0.5
# Spark tasks per executor core. A state partition is the unit of work, but a Spark task
# costs tens of milliseconds of scheduling (far more on slow machines): grouping a few
# partitions per task keeps that small, and a few tasks per core keep the cores busy
# when partitions differ in size.
TASKS_PER_CORE = 4
# A stage's progress is printed at most this often (its start and end always are).
PROGRESS_EVERY_SECONDS = 5.0


# What Spark's Python workers start when nothing says otherwise (SparkContext.pythonExec).
SPARK_DEFAULT_PYTHON = "python3"
# A session's SQL setting: the Python of the executors' SQL workers (a Python data
# source's reads among them), which overrides the context's for this session.
SQL_WORKER_PYTHON = "spark.sql.execution.pyspark.python"
# What the executors must import for the jobs and the data source to run there.
EXECUTOR_IMPORTS = ("msgpack", "msgspec", "numpy", "pyarrow", "spark_jobs.logsource")
# And for a job over the PostgreSQL store, whose executors read it themselves.
STORE_IMPORTS = ("psycopg", "spark_jobs.pgsource")


class SparkEnvironmentError(SystemExit):
    """The executors cannot run sharecoord's Python: one line that says why and what to
    do. A SystemExit, as argparse's errors are: a job or a script stops with the line
    alone (exit 1), no traceback; a caller that wants to go on catches it."""

    def __init__(self, line: str) -> None:
        super().__init__(f"sharecoord: {line}")


def spark_session(
    app_name: str,
    master: str | None = None,
    env_cache: str | None = None,
    *,
    reads_store: bool = False,
) -> SparkSession:
    """A session whose Python workers run sharecoord's environment (the module's
    docstring says which Python that is): the one spark-submit configured, or a new one
    on `master` (Spark's default: local). `env_cache`: where a cluster's environment
    archive is kept (shipenv.default_cache_dir() if None); `reads_store`: the executors
    will read a PostgreSQL store (and must import its driver)."""
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master is not None:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        use_sharecoord_python(spark, env_cache)
        check_executors(spark, EXECUTOR_IMPORTS + (STORE_IMPORTS if reads_store else ()))
    except SparkEnvironmentError:
        stop_session(spark)  # the job's own stop is never reached: it has no session yet
        raise
    return spark


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()`` without its last second of waiting. pyspark's accumulator server
    answers the JVM on one connection whose handler polls a shutdown flag once a second;
    ``SparkContext.stop()`` raises the flag and then waits for that poll, which a job's
    own last accumulator update has just restarted: ~1 s at the end of every job. Here
    the flag is raised, the context stops without the server, and the server's own
    shutdown (its thread is a daemon) finishes beside whatever the process does next."""
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None and hasattr(server, "server_shutdown"):
        server.server_shutdown = True
        sc._accumulatorServer = None  # type: ignore[assignment]
    else:
        server = None  # another pyspark: its own stop does what it does
    spark.stop()
    if server is not None:
        threading.Thread(target=server.shutdown, name="accumulator-stop", daemon=True).start()


def is_local(sc: SparkContext) -> bool:
    return str(sc.master).startswith("local")


def python_was_chosen(sc: SparkContext) -> bool:
    """Whether the context's Python workers run a Python somebody chose, not Spark's
    default (spark-submit passes spark.pyspark.python on as PYSPARK_PYTHON)."""
    return sc.pythonExec != SPARK_DEFAULT_PYTHON or bool(os.environ.get("PYSPARK_PYTHON"))


def use_sharecoord_python(spark: SparkSession, env_cache: str | None = None) -> None:
    """Make the context's Python workers (those started from now on) run sharecoord's
    environment: this interpreter on a local master; on another master the chosen
    Python if any, else this environment packed and shipped with the session's jobs."""
    sc = spark.sparkContext
    if is_local(sc):
        sc.pythonExec = sys.executable
        return
    if python_was_chosen(sc):
        return
    # The driver's alone: executors import this module too (check_executors), and
    # packing needs what they need not have (packaging).
    from spark_jobs import shipenv  # noqa: PLC0415
    from spark_jobs.submit import build_py_files  # noqa: PLC0415

    try:
        packed = shipenv.packed_environment(env_cache)
    except shipenv.PackError as exc:
        raise SparkEnvironmentError(
            f"cannot pack the Python environment for the executors of {sc.master}: {exc}"
        ) from None
    code_dir = tempfile.mkdtemp(prefix="sharecoord-code-")
    atexit.register(shutil.rmtree, code_dir, True)
    sc.addArchive(f"{packed.path}#{shipenv.ARCHIVE_ALIAS}")
    sc.addPyFile(build_py_files(os.path.join(code_dir, "sharecoord.zip")))
    sc.pythonExec = shipenv.SHIPPED_PYTHON


def register_data_source(spark: SparkSession, source: type[DataSource]) -> None:
    """Register a Python data source whose workers run sharecoord's environment.

    Its planning (schema, partitions) runs in a Python worker of the driver, its reads
    in the executors', and Spark gives both the Python of the function registered: this
    interpreter, which has the source, for the driver; on a cluster the session's SQL
    setting SQL_WORKER_PYTHON sends the executors' reads to the context's chosen Python
    instead (a value the user set is kept). A cluster context on Spark's default Python
    is refused in one line: it can no longer be given another for all its workers."""
    sc = spark.sparkContext
    if not is_local(sc):
        if not python_was_chosen(sc):
            raise SparkEnvironmentError(
                f"the executors of {sc.master} run Spark's default {SPARK_DEFAULT_PYTHON}, "
                f"which lacks {source.name()}'s dependencies: start the session with "
                "spark_jobs.session.spark_session(NAME, MASTER), which ships them, or set "
                "PYSPARK_PYTHON to a Python that has them before the session starts"
            )
        if spark.conf.get(SQL_WORKER_PYTHON, None) is None:
            spark.conf.set(SQL_WORKER_PYTHON, sc.pythonExec)
    chosen = sc.pythonExec
    sc.pythonExec = sys.executable
    try:
        spark.dataSource.register(source)
    finally:
        sc.pythonExec = chosen


def check_executors(spark: SparkSession, imports: Sequence[str] = EXECUTOR_IMPORTS) -> None:
    """On a cluster, one task per core imports `imports` on the executors: a Python that
    cannot is said in one line (SparkEnvironmentError) before any work, instead of a
    job failing with the JVM's and Python's stack traces."""
    sc = spark.sparkContext
    if is_local(sc):
        return
    tasks = max(1, sc.defaultParallelism)
    sc.setLogLevel("OFF")  # each failed attempt's warning carries a whole traceback
    try:
        sc.parallelize(range(tasks), tasks).foreach(functools.partial(_import_all, imports))
    except Py4JJavaError as exc:
        # The log stays off: the attempts still running when the stage was aborted are
        # killed afterwards, and each kill's warning repeats the traceback.
        raise SparkEnvironmentError(
            f"the executors of {sc.master} cannot run {sc.pythonExec} with sharecoord's "
            f"dependencies: {root_cause(exc)} (docs/operations.md#spark-on-a-cluster)"
        ) from None
    sc.setLogLevel("WARN")


def _import_all(names: Sequence[str], _: int) -> None:
    for name in names:
        importlib.import_module(name)


def root_cause(exc: Py4JJavaError) -> str:
    """The line that says what failed: a Python exception's last line, else the
    innermost Java exception's first."""
    cause = exc.java_exception
    while cause.getCause() is not None:
        cause = cause.getCause()
    lines = [line.strip() for line in str(cause.toString()).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[-1] if any("Traceback (most recent call last)" in x for x in lines) else lines[0]


def task_count(sc: SparkContext, units: int) -> int:
    """How many Spark tasks to spread `units` state partitions over."""
    return max(1, min(units, TASKS_PER_CORE * sc.defaultParallelism))


def balanced_groups(sizes: Sequence[int], tasks: int) -> list[list[int]]:
    """The units ``0 .. len(sizes) - 1`` (state partitions, `sizes` their work: bytes to
    read, say) in at most `tasks` groups of about equal total size, the heaviest group
    first. Each unit goes, largest first, to the group lightest so far; Spark starts a
    stage's tasks in order, so the heaviest run together at the start and the cores end
    the stage at about the same time. Sliced in order instead, 50 equal partitions in 8
    tasks left the two of 7 partitions to one core, idle on the other for the last two
    partitions' time."""
    count = max(1, min(tasks, len(sizes)))
    groups: list[list[int]] = [[] for _ in range(count)]
    lightest = [(0, 0, i) for i in range(count)]  # (size, units, group): ties spread
    for unit in sorted(range(len(sizes)), key=lambda u: (-sizes[u], u)):
        total, units, i = heappop(lightest)
        groups[i].append(unit)
        heappush(lightest, (total + sizes[unit], units + 1, i))
    kept = [sorted(group) for group in groups if group]
    return sorted(kept, key=lambda group: (-sum(sizes[u] for u in group), group))


class Progress:
    """Job descriptions and per-stage lines, printed to `out` from a polling thread.

    Use as a context manager around the job's Spark actions."""

    def __init__(self, sc: SparkContext, prefix: str, out: TextIO | None = None) -> None:
        self._sc = sc
        self._prefix = prefix
        self._out = out or sys.stdout
        self._lock = threading.Lock()
        self._description = ""
        self._report_lock = threading.Lock()
        self._stages: dict[int, tuple[int, float]] = {}  # stage -> (tasks done, printed at)
        self._finished: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._poll, name="spark-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._report(final=True)

    def describe(self, text: str) -> None:
        """Name the Spark jobs that follow (Spark UI and the lines printed here)."""
        self._report(final=True)  # stages of the previous step end under its name
        self._sc.setJobDescription(text)
        with self._lock:
            self._description = text
        self.say(text)

    def say(self, text: str) -> None:
        with self._lock:
            self._out.write(f"{self._prefix}: {text}\n")
            self._out.flush()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._report(final=False)
            except Exception as exc:  # the JVM going away must not kill the job's output
                self.say(f"progress unavailable: {exc!r}")
                return

    def _report(self, *, final: bool) -> None:
        """Print what changed: a stage seen running for the first time, its progress
        (throttled unless `final`), and its end. Stages of every job are looked at, so
        one that ran between two polls still gets its line."""
        with self._report_lock:
            tracker = self._sc.statusTracker()
            active = set(tracker.getActiveStageIds())
            stage_ids = set(active)
            for job_id in tracker.getJobIdsForGroup():
                job = tracker.getJobInfo(job_id)
                if job is not None:
                    stage_ids.update(job.stageIds)
            now = time.monotonic()
            for stage_id in sorted(stage_ids - self._finished):
                info = tracker.getStageInfo(stage_id)
                if info is None:
                    continue
                done, total = info.numCompletedTasks, info.numTasks
                seen = self._stages.get(stage_id)
                if stage_id in active:
                    if seen is None:
                        self._stages[stage_id] = (done, now)
                        self._stage_line(stage_id, f"started, {done}/{total} tasks done")
                    elif done != seen[0] and (final or now - seen[1] >= PROGRESS_EVERY_SECONDS):
                        self._stages[stage_id] = (done, now)
                        self._stage_line(stage_id, f"{done}/{total} tasks done")
                elif seen is not None or done > 0:
                    self._finished.add(stage_id)
                    failed = f", {info.numFailedTasks} failed" if info.numFailedTasks else ""
                    self._stage_line(stage_id, f"finished, {done}/{total} tasks{failed}")

    def _stage_line(self, stage_id: int, text: str) -> None:
        with self._lock:
            description = self._description
        self.say(f"stage {stage_id} ({description}): {text}")
