"""Recovery against a table of damage, one row per case (after etcd's wal tests).

Each row damages partition 0 of a log whose newest segment is 10 frames into its fourth
segment, and states the outcome the next open must reach:
  clean   - opens, keeps `records`;
  torn    - opens, cuts the newest segment at `position`, keeps the cut bytes in a
            .broken file, logs it, keeps `records`;
  corrupt - refuses partition 0 with LogCorruptionError naming `path` and `position`
            and changes nothing; partition 1 still opens.
Then, in every row, appends and group commit work (on partition 0, or on partition 1
when partition 0 is refused) and a reopen reads everything back.

A frame whose checksum holds but whose fields are impossible (persistence/frame.py:
InvalidFrame) was written so, never torn: it is damage even as the very last frame of
the newest segment, where a frame that fails its checksum is taken for a torn write.
Only the end of the file cutting it short makes it a torn tail again.
"""

from __future__ import annotations

import logging
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pytest

from persistence import LogCorruptionError, LogRecord, SegmentInfo, encode_frame, verify
from persistence.frame import KEY_AT, KEY_LENGTH_AT
from persistence.partition import PartitionLog, RecoveryReport
from persistence.segments import segment_path
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    check_appends_work_afterwards,
    file_bytes,
    frames_in,
    impossible_frames,
    open_log,
    resealed,
    write_records,
)

SEGMENT_BYTES = 16 * FRAME_SIZE  # 16 frames per segment
RECORDS = 3 * 16 + 10  # three full segments, ten frames in the newest
SECTOR = 512


@dataclass
class Built:
    data_dir: str
    records: list[LogRecord]  # partition 0, as written
    segments: list[SegmentInfo]  # partition 0, oldest first
    other: list[LogRecord]  # partition 1, as written

    @property
    def newest(self) -> str:
        return self.segments[-1].path

    def segment(self, index: int) -> str:
        return self.segments[index].path


@dataclass
class Outcome:
    kind: Literal["clean", "torn", "corrupt"]
    records: list[LogRecord] | None = None
    path: str | None = None
    position: int | None = None
    log_end_offset: int | None = None  # if not the last kept offset + 1


Damage = Callable[[Built], Outcome]


def build(data_dir: str) -> Built:
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
    for part in log.partitions:
        part.open()
    records = write_records(log.partition(0), RECORDS)
    other = write_records(log.partition(1), 5)
    segments = log.partition(0).segments
    log.close()
    assert [s.base_offset for s in segments] == [0, 16, 32, 48]
    return Built(data_dir, records, segments, other)


