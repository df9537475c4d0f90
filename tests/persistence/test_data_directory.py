"""DATA/meta fixes the partition count, DATA/LOCK admits one writer, read-only opens
change nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import LogCorruptionError, LogError, LogLockedError, MetaMismatchError, StateLog
from tests.persistence.log_helpers import (
    NUM_PARTITIONS,
    append_records,
    open_log,
    tree_snapshot,
    write_records,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_new_directory_gets_meta_a_journal_and_one_directory_per_partition(
    data_dir: str,
) -> None:
    StateLog.open(data_dir, 3).close()
    with open(os.path.join(data_dir, "meta")) as meta:
        assert json.load(meta) == {"format": 2, "num_partitions": 3}
    assert sorted(os.listdir(os.path.join(data_dir, "partitions"))) == ["0", "1", "2"]
    assert "CHECKPOINT" in os.listdir(os.path.join(data_dir, "journal"))
    assert not [n for n in os.listdir(data_dir) if n.endswith(".tmp")]


def test_a_format_1_directory_is_migrated_on_its_first_writable_open(data_dir: str) -> None:
    log = open_log(data_dir)
    log.partition(1).open()
    written = write_records(log.partition(1), 5)
    log.close()
    # What a format-1 directory was: meta format 1 and no journal.
    shutil.rmtree(os.path.join(data_dir, "journal"))
    with open(os.path.join(data_dir, "meta"), "w") as meta:
        json.dump({"format": 1, "num_partitions": NUM_PARTITIONS}, meta)
    read_only = StateLog.open(data_dir, None, lock=False)  # read-only: read, not migrated
    read_only.partition(1).open()
    assert list(read_only.partition(1).read()) == written
    read_only.close()
    assert not os.path.exists(os.path.join(data_dir, "journal"))
    log = open_log(data_dir)
    log.partition(1).open()
    assert list(log.partition(1).read()) == written
    more = write_records(log.partition(1), 2, 5)
    log.close()
    with open(os.path.join(data_dir, "meta")) as meta:
        assert json.load(meta) == {"format": 2, "num_partitions": NUM_PARTITIONS}
    log = open_log(data_dir)
    log.partition(1).open()
    assert list(log.partition(1).read()) == written + more
    log.close()


def test_a_partition_directory_gone_missing_is_damage_not_a_fresh_start(data_dir: str) -> None:
    log = open_log(data_dir)
    log.partition(1).open()
    write_records(log.partition(1), 3)
    log.close()
    shutil.rmtree(os.path.join(data_dir, "partitions", "1"))
    log = open_log(data_dir)
    log.partition(0).open()
    with pytest.raises(LogCorruptionError, match="partition directory is missing"):
        log.partition(1).open()
    log.close()
    assert not os.path.exists(os.path.join(data_dir, "partitions", "1"))


def test_a_crash_before_meta_was_written_starts_the_directory_afresh(data_dir: str) -> None:
    StateLog.open(data_dir, 2).close()
    os.unlink(os.path.join(data_dir, "meta"))  # the partition directories came first
    log = StateLog.open(data_dir, 2)
    assert log.partition(1).open().log_end_offset == 0
    log.close()


def test_reopening_with_another_partition_count_is_refused_with_both_numbers(
    data_dir: str,
) -> None:
    StateLog.open(data_dir, 50).close()
    with pytest.raises(MetaMismatchError) as refused:
        StateLog.open(data_dir, 10)
    message = str(refused.value)
    assert data_dir in message
    assert "num_partitions=50" in message
    assert "num_partitions=10" in message
    assert isinstance(refused.value, ValueError)
    assert not os.path.exists(os.path.join(data_dir, "partitions", "50"))
    StateLog.open(data_dir, 50).close()  # the refusal released the lock


def test_a_meta_file_of_another_format_is_refused(data_dir: str) -> None:
    os.makedirs(data_dir)
    with open(os.path.join(data_dir, "meta"), "w") as meta:
        json.dump({"format": 3, "num_partitions": 3}, meta)
    with pytest.raises(MetaMismatchError, match="unknown format"):
        StateLog.open(data_dir, 3)


def test_a_second_opener_is_refused_while_the_first_holds_the_lock(data_dir: str) -> None:
    first = StateLog.open(data_dir, 2)
    with pytest.raises(LogLockedError) as refused:
        StateLog.open(data_dir, 2)
    assert data_dir in str(refused.value)
    assert refused.value.data_dir == data_dir
    first.close()
    StateLog.open(data_dir, 2).close()


def test_another_process_holding_the_lock_keeps_this_one_out(data_dir: str) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from persistence import StateLog; "
            "log = StateLog.open(sys.argv[1], 2); print('locked', flush=True); sys.stdin.read()",
            data_dir,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(LogLockedError):
            StateLog.open(data_dir, 2)
        StateLog.open(data_dir, None, lock=False).close()  # readers need no lock
    finally:
        holder.stdin.close()
        holder.wait()
        holder.stdout.close()
    StateLog.open(data_dir, 2).close()  # the lock died with its holder


def test_a_read_only_open_takes_the_count_from_meta_and_changes_nothing(data_dir: str) -> None:
    log = open_log(data_dir, num_partitions=3)
    log.partition(1).open()
    written = write_records(log.partition(1), 5)
    append_records(log.partition(1), 1)
    log.partition(1).commit()
    with open(log.partition(1).segments[-1].path, "ab") as segment:
        segment.write(b"\x00\x00\x01")  # a frame being written
    log.close()
    before = tree_snapshot(data_dir)

    reader = StateLog.open(data_dir, None, lock=False)
    assert reader.num_partitions == 3
    report = reader.partition(1).open()
    assert report.torn_tail is not None
    assert report.torn_tail.broken_path is None  # reported, not cut
    assert list(reader.partition(1).read())[:5] == written
    with pytest.raises(LogError, match="not open for appends"):
        reader.partition(1).append(0, b"k", b"v", 0)
    reader.close()
    assert tree_snapshot(data_dir) == before


def test_a_read_only_open_of_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(MetaMismatchError, match="not a sharecoord data directory"):
        StateLog.open(str(tmp_path / "nowhere"), None, lock=False)


def test_partition_numbers_outside_the_directory_are_refused(data_dir: str) -> None:
    with StateLog.open(data_dir, 2) as log, pytest.raises(IndexError):
        log.partition(2)
