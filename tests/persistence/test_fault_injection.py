"""FaultInjectingFileOps: the file layer the reliability suite breaks on purpose."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import FAILPOINTS_ENV, FaultInjectingFileOps, FileOps
from tests.persistence.log_helpers import open_log, write_records


def open_file(fs: FileOps, path: Path) -> int:
    return fs.open(str(path), os.O_RDWR | os.O_CREAT)


def test_an_armed_fault_fails_the_matching_call_with_its_errno(tmp_path: Path) -> None:
    fs = FaultInjectingFileOps()
    fd = open_file(fs, tmp_path / "a.log")
    fs.fail("fsync", errno.EIO)
    with pytest.raises(OSError, match="injected") as failed:
        fs.fsync(fd)
    assert failed.value.errno == errno.EIO
    assert failed.value.filename == str(tmp_path / "a.log")
    fs.fsync(fd)  # times=1: armed for one call
    fs.close(fd)


def test_path_contains_after_and_times_select_the_calls(tmp_path: Path) -> None:
    fs = FaultInjectingFileOps()
    (tmp_path / "partitions" / "3").mkdir(parents=True)
    (tmp_path / "partitions" / "4").mkdir(parents=True)
    three = open_file(fs, tmp_path / "partitions" / "3" / "x.log")
    four = open_file(fs, tmp_path / "partitions" / "4" / "x.log")
    fs.fail("fdatasync", errno.EIO, path_contains="partitions/3/", after=1, times=2)
    fs.fdatasync(four)
    fs.fdatasync(three)  # let through: after=1
    for _ in range(2):
        with pytest.raises(OSError, match="injected"):
            fs.fdatasync(three)
    fs.fdatasync(three)
    fs.close(three)
    fs.close(four)


def test_an_fsync_rule_covers_fdatasync_and_directory_fsync(tmp_path: Path) -> None:
    fs = FaultInjectingFileOps()
    fd = open_file(fs, tmp_path / "a.log")
    fs.fail("fsync", errno.EIO, times=None)
    with pytest.raises(OSError, match="injected"):
        fs.fdatasync(fd)
    with pytest.raises(OSError, match="injected"):
        fs.fsync_dir(str(tmp_path))
    fs.clear()
    fs.fdatasync(fd)
    fs.fsync_dir(str(tmp_path))
    fs.close(fd)


def test_a_directory_matches_its_path_with_a_trailing_slash(tmp_path: Path) -> None:
    fs = FaultInjectingFileOps()
    (tmp_path / "partitions" / "3").mkdir(parents=True)
    fs.fail("fsync_dir", errno.EIO, path_contains="partitions/3/")
    with pytest.raises(OSError, match="injected"):
        fs.fsync_dir(str(tmp_path / "partitions" / "3"))


def test_a_short_write_lands_half_the_bytes_then_fails(tmp_path: Path) -> None:
    fs = FaultInjectingFileOps()
    fd = open_file(fs, tmp_path / "a.log")
    fs.fail("write", errno.ENOSPC, short_write=True)
    with pytest.raises(OSError, match="injected") as failed:
        fs.write_all(fd, b"0123456789")
    assert failed.value.errno == errno.ENOSPC
    assert (tmp_path / "a.log").read_bytes() == b"01234"
    fs.close(fd)


def test_unknown_ops_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown op"):
        FaultInjectingFileOps().fail("fsnyc", errno.EIO)


def test_a_control_file_drives_a_process_from_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "failpoints.json"
    monkeypatch.setenv(FAILPOINTS_ENV, str(control))
    fs = FaultInjectingFileOps.from_env()
    data_dir = str(tmp_path / "data")
    log = open_log(data_dir, fs=fs)
    part = log.partition(1)
    part.open()  # no control file yet: no faults
    write_records(part, 2)

    def arm(document: dict[str, object]) -> None:
        temp = tmp_path / "failpoints.tmp"
        temp.write_text(json.dumps(document))
        os.replace(temp, control)

    arm({"faults": [{"op": "fdatasync", "errno": "EIO", "path_contains": "partitions/1/"}]})
    with pytest.raises(OSError, match="injected") as failed:
        write_records(part, 1, first=2)
    assert failed.value.errno == errno.EIO
    part.reset_to_durable()
    write_records(part, 1, first=3)  # times defaults to 1

    arm({"faults": [{"op": "write", "errno": errno.ENOSPC, "times": None}]})
    for _ in range(2):
        with pytest.raises(OSError, match="injected"):
            write_records(part, 1, first=4)
        part.reset_to_durable()
    control.unlink()  # no file: no faults
    write_records(part, 1, first=5)
    assert [r.offset for r in part.read()] == [0, 1, 2, 3]
    log.close()


def test_an_unreadable_control_file_keeps_the_rules_it_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "failpoints.json"
    control.write_text(json.dumps({"faults": [{"op": "unlink", "errno": "EIO", "times": None}]}))
    monkeypatch.setenv(FAILPOINTS_ENV, str(control))
    fs = FaultInjectingFileOps.from_env()
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    with pytest.raises(OSError, match="injected"):
        fs.unlink(str(victim))
    control.write_text('{"faults": [')  # caught mid-write
    with pytest.raises(OSError, match="injected"):
        fs.unlink(str(victim))
    control.write_text('{"faults": []}')
    fs.unlink(str(victim))


_CRASHING_CHILD = """
import os, sys
from persistence import FaultInjectingFileOps
fs = FaultInjectingFileOps.from_env()
directory = sys.argv[1]
for name in ("a", "b"):
    fd = fs.open(os.path.join(directory, name + ".tmp"), os.O_WRONLY | os.O_CREAT)
    fs.close(fd)
    print("renaming", name, flush=True)
    fs.rename(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))
    print("renamed", name, flush=True)
"""


def test_a_crash_rule_kills_the_process_at_the_matching_call(tmp_path: Path) -> None:
    """``"crash": true`` (no errno needed): the process dies by SIGKILL at exactly the
    matching call, before it does anything; the calls before it ran."""
    control = tmp_path / "failpoints.json"
    rule = {"op": "rename", "path_contains": ".tmp", "after": 1, "crash": True}
    control.write_text(json.dumps({"faults": [rule]}))
    repository = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING_CHILD, str(tmp_path)],
        env={**os.environ, FAILPOINTS_ENV: str(control), "PYTHONPATH": str(repository)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.splitlines() == ["renaming a", "renamed a", "renaming b"]
    assert (tmp_path / "a").exists()
    assert (tmp_path / "b.tmp").exists() and not (tmp_path / "b").exists()
