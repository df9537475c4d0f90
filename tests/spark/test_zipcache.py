"""spark_jobs/zipcache.py: a zip archive on the path is read again on invalidation only
when it changed; installed in Spark's Python workers, nowhere else."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_jobs import zipcache
from tests.spark.conftest import REPO_ROOT


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The archives zipimport reads the directory of, from now on, with zipcache on."""
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]
    seen: list[str] = []

    def counted(archive: str) -> object:
        seen.append(archive)
        return read_directory(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    was_installed = zipcache.installed()
    zipcache.install()
    try:
        yield seen
    finally:
        if not was_installed:
            zipcache.uninstall()


def write_zip(path: Path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in modules.items():
            archive.writestr(f"{name}.py", text)


def test_an_unchanged_archive_is_read_once_and_a_changed_one_again(
    tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "code.zip"
    write_zip(archive, {"zc_first": "VALUE = 1\n"})
    monkeypatch.syspath_prepend(str(archive))
    for name in ("zc_first", "zc_second"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert importlib.import_module("zc_first").VALUE == 1
    mine = [a for a in reads if a == str(archive)]
    importlib.invalidate_caches()  # the first since install: read, and its stamp kept
    importlib.invalidate_caches()
    importlib.invalidate_caches()
    assert [a for a in reads if a == str(archive)] == [*mine, str(archive)]

    write_zip(archive, {"zc_first": "VALUE = 1\n", "zc_second": "VALUE = 2\n"})
    importlib.invalidate_caches()
    assert importlib.import_module("zc_second").VALUE == 2  # what was added is seen

    archive.unlink()
    importlib.invalidate_caches()  # gone: zipimport forgets it, as without zipcache
    importer = sys.path_importer_cache[str(archive)]
    assert isinstance(importer, zipimport.zipimporter)
    assert importer._files == {}  # type: ignore[attr-defined]


def test_uninstall_puts_zipimport_s_own_back(reads: list[str]) -> None:
    assert zipcache.installed()
    zipcache.uninstall()
    assert not zipcache.installed()
    assert zipimport.zipimporter.invalidate_caches.__qualname__ == "zipimporter.invalidate_caches"
    zipcache.install()


def test_outside_a_spark_worker_importing_the_jobs_changes_nothing() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import spark_jobs.compact, spark_jobs.submit; from spark_jobs import zipcache; "
            "print(zipcache.installed())",
        ],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.spark
def test_a_spark_worker_that_runs_a_job_s_task_has_it(spark: SparkSession) -> None:
    def worker_state(_: int) -> tuple[bool, bool]:
        # Importing the jobs' package is what a task that unpickles their functions does.
        import spark_jobs  # noqa: F401, PLC0415
        from spark_jobs import zipcache as in_worker  # noqa: PLC0415

        return in_worker.needed(), in_worker.installed()

    states = spark.sparkContext.parallelize(range(4), 4).map(worker_state).collect()
    assert states == [(sys.version_info < (3, 12),) * 2] * 4
