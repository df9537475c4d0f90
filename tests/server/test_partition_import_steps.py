"""The writes of `sharecoord partition import` (server/partition_import.py, steps a-g):

* a failure at any step before the commit point undoes the steps before it: the data
  directory is as it was but for the journal and LOCK, which opening it under the lock
  rewrites whatever the tool (a new data directory is gone again);
* a crash (a real SIGKILL) right after any step leaves the partition absent, empty or
  refused as the daemon sees it, never half imported; once past the commit point, whole;
* a rerun then finishes the import, and a rerun of a finished import does nothing.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import FileOps
from server.partition_import import import_partition
from tests.harness import REPO_ROOT, child_env
from tests.server.exports import (
    MOVED,
    NODE,
    TARGETS,
    Export,
    check_imported,
    checkpoint_positions,
    copied,
    make_export,
    make_target,
    owner_of_moved,
    run_import,
    served,
)
from tests.tree_listing import Listing, tree_listing


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SHARECOORD_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return make_export(tmp_path_factory.mktemp("import-source"))


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("import-targets")
    return {name: make_target(root / name, owners) for name, owners in TARGETS.items()}


def steps(export: Export) -> dict[str, tuple[str, int]]:
    """Each step by the rename that ends it: (suffix of its source path, which one)."""
    data_file = next(p for p in sorted(export.history) if p.startswith("state_partition="))
    return {
        "a-owner": (f"/partitions/.import-{MOVED}/OWNER.tmp", 1),
        "b-history": (f"/.import-{os.path.basename(data_file)}", 1),
        "c-aside": (f"/partitions/{MOVED}", 1),
        "d-checkpoint": ("/journal/CHECKPOINT.tmp", 2),  # the first: the open's recovery
        "e-assignment": ("/ASSIGNMENT.tmp", 1),
        "f-commit": (f"/partitions/.import-{MOVED}", 1),
    }


STEPS = ["a-owner", "b-history", "c-aside", "d-checkpoint", "e-assignment", "f-commit"]
CASES = [
    pytest.param(target, step, id=f"{target}-{step}")
    for target in TARGETS
    for step in STEPS
    if not (target == "moved-here" and step == "c-aside")  # nothing there to move aside
]


def outside_the_lock(listing: Listing) -> Listing:
    """What opening under the lock leaves alone: all but the journal and LOCK."""
    return {p: e for p, e in listing.items() if p != "LOCK" and not p.startswith("journal")}


class FailingRename(FileOps):
    """Fails the n-th rename whose source path ends with `suffix`, before it is done."""

    def __init__(self, suffix: str, nth: int) -> None:
        self.suffix = suffix
        self.left = nth

    def rename(self, src: str, dst: str) -> None:
        if src.endswith(self.suffix):
            self.left -= 1
            if self.left == 0:
                raise OSError(errno.EIO, "injected", src)
        super().rename(src, dst)


@pytest.mark.parametrize(("target", "step"), CASES)
def test_a_failure_at_a_step_undoes_the_steps_before_it(
    export: Export,
    templates: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    step: str,
) -> None:
    data_dir = copied(templates[target], tmp_path / "data")
    was_served = served(data_dir)
    before, positions = tree_listing(data_dir), checkpoint_positions(data_dir)
    fs = FailingRename(*steps(export)[step])
    with pytest.raises(OSError, match="injected"):
        import_partition(data_dir, str(export.path), None, fs=fs)
    assert outside_the_lock(tree_listing(data_dir)) == outside_the_lock(before)
    assert checkpoint_positions(data_dir) == positions
    assert served(data_dir) == was_served
    # Nothing in the way of doing it again.
    code, errors, _ = run_import(capsys, data_dir, export.path)
    assert code == 0, errors
    check_imported(data_dir, export)


@pytest.mark.parametrize("step", ["a-owner", "f-commit"])
def test_a_failed_import_into_a_new_data_directory_removes_it(
    export: Export, tmp_path: Path, step: str
) -> None:
    data_dir = str(tmp_path / "new")
    fs = FailingRename(*steps(export)[step])
    with pytest.raises(OSError, match="injected"):
        import_partition(data_dir, str(export.path), NODE, fs=fs)
    assert not os.path.lexists(data_dir)


def crash_after(data_dir: str, export: Export, step: str) -> None:
    suffix, nth = steps(export)[step]
    child = [sys.executable, "-m", "tests.server.import_crash_child", data_dir]
    done = subprocess.run(
        [*child, str(export.path), str(NODE), suffix, str(nth)],
        env=child_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize(("target", "step"), CASES)
def test_after_a_crash_at_any_step_the_partition_is_never_half_imported_and_a_rerun_finishes(
    export: Export,
    templates: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    step: str,
) -> None:
    data_dir = copied(templates[target], tmp_path / "data")
    crash_after(data_dir, export, step)
    # Where it stopped: each step done is on disk, none after it.
    done = STEPS[: STEPS.index(step) + 1]
    last = export.manifest["segments"][-1]
    imported_at = (int(last["name"].split(".")[0]), last["size"], len(export.records))
    assert (checkpoint_positions(data_dir).get(MOVED) == imported_at) == ("d-checkpoint" in done)
    if target == "moved-here":
        assert (owner_of_moved(data_dir) == NODE) == ("e-assignment" in done)
    partition = Path(data_dir, "partitions", str(MOVED))
    assert partition.exists() == (
        (target == "held-empty" and "c-aside" not in done) or "f-commit" in done
    )
    seen = served(data_dir)  # the daemon started on what the crash left
    if step == "f-commit":
        assert seen == export.records
    elif isinstance(seen, list):  # served as before the import: empty
        assert (target, seen) == ("held-empty", [])
        assert step in ("a-owner", "b-history")
    else:
        assert f"state partition {MOVED} " in seen
    code, errors, out = run_import(capsys, data_dir, export.path)
    assert code == 0, errors
    if step == "f-commit":
        assert "already holds this export" in out
    check_imported(data_dir, export)


def test_a_rerun_of_a_finished_import_changes_nothing(
    export: Export, templates: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = copied(templates["moved-here"], tmp_path / "data")
    code, errors, out = run_import(capsys, data_dir, export.path)
    assert code == 0, errors
    assert out.startswith(f"imported state partition {MOVED} into {data_dir} for node {NODE}")
    check_imported(data_dir, export)
    before = tree_listing(data_dir)
    code, errors, out = run_import(capsys, data_dir, export.path)
    assert (code, errors) == (0, [])
    assert out == (
        f"state partition {MOVED} of {data_dir} already holds this export (an import of it "
        "finished before): nothing to do\n"
    )
    assert tree_listing(data_dir) == before
