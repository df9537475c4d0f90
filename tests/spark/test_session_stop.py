"""A job's Spark session stops without waiting on pyspark's accumulator server
(spark_jobs/session.py, stop_session)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.spark.conftest import REPO_ROOT

JOB_TIMEOUT_S = 300

STOP_SCRIPT = textwrap.dedent(
    """
    import threading
    from spark_jobs.session import spark_session, stop_session

    spark = spark_session("stop-test", "local[1]")
    sc = spark.sparkContext
    total = sc.accumulator(0)
    sc.parallelize(range(10), 2).foreach(lambda x: total.add(x))
    updates = sc._accumulatorServer
    stopped_in = []
    real_shutdown = updates.shutdown

    def shutdown():
        stopped_in.append(threading.current_thread().name)
        real_shutdown()

    updates.shutdown = shutdown
    stop_session(spark)
    for thread in threading.enumerate():
        if thread.name == "accumulator-stop":
            thread.join()
    print(total.value, stopped_in, updates.server_shutdown, updates.socket.fileno())
    """
)


@pytest.mark.spark  # a session of its own, in a subprocess
def test_a_job_s_stop_leaves_the_accumulator_server_s_wait_to_a_thread() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOP_SCRIPT],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The accumulator's updates arrived; the server was shut down, off the main thread,
    # and its socket closed.
    assert done.stdout.splitlines()[-1] == "45 ['accumulator-stop'] True -1"
