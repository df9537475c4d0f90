"""The optional compiled mode (server/native.py): a build is used only while it is a build
of the source as it is, and the compiled pass of `make test` (tests/compiled.py) really
runs compiled."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from server import native
from server.commands import cli
from server.commands import spark as spark_commands
from spark_jobs import submit
from tests.compiled import COMPILED_PASS


def _tree(tmp_path: Path) -> Path:
    """A tree holding the compiled modules' sources and the manifest of a build of them."""
    for source in native.MODULES:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(native.ROOT / source, tmp_path / source)
    digests = {source: native._digest(tmp_path / source) for source in native.MODULES}
    (tmp_path / native.MANIFEST).write_text(json.dumps(digests))
    return tmp_path


def test_a_build_is_stale_once_a_source_it_compiled_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)
    monkeypatch.setattr(native, "compiled_modules", lambda: list(native.MODULES))
    assert native.stale_build(root) is None
    with open(root / "protocol/sweep.py", "a") as source:
        source.write("# edited\n")
    stale = native.stale_build(root)
    assert stale is not None
    assert "protocol/sweep.py" in stale and "server/service.py" not in stale
    assert "make compiled" in stale and "make pure" in stale


def test_compiled_modules_without_a_manifest_are_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)
    (root / native.MANIFEST).unlink()
    monkeypatch.setattr(native, "compiled_modules", lambda: ["server/turns.py"])
    assert "server/turns.py" in (native.stale_build(root) or "")


def test_a_compiled_module_whose_source_is_gone_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path)
    (root / "server/turns.py").unlink()
    monkeypatch.setattr(native, "compiled_modules", lambda: list(native.MODULES))
    assert "(server/turns.py)" in (native.stale_build(root) or "")


def test_without_compiled_modules_nothing_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "compiled_modules", lambda: [])
    assert native.stale_build(tmp_path) is None  # no manifest, no sources: no build


def test_serve_refuses_a_stale_build_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    message = "compiled modules older than their source (protocol/sweep.py): run ..."
    monkeypatch.setattr(native, "stale_build", lambda: message)
    data = tmp_path / "data"
    assert cli.main(["serve", "--data-dir", str(data), "--listen", "127.0.0.1:0"]) == 1
    assert capsys.readouterr().err == f"sharecoord serve: {message}\n"
    assert not data.exists()  # refused before anything was made


def test_the_compiled_pass_runs_every_module_compiled_from_its_source() -> None:
    # The pass of tests/compiled.py runs in the tree it built; other runs run in whatever
    # mode the tree is in, and a stale build there fails them here.
    if os.environ.get(COMPILED_PASS) == "1":
        assert native.compiled_modules() == list(native.MODULES)
    assert native.stale_build() is None


# Run by spark-submit as the job file: where each side imports the merge from.
PROBE = """\
from pyspark import SparkContext

from protocol import batches

sc = SparkContext()
executor = sc.parallelize([0], 1).map(lambda _: batches.__file__)
print("driver", batches.__file__)
print("executor", executor.collect()[0])
sc.stop()
"""


@pytest.mark.spark  # spark-submit, in a subprocess
def test_a_local_masters_executors_import_the_modules_the_command_runs(tmp_path: Path) -> None:
    tree = submit.executor_tree("local[1]", spark_commands._compiled_root())
    command = submit.submit_command("compact", "local[1]", [], str(tmp_path), tree=tree)
    assert command[-1] == submit.job_file("compact")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command[-1] = str(probe)
    done = subprocess.run(
        command,
        env=submit.job_environment("local[1]", tree),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    imported = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    if os.environ.get(COMPILED_PASS) == "1":
        assert tree == str(native.ROOT)
    if tree is not None:  # a current build: its extension modules, on both sides
        for side in ("driver", "executor"):
            assert imported[side].startswith(str(native.ROOT / "protocol" / "batches."))
            assert imported[side].endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    else:  # no build, or a stale one: the zip of the sources, on both sides
        assert "--py-files" in command
        zipped = os.path.join("sharecoord.zip", "protocol", "batches.py")
        assert imported["driver"] == os.path.join(tmp_path, zipped)
        assert imported["executor"].endswith(os.sep + zipped)  # Spark's copy of the zip


def test_another_master_or_a_stale_build_ships_the_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(native.ROOT)
    assert submit.executor_tree("local[2]", root) == root
    assert submit.executor_tree("spark://m:7077", root) is None
    assert submit.executor_tree("local[2]", str(tmp_path)) is None  # not where the code is
    assert "--py-files" not in submit.submit_command(
        "compact", "local[2]", [], str(tmp_path), tree=root
    )
    env = submit.job_environment("local[2]", root)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == root
    monkeypatch.setattr(native, "compiled_modules", lambda: ["protocol/batches.py"])
    monkeypatch.setattr(native, "stale_build", lambda: "compiled modules older than their source")
    assert spark_commands._compiled_root() is None
    monkeypatch.setattr(native, "stale_build", lambda: None)
    assert spark_commands._compiled_root() == root
    monkeypatch.setattr(native, "compiled_modules", lambda: [])
    assert spark_commands._compiled_root() is None
