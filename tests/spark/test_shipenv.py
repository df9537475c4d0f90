"""The Python environment the jobs ship to a cluster's executors (spark_jobs/shipenv.py):
what the archive holds runs as a Python of its own with the jobs' dependencies, it is
packed once per environment and rebuilt when the environment changes, the command
passes it the way Spark documents, and a failure to pack it is one line (issue 24).
The runs through a real standalone cluster are tests/spark/test_standalone_cluster.py.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import pytest

from server.commands.cli import main as sharecoord
from spark_jobs import shipenv, submit
from tests.spark.histories import Appended, write_log
from tests.spark.test_audit import key, snap

DAY_S = 86400.0
# What the cache held before the module's packing (name -> age in days): another venv's
# archive in use, one unused past STALE_AFTER_S, a killed packer's partial one, a file
# that is not the cache's.
PLANTED = {
    f"{shipenv.ARCHIVE_PREFIX}inuse.tar.gz": 2.0,
    f"{shipenv.ARCHIVE_PREFIX}stale.tar.gz": 15.0,
    f"{shipenv.PARTIAL_PREFIX}killed.tar.gz": 2.0,
    "notes.txt": 400.0,
}
PRUNED = {f"{shipenv.ARCHIVE_PREFIX}stale.tar.gz", f"{shipenv.PARTIAL_PREFIX}killed.tar.gz"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> shipenv.Packed:
    """This environment, packed once for the module, into a cache holding PLANTED."""
    cache = tmp_path_factory.mktemp("env-cache")
    for name, days in PLANTED.items():
        (cache / name).write_bytes(b"x")
        aged = time.time() - days * DAY_S
        os.utime(cache / name, (aged, aged))
    return shipenv.packed_environment(str(cache))


def unpacked(packed: shipenv.Packed, into: Path) -> Path:
    """As an executor unpacks `--archives ENV#environment`: into ./environment."""
    target = into / shipenv.ARCHIVE_ALIAS
    target.mkdir()
    subprocess.run(["tar", "-xzf", packed.path, "-C", str(target)], check=True)
    return target


def test_the_shipped_python_imports_the_jobs_dependencies_from_the_archive(
    packed: shipenv.Packed, tmp_path: Path
) -> None:
    unpacked(packed, tmp_path)
    probe = (
        "import sys, msgpack, msgspec, numpy, pyarrow\n"
        "print(sys.prefix)\n"
        "print('\\n'.join(m.__file__ for m in (msgpack, msgspec, numpy, pyarrow)))\n"
    )
    # As an executor starts it: the relative path, in the directory it was unpacked in,
    # with nothing of this process's environment.
    done = subprocess.run(
        [shipenv.SHIPPED_PYTHON, "-c", probe],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    prefix, *files = done.stdout.splitlines()
    assert prefix == str(tmp_path / shipenv.ARCHIVE_ALIAS)
    assert all(f.startswith(prefix + "/lib/") for f in files), files


def test_the_archive_holds_the_executor_extra_and_neither_pyspark_nor_sharecoord(
    packed: shipenv.Packed,
) -> None:
    with tarfile.open(packed.path) as archive:
        names = archive.getnames()
        python = archive.getmember("bin/python")
    top = {n.split("/")[3] for n in names if n.startswith("lib/") and n.count("/") >= 3}
    assert {"msgpack", "msgspec", "numpy", "pyarrow"} <= top
    assert not top & {"pyspark", "py4j", "spark_jobs", "protocol", "persistence", "server"}
    assert python.issym() and python.linkname == shipenv.base_python()
    shipped = {d.metadata["Name"].lower() for d in shipenv.executor_distributions()}
    # The extra (pyproject.toml's spark-executor) and what its members require.
    assert {"msgpack", "msgspec", "numpy", "pyarrow", "psycopg", "psycopg-binary"} <= shipped
    assert not shipped & {"pyspark", "py4j", "sharecoord", "aiohttp", "uvloop"}


def test_an_unchanged_environment_is_packed_once(packed: shipenv.Packed, tmp_path: Path) -> None:
    long_ago = time.time() - 30 * DAY_S
    os.utime(packed.path, (long_ago, long_ago))
    again = shipenv.packed_environment(os.path.dirname(packed.path), lambda _: None)
    assert (again.path, again.built) == (packed.path, False)
    assert packed.built
    # Used now: a packing elsewhere must not take it for stale.
    assert time.time() - os.stat(packed.path).st_mtime < DAY_S


def test_packing_deletes_the_archives_unused_for_two_weeks_and_nothing_else(
    packed: shipenv.Packed,
) -> None:
    left = set(os.listdir(os.path.dirname(packed.path)))
    assert left == (set(PLANTED) - PRUNED) | {os.path.basename(packed.path)}


def fake_distribution(root: Path, version: str, record: str) -> metadata.Distribution:
    """An installed distribution as importlib.metadata reads it from a site directory."""
    info = root / f"fake-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake\nVersion: {version}\n")
    (info / "RECORD").write_text(record)
    return metadata.PathDistribution(info)


def test_a_changed_distribution_changes_the_key(tmp_path: Path) -> None:
    base = fake_distribution(tmp_path / "a", "1.0", "fake/__init__.py,sha256=aaa,10\n")
    same = fake_distribution(tmp_path / "b", "1.0", "fake/__init__.py,sha256=aaa,10\n")
    newer = fake_distribution(tmp_path / "c", "1.1", "fake/__init__.py,sha256=aaa,10\n")
    rebuilt = fake_distribution(tmp_path / "d", "1.0", "fake/__init__.py,sha256=bbb,10\n")
    key = shipenv.environment_key
    assert key([base]) == key([same])
    assert len({key([base]), key([newer]), key([rebuilt]), key([])}) == 4


def test_a_cluster_master_gets_the_archive_the_way_spark_documents(
    packed: shipenv.Packed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    out = io.StringIO()
    options = submit.shipping_options(
        "compact", "spark://m:7077", os.path.dirname(packed.path), out
    )
    assert options == [
        "--archives",
        f"{packed.path}#environment",
        "--conf",
        "spark.pyspark.python=./environment/bin/python",
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
    ]
    assert "cached" in out.getvalue()
    # A local master runs this interpreter; a set PYSPARK_PYTHON names the executors'.
    assert submit.shipping_options("compact", "local[2]", "/nowhere", out) == []
    monkeypatch.setenv("PYSPARK_PYTHON", "python3")
    assert submit.shipping_options("compact", "spark://m:7077", "/nowhere", out) == []


@pytest.mark.parametrize("command", ["compact", "audit"])
def test_an_environment_that_cannot_be_packed_is_one_line_and_exit_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    data_dir = str(tmp_path / "data")
    k = key("g")
    write_log(data_dir, [Appended(0, o, 1, snap(k, 1, 0)) for o in range(40)], 1, 1024)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    extra = ["--out", str(tmp_path / "report")] if command == "audit" else []
    args = [command, "--data-dir", data_dir, *extra, "--master", "spark://127.0.0.1:9"]
    assert sharecoord([*args, "--spark-env-cache", str(blocker / "cache")]) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"sharecoord {command}: cannot pack the Python environment")
    assert str(blocker) in line and "Not a directory" in line
