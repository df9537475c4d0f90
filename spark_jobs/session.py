"""The driver side shared by the jobs: the Spark session and progress lines.

Progress is what a person running `sharecoord compact` wants to see: what the job is
doing (the Spark job description, also shown in the Spark UI) and one line per stage as
it starts, advances and ends — read from ``SparkContext.statusTracker()`` by a polling
thread, instead of the JVM's log and its console progress bar.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from pyspark import SparkContext
from pyspark.sql import SparkSession

POLL_SECONDS = 0.5
# Spark tasks per executor core. A state partition is the unit of work, but a Spark task
# costs tens of milliseconds of scheduling (far more on slow machines): grouping a few
# partitions per task keeps that small, and a few tasks per core keep the cores busy
# when partitions differ in size.
TASKS_PER_CORE = 4
# A stage's progress is printed at most this often (its start and end always are).
PROGRESS_EVERY_SECONDS = 5.0


def spark_session(app_name: str) -> SparkSession:
    """The job's session: the one spark-submit configured, or a new local one."""
    spark = (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def task_count(sc: SparkContext, units: int) -> int:
    """How many Spark tasks to spread `units` state partitions over."""
    return max(1, min(units, TASKS_PER_CORE * sc.defaultParallelism))


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