def overwrite(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def truncate(path: str, size: int) -> None:
    os.truncate(path, size)


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def flip_bit(path: str, position: int, bit: int = 3) -> None:
    overwrite(path, position, bytes([file_bytes(path)[position] ^ (1 << bit)]))


def frame_at(path: str, position: int) -> tuple[int, int, LogRecord]:
    """The frame that holds byte `position` of an undamaged file."""
    return next(f for f in frames_in(path) if f[0] <= position < f[1])


def kept_before(built: Built, path: str, position: int) -> list[LogRecord]:
    """The records of partition 0 that lie before `position` of `path`."""
    base = next(s.base_offset for s in built.segments if s.path == path)
    return [r for r in built.records if r.offset < base + position // FRAME_SIZE]


# -- the rows ---------------------------------------------------------------------------


def truncate_last_record_at(cut: int) -> Damage:
    def damage(built: Built) -> Outcome:
        start, _, _ = frames_in(built.newest)[-1]
        truncate(built.newest, start + cut)
        if cut == 0:  # the file now ends on a frame boundary: nothing is torn
            return Outcome("clean", built.records[:-1])
        return Outcome("torn", built.records[:-1], position=start)

    return damage


def zero_tail_sector_of_newest(built: Built) -> Outcome:
    size = os.path.getsize(built.newest)
    sector = (size - 1) // SECTOR * SECTOR
    start, _, _ = frame_at(built.newest, sector)
    overwrite(built.newest, sector, b"\0" * (size - sector))
    return Outcome("torn", kept_before(built, built.newest, start), position=start)


def zero_first_sector_of_newest(built: Built) -> Outcome:
    overwrite(built.newest, 0, b"\0" * SECTOR)  # whole frames follow the sector
    return Outcome("corrupt", path=built.newest, position=0)


def zero_a_sector_of_an_older_segment(built: Built) -> Outcome:
    path = built.segment(1)
    start, _, _ = frame_at(path, SECTOR)
    overwrite(path, SECTOR, b"\0" * SECTOR)
    return Outcome("corrupt", path=path, position=start)


def flip_a_bit_mid_newest(built: Built) -> Outcome:
    middle = os.path.getsize(built.newest) // 2
    start, _, _ = frame_at(built.newest, middle)
    flip_bit(built.newest, middle)
    return Outcome("corrupt", path=built.newest, position=start)


def flip_a_bit_mid_older(built: Built) -> Outcome:
    path = built.segment(0)
    middle = os.path.getsize(path) // 2
    start, _, _ = frame_at(path, middle)
    flip_bit(path, middle)
    return Outcome("corrupt", path=path, position=start)


def flip_a_bit_in_the_last_frame_of_newest(built: Built) -> Outcome:
    """Indistinguishable from a torn last write: treated as one (docs/design.md#recovery:
    nothing valid follows a bad last frame of the newest segment); the frame is kept in
    .broken."""
    start, end, _ = frames_in(built.newest)[-1]
    flip_bit(built.newest, (start + end) // 2)
    return Outcome("torn", built.records[:-1], position=start)


def flip_the_top_bit_of_a_length_field_mid_newest(built: Built) -> Outcome:
    start, _, _ = frames_in(built.newest)[3]
    flip_bit(built.newest, start, bit=7)
    return Outcome("corrupt", path=built.newest, position=start)


def garbage_appended_to_newest(built: Built) -> Outcome:
    size = os.path.getsize(built.newest)
    append(built.newest, random.Random(1).randbytes(300))
    return Outcome("torn", built.records, position=size)


def zeros_appended_to_newest(built: Built) -> Outcome:
    """A crash after the file grew but before its data reached the disk."""
    size = os.path.getsize(built.newest)
    append(built.newest, b"\0" * 4096)
    return Outcome("torn", built.records, position=size)


def garbage_appended_to_an_older_segment(built: Built) -> Outcome:
    path = built.segment(0)
    size = os.path.getsize(path)
    append(path, random.Random(2).randbytes(300))
    return Outcome("corrupt", path=path, position=size)


def truncate_the_last_record_of_an_older_segment(built: Built) -> Outcome:
    path = built.segment(2)
    start, end, _ = frames_in(path)[-1]
    truncate(path, (start + end) // 2)
    return Outcome("corrupt", path=path, position=start)


def a_valid_frame_out_of_order_appended_to_newest(built: Built) -> Outcome:
    """A frame with a correct checksum is never a torn write: an offset that goes back
    is damage, even at the very end."""
    size = os.path.getsize(built.newest)
    append(built.newest, encode_frame(3, 0, 0, b"key", b"value"))
    return Outcome("corrupt", path=built.newest, position=size)


def a_frame_beyond_its_segment_range(built: Built) -> Outcome:
    """Offsets of a segment stay below the next segment's base."""
    path = built.segment(0)
    size = os.path.getsize(path)
    append(path, encode_frame(16, 0, 0, b"key", b"value"))
    return Outcome("corrupt", path=path, position=size)


# Frames as the next append would write them (offset RECORDS: in order), each with one
# field made impossible and its checksum computed again.
IMPOSSIBLE = impossible_frames(RECORDS)


def impossible_frame_appended_to_newest(kind: str) -> Damage:
    def damage(built: Built) -> Outcome:
        size = os.path.getsize(built.newest)
        append(built.newest, IMPOSSIBLE[kind])
        return Outcome("corrupt", path=built.newest, position=size)

    return damage


def last_frame_of_newest_rewritten_with_an_impossible_key_length(built: Built) -> Outcome:
    """The last frame itself, in place: not torn, since its checksum holds."""
    start, end, _ = frames_in(built.newest)[-1]
    frame = file_bytes(built.newest)[start:end]
    overwrite(built.newest, start, resealed(frame, KEY_LENGTH_AT, struct.pack(">I", 7)))
    return Outcome("corrupt", path=built.newest, position=start)


def impossible_frame_cut_short_by_the_end_of_newest(built: Built) -> Outcome:
    """An impossible frame the end of the file cuts short: its checksum cannot be checked,
    so it is a torn write like any frame cut short."""
    size = os.path.getsize(built.newest)
    append(built.newest, IMPOSSIBLE["key-length-short"][:-3])
    return Outcome("torn", built.records, position=size)


def impossible_last_frame_of_an_older_segment(built: Built) -> Outcome:
    path = built.segment(1)
    start, end, record = frames_in(path)[-1]
    frame = file_bytes(path)[start:end]
    value_length_at = KEY_AT + len(record.key)
    overwrite(path, start, resealed(frame, value_length_at, struct.pack(">i", -7)))
    return Outcome("corrupt", path=path, position=start)


def an_empty_newest_segment_after_a_roll(built: Built) -> Outcome:
    """A crash right after a roll created the next segment: the next offset is its base."""
    with open(segment_path(os.path.dirname(built.newest), 100), "wb"):
        pass
    return Outcome("clean", built.records, log_end_offset=100)


def stray_files_beside_the_segments(built: Built) -> Outcome:
    directory = os.path.dirname(built.newest)
    for name in ("notes.txt", "123.log", f"{os.path.basename(built.newest)}.5.broken"):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(b"not a segment")
    return Outcome("clean", built.records)


def nothing_damaged(built: Built) -> Outcome:
    return Outcome("clean", built.records)


ROWS = [
    *(
        pytest.param(truncate_last_record_at(cut), id=f"truncate-last-record-at-byte-{cut}")
        for cut in range(FRAME_SIZE)
    ),
    pytest.param(zero_tail_sector_of_newest, id="zero-tail-sector-of-newest"),
    pytest.param(zero_first_sector_of_newest, id="zero-first-sector-of-newest"),
    pytest.param(zero_a_sector_of_an_older_segment, id="zero-sector-of-older"),
    pytest.param(flip_a_bit_mid_newest, id="flip-bit-mid-newest"),
    pytest.param(flip_a_bit_mid_older, id="flip-bit-mid-older"),
    pytest.param(flip_a_bit_in_the_last_frame_of_newest, id="flip-bit-in-last-frame"),
    pytest.param(flip_the_top_bit_of_a_length_field_mid_newest, id="flip-length-bit"),
    pytest.param(garbage_appended_to_newest, id="garbage-appended-to-newest"),
    pytest.param(zeros_appended_to_newest, id="zeros-appended-to-newest"),
    pytest.param(garbage_appended_to_an_older_segment, id="garbage-appended-to-older"),
    pytest.param(truncate_the_last_record_of_an_older_segment, id="truncate-older"),
    pytest.param(a_valid_frame_out_of_order_appended_to_newest, id="offset-goes-back"),
    pytest.param(a_frame_beyond_its_segment_range, id="offset-beyond-segment"),
    *(
        pytest.param(impossible_frame_appended_to_newest(kind), id=f"valid-crc-{kind}-at-tail")
        for kind in IMPOSSIBLE
    ),
    pytest.param(
        last_frame_of_newest_rewritten_with_an_impossible_key_length,
        id="valid-crc-last-frame-rewritten",
    ),
    pytest.param(impossible_frame_cut_short_by_the_end_of_newest, id="valid-crc-frame-cut-short"),
    pytest.param(impossible_last_frame_of_an_older_segment, id="valid-crc-in-older-segment"),
    pytest.param(an_empty_newest_segment_after_a_roll, id="empty-newest-segment"),
    pytest.param(stray_files_beside_the_segments, id="stray-files"),
    pytest.param(nothing_damaged, id="nothing-damaged"),
]


def open_reading(part: PartitionLog, in_runs: bool, handed: list[LogRecord]) -> RecoveryReport:
    """Open a partition, collecting the records it hands a loader: one by one, or in
    runs of tuples (the daemon's load, which reads each segment fast and hands the
    frame-by-frame reader the verdict on damage)."""
    if not in_runs:
        return part.open(handed.append)
    return part.open(on_records=lambda run: handed.extend(LogRecord(*r) for r in run))


@pytest.mark.parametrize("in_runs", [False, True], ids=["one-by-one", "in-runs"])
@pytest.mark.parametrize("damage", ROWS)
def test_recovery_outcome_and_appends_afterwards(
    data_dir: str, damage: Damage, in_runs: bool, caplog: pytest.LogCaptureFixture
) -> None:
    built = build(data_dir)
    expected = damage(built)
    damaged = {s.path: file_bytes(s.path) for s in built.segments}
    caplog.set_level(logging.WARNING, logger="sharecoord.log")
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)

    handed: list[LogRecord] = []
    if expected.kind == "corrupt":
        with pytest.raises(LogCorruptionError) as refused:
            open_reading(log.partition(0), in_runs, handed)
        error = refused.value
        assert (error.path, error.position) == (expected.path, expected.position)
        assert f"{expected.path}: damaged log at byte {expected.position}" in str(error)
        assert f"sharecoord log verify --data-dir {data_dir}" in str(error)
        assert {s.path: file_bytes(s.path) for s in built.segments} == damaged
        report = verify(data_dir)
        first_damage = report.partitions[0].damage[0]
        assert (first_damage.path, first_damage.position) == (expected.path, expected.position)
        log.partition(1).open()  # the other partitions load
        check_appends_work_afterwards(log, 1, built.other)
        return

    report = open_reading(log.partition(0), in_runs, handed)
    assert expected.records is not None
    assert handed == expected.records  # each record kept, once, in order
    if expected.kind == "torn":
        torn = report.torn_tail
        assert torn is not None
        assert (torn.path, torn.position) == (built.newest, expected.position)
        assert os.path.getsize(built.newest) == expected.position
        assert torn.broken_path is not None
        assert file_bytes(torn.broken_path) == damaged[built.newest][expected.position :]
        assert f"{built.newest}: torn tail cut at byte {expected.position}" in caplog.text
    else:
        assert report.torn_tail is None
    assert report.record_count == len(expected.records)
    assert report.log_end_offset == (expected.log_end_offset or expected.records[-1].offset + 1)
    assert verify(data_dir).ok
    check_appends_work_afterwards(log, 0, expected.records)
