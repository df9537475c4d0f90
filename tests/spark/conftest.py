"""The Spark suite's fixtures: one local[2] session for the whole run, shipping the
project's packages to its executors the way `sharecoord compact` does (--py-files)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_jobs.submit import build_py_files

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # Executors run this interpreter (driver and executors share a Python version).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("sharecoord-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    zip_path = build_py_files(str(tmp_path_factory.mktemp("py-files") / "sharecoord.zip"))
    session.sparkContext.addPyFile(zip_path)
    yield session
    session.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


# PySpark leaves the socket it reads a collect()'s results from to the garbage collector
# (pyspark/util.py, _load_from_socket: "The socket will be automatically closed when
# garbage-collected."); Python reports each one as unclosed. Nothing
# else is let through: every other warning still fails the test.
SPARK_WARNING_FILTERS = (
    "ignore:unclosed <socket.socket:ResourceWarning",
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            for spec in SPARK_WARNING_FILTERS:
                item.add_marker(pytest.mark.filterwarnings(spec))
            # The suite's `spark` marker: every test that starts a JVM, in process
            # (the session fixture) or through spark-submit (marked in its module).
            if "spark" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.spark)
