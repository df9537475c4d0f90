"""Pruning (docs/semantics.md §9 adapted, §A): whole sealed segments lying entirely below the mark
are deleted, nothing at or above it, never the active segment."""

from __future__ import annotations

import errno
import os

import pytest

from persistence import (
    FaultInjectingFileOps,
    PartitionFailedError,
    PartitionLog,
    StateLog,
    commit_staged,
    write_staged,
)
from tests.persistence.log_helpers import FRAME_SIZE, open_log, read_back, write_records

SEGMENT_BYTES = 5 * FRAME_SIZE  # segments at 0, 5, 10, 15, 20 (active) for 22 records


@pytest.fixture
def log(data_dir: str) -> StateLog:
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
    log.partition(0).open()
    write_records(log.partition(0), 22)
    assert [s.base_offset for s in log.partition(0).segments] == [0, 5, 10, 15, 20]
    return log


def bases_on_disk(part: PartitionLog) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(part.partition_dir) if n.endswith(".log"))


@pytest.mark.parametrize(
    ("below", "left"),
    [
        (0, [0, 5, 10, 15, 20]),
        (4, [0, 5, 10, 15, 20]),  # offset 4 is still needed: segment 0 stays
        (5, [5, 10, 15, 20]),  # every offset of segment 0 is below 5
        (12, [10, 15, 20]),
        (20, [20]),
        (21, [20]),  # never the active segment, whatever the mark
        (10**12, [20]),
    ],
)
def test_only_segments_entirely_below_the_mark_are_deleted(
    log: StateLog, below: int, left: list[int]
) -> None:
    part = log.partition(0)
    deleted = part.prune(below)
    assert bases_on_disk(part) == left
    assert [s.base_offset for s in part.segments] == left
    assert sorted(deleted) == sorted(
        os.path.join(part.partition_dir, f"{b:020d}.log") for b in (0, 5, 10, 15) if b not in left
    )
    assert part.log_start_offset == left[0]
    all_records = list(part.read())
    assert all(r.offset >= left[0] for r in all_records)
    assert [r.offset for r in all_records] == list(range(left[0], 22))
    log.close()
    assert [r.offset for r in read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES)] == list(
        range(left[0], 22)
    )


def test_pruning_twice_at_the_same_mark_deletes_nothing_more(log: StateLog) -> None:
    part = log.partition(0)
    assert len(part.prune(12)) == 2
    assert part.prune(12) == []
    log.close()


def test_appends_continue_after_pruning(log: StateLog) -> None:
    part = log.partition(0)
    part.prune(15)
    more = write_records(part, 3, first=22)
    assert [r.offset for r in more] == [22, 23, 24]
    log.close()
    assert [r.offset for r in read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES)] == list(
        range(15, 25)
    )


def test_a_prune_makes_staged_compaction_output_of_those_segments_stale(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    write_staged(part.partition_dir, 0, records[3:5], [s.path for s in part.segments[:2]])
    part.prune(5)
    assert commit_staged(part, 0) == "stale"
    assert os.listdir(os.path.join(part.partition_dir, "compaction")) == []
    assert [r.offset for r in part.read()] == list(range(5, 22))
    log.close()


def test_a_failed_partition_is_not_pruned(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES, fs=fs)
    part = log.partition(0)
    part.open()
    write_records(part, 22)
    fs.fail("fdatasync", errno.EIO)
    with pytest.raises(OSError, match="injected"):
        write_records(part, 1, first=22)
    with pytest.raises(PartitionFailedError):
        part.prune(12)
    assert bases_on_disk(part) == [0, 5, 10, 15, 20]
    log.close()


def test_a_partition_whose_reset_failed_is_not_pruned_and_says_it_failed(data_dir: str) -> None:
    """The prune job meets a partition between a failed commit and a finished reset (no
    longer open): it must hear that the partition failed, which it expects, not an error
    it logs as a bug."""
    fs = FaultInjectingFileOps()
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES, fs=fs)
    part = log.partition(0)
    part.open()
    write_records(part, 22)
    fs.fail("fdatasync", errno.EIO)
    with pytest.raises(OSError, match="injected"):
        write_records(part, 1, first=22)
    fs.fail("truncate", errno.EIO, times=None)
    with pytest.raises(OSError, match="injected"):
        part.reset_to_durable()
    assert not part.is_open
    with pytest.raises(PartitionFailedError):
        part.prune(12)
    assert bases_on_disk(part) == [0, 5, 10, 15, 20]
    fs.clear()
    log.close()
