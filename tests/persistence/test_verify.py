"""verify() (`sharecoord log verify`): names damage by file and byte, reports a torn or
still-being-written tail as a tail, and never changes the directory."""

from __future__ import annotations

import os

import pytest

from persistence import LogCorruptionError, StateLog, verify, write_staged
from persistence.staging import swap_path
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    check_appends_work_afterwards,
    impossible_frames,
    open_log,
    tree_snapshot,
    write_records,
)

SEGMENT_BYTES = 4 * FRAME_SIZE


def filled(data_dir: str) -> StateLog:
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES, num_partitions=3)
    for part in log.partitions:
        part.open()
        write_records(part, 10)
    return log


def test_a_sound_directory_verifies_with_counts(data_dir: str) -> None:
    filled(data_dir).close()
    report = verify(data_dir)
    assert report.ok
    assert report.num_partitions == 3
    for result in report.partitions:
        assert (result.segment_count, result.record_count) == (3, 10)
        assert (result.first_offset, result.last_offset) == (0, 9)
        assert result.tail is None


def test_damage_is_named_by_file_and_byte_and_the_rest_still_checked(data_dir: str) -> None:
    log = filled(data_dir)
    damaged = log.partition(1).segments[0].path
    log.close()
    with open(damaged, "r+b") as f:
        f.seek(2 * FRAME_SIZE + 50)
        f.write(b"\x00")
    report = verify(data_dir)
    assert not report.ok
    assert [(d.path, d.position) for d in report.partitions[1].damage] == [
        (damaged, 2 * FRAME_SIZE)
    ]
    assert str(report.partitions[1].damage[0]).startswith(f"{damaged}: byte {2 * FRAME_SIZE}: ")
    assert report.partitions[0].ok
    assert report.partitions[2].ok
    assert report.partitions[1].record_count == 8  # the later segments were read too


def test_a_frame_being_written_at_the_newest_tail_is_a_tail_not_damage(data_dir: str) -> None:
    log = filled(data_dir)
    newest = log.partition(2).segments[-1].path
    with open(newest, "ab") as f:
        f.write(b"\x00\x00\x00\x40partial")
    report = verify(data_dir)  # while the log is still open, as beside the daemon
    log.close()
    assert report.ok
    tail = report.partitions[2].tail
    assert tail is not None
    assert (tail.path, tail.position) == (newest, os.path.getsize(newest) - 11)


IMPOSSIBLE = impossible_frames(10)  # as the next append to a filled partition


@pytest.mark.parametrize("kind", IMPOSSIBLE)
def test_a_frame_whose_checksum_holds_is_damage_even_at_the_newest_tail(
    data_dir: str, kind: str
) -> None:
    """Its bytes are what a writer wrote, so it is no torn write: verify names it as
    damage by file and byte, recovery refuses the partition at the same byte, and the
    other partitions take appends."""
    log = filled(data_dir)
    newest = log.partition(2).segments[-1].path
    kept = list(log.partition(0).read())
    size = os.path.getsize(newest)
    with open(newest, "ab") as f:
        f.write(IMPOSSIBLE[kind])
    report = verify(data_dir)  # while the log is still open, as beside the daemon
    log.close()
    assert not report.ok
    result = report.partitions[2]
    assert result.tail is None
    assert [(d.path, d.position) for d in result.damage] == [(newest, size)]
    assert report.partitions[0].ok and report.partitions[1].ok

    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES, num_partitions=3)
    with pytest.raises(LogCorruptionError) as refused:
        log.partition(2).open()
    assert (refused.value.path, refused.value.position) == (newest, size)
    log.partition(0).open()
    check_appends_work_afterwards(log, 0, kept)


def test_a_frame_whose_checksum_holds_cut_short_at_the_tail_is_a_tail(data_dir: str) -> None:
    log = filled(data_dir)
    newest = log.partition(2).segments[-1].path
    size = os.path.getsize(newest)
    with open(newest, "ab") as f:
        f.write(IMPOSSIBLE["key-length-short"][:-1])
    report = verify(data_dir)
    log.close()
    assert report.ok
    tail = report.partitions[2].tail
    assert tail is not None
    assert (tail.path, tail.position) == (newest, size)


def test_verify_changes_nothing_even_where_recovery_would(data_dir: str) -> None:
    log = filled(data_dir)
    part = log.partition(0)
    records = list(part.read())
    write_staged(part.partition_dir, 0, records[3:4], [s.path for s in part.segments[:2]])
    log.close()
    os.replace(
        os.path.join(part.partition_dir, "compaction", "00000000000000000000.cleaned"),
        swap_path(part.partition_dir, 0),
    )  # a swap stopped at its commit point
    with open(os.path.join(part.partition_dir, "00000000000000000008.log"), "ab") as f:
        f.write(b"torn")
    before = tree_snapshot(data_dir)

    report = verify(data_dir)
    assert report.ok
    result = report.partitions[0]
    assert result.record_count == 1 + 2  # the swap file stands in for segments 0 and 4
    assert result.tail is not None
    assert any("half-done compaction swap" in note for note in result.notes)
    assert tree_snapshot(data_dir) == before


def test_a_directory_without_meta_is_a_problem(data_dir: str) -> None:
    os.makedirs(data_dir)
    report = verify(data_dir)
    assert not report.ok
    assert "not a sharecoord data directory" in report.problems[0]
