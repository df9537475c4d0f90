"""Segments roll at segment_bytes; readers iterate from any offset, verify what they
read, and cope with sparse offsets and a frame still being written."""

from __future__ import annotations

import os

import pytest

from persistence import (
    LogCorruptionError,
    LogRecord,
    encode_frame,
    list_segments,
    read_partition,
    read_segment,
    write_staged,
)
from persistence.segments import SegmentState
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    append_records,
    open_log,
    read_back,
    write_records,
)


def test_a_segment_rolls_when_the_next_frame_would_pass_segment_bytes(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=3 * FRAME_SIZE + FRAME_SIZE // 2)
    part = log.partition(0)
    part.open()
    write_records(part, 10)
    assert [(s.base_offset, s.size_bytes) for s in part.segments] == [
        (0, 3 * FRAME_SIZE),
        (3, 3 * FRAME_SIZE),
        (6, 3 * FRAME_SIZE),
        (9, FRAME_SIZE),
    ]
    assert [os.path.basename(s.path) for s in part.segments][:2] == [
        "00000000000000000000.log",
        "00000000000000000003.log",
    ]
    assert part.size_bytes == 10 * FRAME_SIZE
    log.close()


def test_a_frame_larger_than_segment_bytes_gets_a_segment_of_its_own(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=100)
    part = log.partition(0)
    part.open()
    part.append(0, b"k", b"x" * 500, 0)
    part.append(0, b"k", b"x" * 500, 0)
    part.commit()
    assert [s.base_offset for s in part.segments] == [0, 1]
    log.close()


def test_rolling_across_one_commit_keeps_every_record_in_order(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(0)
    part.open()
    records = append_records(part, 23)  # one batch, six segments
    part.commit()
    log.close()
    assert read_back(data_dir, 0, segment_bytes=4 * FRAME_SIZE) == records


@pytest.mark.parametrize("start", [0, 1, 4, 5, 7, 11, 12, 100])
def test_reading_from_an_offset_yields_exactly_the_records_from_there(
    data_dir: str, start: int
) -> None:
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(0)
    part.open()
    records = write_records(part, 12)
    assert list(part.read(start)) == records[start:]
    log.close()
    assert list(read_partition(part.partition_dir, start)) == records[start:]


def test_the_next_offset_after_reopening_continues_the_log(data_dir: str) -> None:
    log = open_log(data_dir)
    log.partition(0).open()
    write_records(log.partition(0), 7)
    log.close()
    log = open_log(data_dir)
    report = log.partition(0).open()
    assert report.log_end_offset == 7
    assert log.partition(0).append(0, b"k", None, 0) == 7
    log.close()


def test_reads_in_the_daemon_see_only_durable_records(data_dir: str) -> None:
    log = open_log(data_dir)
    part = log.partition(0)
    part.open()
    durable = write_records(part, 3)
    append_records(part, 2, first=3)  # buffered, not yet written
    assert list(part.read()) == durable
    log.close()


def test_sparse_offsets_of_a_compacted_segment_read_back(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(0)
    part.open()
    records = write_records(part, 10)
    kept = [records[1], records[3], records[7]]
    write_staged(part.partition_dir, 0, kept, [s.path for s in part.segments[:2]])
    assert part.commit_staged(0) == "committed"
    assert list(part.read()) == kept + records[8:]
    assert list(part.read(4)) == [records[7], *records[8:]]
    log.close()
    assert read_back(data_dir, 0, segment_bytes=4 * FRAME_SIZE) == kept + records[8:]


def test_an_offline_reader_stops_at_a_frame_still_being_written(data_dir: str) -> None:
    log = open_log(data_dir)
    part = log.partition(0)
    part.open()
    records = write_records(part, 4)
    newest = part.segments[-1].path
    with open(newest, "ab") as segment:
        segment.write(encode_frame(4, 0, 0, b"k", b"v")[:20])
    assert list(read_partition(part.partition_dir)) == records
    assert list(read_segment(newest, allow_torn_tail=True)) == records
    with pytest.raises(LogCorruptionError) as refused:
        list(read_segment(newest))
    assert refused.value.position == 4 * FRAME_SIZE
    log.close()


def test_an_offline_reader_reads_what_recovery_keeps_of_a_torn_tail(data_dir: str) -> None:
    log = open_log(data_dir)
    part = log.partition(0)
    part.open()
    records = write_records(part, 6)
    newest = part.segments[-1].path
    log.close()
    with open(newest, "r+b") as segment:
        segment.seek(4 * FRAME_SIZE)
        segment.write(b"\0" * 2 * FRAME_SIZE)  # the last two frames never reached the disk
    assert list(read_partition(part.partition_dir)) == records[:4]
    assert read_back(data_dir, 0) == records[:4]
    with open(newest, "r+b") as segment:
        segment.seek(FRAME_SIZE)
        segment.write(b"\0" * FRAME_SIZE)  # and now one in the middle
    with pytest.raises(LogCorruptionError) as refused:
        list(read_partition(part.partition_dir))
    assert refused.value.position == FRAME_SIZE


def test_an_offline_reader_refuses_damage(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(0)
    part.open()
    write_records(part, 10)
    log.close()
    oldest = list_segments(part.partition_dir)[0].path
    with open(oldest, "r+b") as segment:
        segment.seek(FRAME_SIZE + 40)
        segment.write(b"\xff")
    with pytest.raises(LogCorruptionError) as refused:
        list(read_partition(part.partition_dir))
    assert (refused.value.path, refused.value.position) == (oldest, FRAME_SIZE)


def test_list_segments_gives_base_offsets_paths_and_sizes(data_dir: str) -> None:
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(1)
    part.open()
    write_records(part, 9)
    assert list_segments(part.partition_dir) == part.segments
    assert [s.base_offset for s in part.segments] == [0, 4, 8]
    log.close()


def test_a_tombstone_and_an_empty_value_read_back_distinctly(data_dir: str) -> None:
    log = open_log(data_dir)
    part = log.partition(0)
    part.open()
    part.append(0, b"gone", None, 5)
    part.append(1, b"empty", b"", 6)
    part.commit()
    log.close()
    assert read_back(data_dir, 0) == [
        LogRecord(0, 5, 0, b"gone", None),
        LogRecord(1, 6, 1, b"empty", b""),
    ]


@pytest.mark.parametrize("chunk", [1, 7, 97, 4096])
def test_frames_straddling_read_chunks_read_back_and_damage_keeps_its_position(
    data_dir: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("persistence.segments.READ_CHUNK", chunk)
    log = open_log(data_dir)
    part = log.partition(0)
    part.open()
    records = [
        LogRecord(
            part.append(i % 2, b"k" * (i % 13), b"v" * (i * 37 % 301), i),
            i,
            i % 2,
            b"k" * (i % 13),
            b"v" * (i * 37 % 301),
        )
        for i in range(60)
    ]
    part.commit()
    assert list(part.read()) == records
    newest = part.segments[-1].path
    log.close()
    size = os.path.getsize(newest)
    with open(newest, "ab") as segment:
        segment.write(encode_frame(60, 0, 0, b"k", b"v" * 50)[:30])
    assert list(read_partition(os.path.dirname(newest))) == records
    damaged_frame = max(p for p in frame_starts(newest, size) if p <= size // 2)
    with open(newest, "r+b") as segment:
        segment.seek(size // 2)
        segment.write(b"\xee")
    with pytest.raises(LogCorruptionError) as refused:
        list(read_segment(newest))
    assert refused.value.position == damaged_frame


def frame_starts(path: str, size: int) -> list[int]:
    starts, position = [], 0
    with open(path, "rb") as segment:
        data = segment.read(size)
    while position < size:
        starts.append(position)
        position += 4 + int.from_bytes(data[position : position + 4], "big")
    return starts


def test_the_published_segments_match_the_files_and_a_write_remakes_only_its_own(
    data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each write (the thread's, with rolls, and the loop's, within the active
    segment) the segments a reader sees are the files as they are; and a write makes
    again the info of the segments it wrote to only, not of every segment the
    partition has (which made a write's cost grow with the log)."""
    log = open_log(data_dir, segment_bytes=4 * FRAME_SIZE)
    part = log.partition(0)
    part.open()

    def on_disk() -> list[tuple[int, int]]:
        return [(s.base_offset, os.path.getsize(s.path)) for s in list_segments(part.partition_dir)]

    made: list[int] = []
    info = SegmentState.info
    monkeypatch.setattr(SegmentState, "info", lambda self: made.append(1) or info(self))
    records: list[LogRecord] = []
    for count in (3, 9, 1, 2, 13, 2):  # rolls by one, by several, none, onto a full one
        records += append_records(part, count, first=len(records))
        before = len(part.segments)
        made.clear()
        part.write_batch(part.take_pending())
        assert [(s.base_offset, s.size_bytes) for s in part.segments] == on_disk()
        assert len(made) == len(part.segments) - before + 1
    assert len(part.segments) == 8
    for fits in (True, True, False):  # the loop's writes while the active segment has room
        records += append_records(part, 1, first=len(records))
        batch = part.take_pending()
        assert batch is not None
        part.journaled(batch)
        made.clear()
        assert part.try_apply(batch) is fits
        if fits:
            assert len(made) == 1
        else:
            part.apply_batch(batch)  # the commit thread's, with its roll
        assert [(s.base_offset, s.size_bytes) for s in part.segments] == on_disk()
    log.close()
    assert read_back(data_dir, 0, segment_bytes=4 * FRAME_SIZE) == records
