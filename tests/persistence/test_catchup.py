"""Recovery with the journal (persistence/catchup.py): the journal and a partition's
files disagree in each way a crash, a failed write or the disk can leave them, and the
next open brings the files up to date, or refuses the partition naming the damage.
Run twice, recovery changes nothing the second time."""

from __future__ import annotations

import os
import shutil
import struct
import zlib

import pytest

from persistence import (
    LogCorruptionError,
    LogRecord,
    StateLog,
    partition_dir,
    read_partition,
    verify,
)
from persistence.fileops import FileOps
from persistence.frame import CRC_START, PREFIX
from persistence.journal import (
    Checkpoint,
    JournalCorruptionError,
    list_journal_segments,
    read_checkpoint,
)
from tests.persistence.log_helpers import (
    append_records,
    frame_starts,
    impossible_frames,
    newest_segment,
    tree_snapshot,
    write_through_journal,
)

NUM_PARTITIONS = 3


def recover(data_dir: str) -> dict[int, BaseException]:
    """Open the directory (journal recovery) and every partition; the refusals."""
    refusals: dict[int, BaseException] = {}
    log = StateLog.open(data_dir, NUM_PARTITIONS)
    try:
        for part in log.partitions:
            try:
                part.open()
            except LogCorruptionError as exc:
                refusals[part.partition] = exc
    finally:
        log.close()
    return refusals


def records_of(data_dir: str, partition: int) -> list[LogRecord]:
    return list(read_partition(partition_dir(data_dir, partition)))


@pytest.fixture
def written(data_dir: str) -> list[list[LogRecord]]:
    return write_through_journal(data_dir, NUM_PARTITIONS, rounds=4, per_round=3)


def test_a_partition_file_short_of_the_journal_is_filled_from_it(data_dir, written) -> None:
    path = newest_segment(data_dir, 1)
    starts = frame_starts(path)
    os.truncate(path, starts[5])  # the crash came before the last cycles reached the file
    assert recover(data_dir) == {}
    assert records_of(data_dir, 1) == written[1]
    assert verify(data_dir).ok


def test_a_partition_file_that_has_everything_is_left_as_it_is(data_dir, written) -> None:
    before = tree_snapshot(os.path.join(data_dir, "partitions"))
    assert recover(data_dir) == {}
    assert tree_snapshot(os.path.join(data_dir, "partitions")) == before
    for p in range(NUM_PARTITIONS):
        assert records_of(data_dir, p) == written[p]


def test_garbage_after_the_files_end_is_cut_and_kept(data_dir, written) -> None:
    path = newest_segment(data_dir, 0)
    with open(path, "ab") as f:
        f.write(b"\x13" * 57)
    assert recover(data_dir) == {}
    assert records_of(data_dir, 0) == written[0]
    broken = [n for n in os.listdir(partition_dir(data_dir, 0)) if n.endswith(".broken")]
    assert len(broken) == 1


def test_a_stretch_the_disk_never_got_is_cut_and_written_again_from_the_journal(
    data_dir, written
) -> None:
    """Zeros where a page never reached the disk, valid frames after it (the page cache
    writes back in any order): past the checkpoint that is no damage, only unsynced."""
    path = newest_segment(data_dir, 2)
    starts = frame_starts(path)
    with open(path, "r+b") as f:
        f.seek(starts[4])
        f.write(bytes(starts[5] - starts[4]))
    assert recover(data_dir) == {}
    assert records_of(data_dir, 2) == written[2]
    assert verify(data_dir).ok


def test_a_frame_that_differs_from_the_journals_copy_refuses_the_partition(
    data_dir, written
) -> None:
    path = newest_segment(data_dir, 1)
    starts = frame_starts(path)
    with open(path, "r+b") as f:  # a valid frame, but not the one the journal holds
        data = bytearray(f.read())
        at = starts[2]
        length = struct.unpack_from(">I", data, at)[0]
        data[at + length] ^= 0xFF  # the value's last byte
        PREFIX.pack_into(data, at, length, zlib.crc32(data[at + CRC_START : at + 4 + length]))
        f.seek(0)
        f.write(data)
    refusals = recover(data_dir)
    assert list(refusals) == [1]
    assert "differs from the journal's copy" in str(refusals[1])
    # The journal keeps what partition 1 still needs; the others go on.
    checkpoint = read_checkpoint_of(data_dir)
    assert checkpoint.partitions[1].lsn < checkpoint.partitions[0].lsn
    assert list_journal_segments_of(data_dir)[0][0] <= checkpoint.partitions[1].lsn
    assert records_of(data_dir, 0) == written[0]


def test_a_gap_between_the_file_and_the_journal_refuses_the_partition(data_dir, written) -> None:
    """The file lost fsynced records (it ends short of what the checkpoint says), and
    the journal no longer has them: nothing may be appended across the gap."""
    log = StateLog.open(data_dir, NUM_PARTITIONS)  # recovery, and a checkpoint at the end
    for part in log.partitions:
        part.open()
    more = append_records(log.partition(0), 3, first=100)
    log.partition(0).commit()
    log.close()
    write_through_journal(data_dir, NUM_PARTITIONS, rounds=1, per_round=2)
    path = newest_segment(data_dir, 0)
    os.truncate(path, frame_starts(path)[5])
    refusals = recover(data_dir)
    assert list(refusals) == [0]
    assert "the journal goes on at record" in str(refusals[0])
    del more


def test_a_frame_whose_checksum_holds_in_a_segment_judged_strictly_is_named(
    data_dir, written
) -> None:
    """A segment that lost fsynced bytes is judged as recovery judges any: a frame whose
    checksum holds but whose fields are impossible is damage at its byte, not a torn
    end to cut (and then a gap)."""
    log = StateLog.open(data_dir, NUM_PARTITIONS)  # recovery, and a checkpoint at the end
    for part in log.partitions:
        part.open()
    log.close()
    write_through_journal(data_dir, NUM_PARTITIONS, rounds=1, per_round=2)
    path = newest_segment(data_dir, 0)
    cut = frame_starts(path)[5]
    os.truncate(path, cut)
    with open(path, "ab") as f:
        f.write(impossible_frames(5)["key-length-past-the-frame"])
    refusals = recover(data_dir)
    assert list(refusals) == [0]
    assert f"{path}: damaged log at byte {cut}: key length 1000 overruns" in str(refusals[0])


def test_a_second_recovery_changes_nothing(data_dir, written) -> None:
    path = newest_segment(data_dir, 1)
    os.truncate(path, frame_starts(path)[7])
    with open(newest_segment(data_dir, 2), "ab") as f:
        f.write(b"\x99" * 20)
    assert recover(data_dir) == {}
    once = tree_snapshot(os.path.join(data_dir, "partitions"))
    assert recover(data_dir) == {}
    assert tree_snapshot(os.path.join(data_dir, "partitions")) == once
    for p in range(NUM_PARTITIONS):
        assert records_of(data_dir, p) == written[p]


def test_read_only_readers_overlay_what_is_only_in_the_journal(data_dir, written) -> None:
    path = newest_segment(data_dir, 1)
    os.truncate(path, frame_starts(path)[3])
    assert records_of(data_dir, 1) == written[1]  # read_partition, no recovery
    copy = data_dir + ".copy"
    shutil.copytree(data_dir, copy)
    try:
        report = verify(copy)
        assert report.ok
    finally:
        shutil.rmtree(copy)


def read_checkpoint_of(data_dir: str) -> Checkpoint:
    return read_checkpoint(FileOps(), os.path.join(data_dir, "journal"))


def list_journal_segments_of(data_dir: str) -> list[tuple[int, str]]:
    return list_journal_segments(FileOps(), os.path.join(data_dir, "journal"))


def test_verify_counts_what_is_only_in_the_journal_and_changes_nothing(data_dir, written) -> None:
    path = newest_segment(data_dir, 1)
    os.truncate(path, frame_starts(path)[5])
    before = tree_snapshot(data_dir)
    report = verify(data_dir)
    assert tree_snapshot(data_dir) == before
    assert report.ok
    result = report.partitions[1]
    assert result.record_count == len(written[1])
    assert result.last_offset == written[1][-1].offset
    assert any("only in the journal" in note for note in result.notes)


def test_verify_calls_garbage_in_the_unsynced_stretch_a_tail(data_dir, written) -> None:
    """Nothing of this run was checkpointed, so the whole newest segment is unsynced:
    garbage followed by valid frames there is what a crash leaves, not damage."""
    path = newest_segment(data_dir, 2)
    starts = frame_starts(path)
    with open(path, "r+b") as f:
        f.seek(starts[4])
        f.write(bytes(starts[5] - starts[4]))
    report = verify(data_dir)
    assert report.ok
    assert report.partitions[2].tail is not None
    assert report.partitions[2].tail.position == starts[4]


def test_verify_names_damage_in_the_middle_of_the_journal(data_dir, written) -> None:
    (_, segment), *_ = list_journal_segments_of(data_dir)
    with open(segment, "r+b") as f:
        f.seek(40)  # inside the first record, which valid records follow
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify(data_dir)
    assert not report.ok
    assert any(problem.startswith(os.path.join(data_dir, "journal")) for problem in report.problems)


def test_files_put_in_place_of_a_partition_are_judged_by_their_own_position(
    data_dir, written, tmp_path
) -> None:
    """A partition directory restored or imported from elsewhere does not match the
    checkpoint: recovery takes the position from the files, so a crash after the next
    writes neither cuts the imported records nor refuses the partition."""
    assert recover(data_dir) == {}
    elsewhere = str(tmp_path / "elsewhere")
    log = StateLog.open(elsewhere, NUM_PARTITIONS)
    log.partition(1).open()
    # Another history: its frames do not line up with this directory's.
    offset = log.partition(1).append(0, b"another-key", b"a longer value" * 7, 1)
    log.partition(1).commit()
    imported = [LogRecord(offset, 1, 0, b"another-key", b"a longer value" * 7)]
    log.close()
    imported += write_through_journal(elsewhere, NUM_PARTITIONS, rounds=8, per_round=3)[1]
    assert recover(elsewhere) == {}
    shutil.rmtree(partition_dir(data_dir, 1))
    shutil.copytree(partition_dir(elsewhere, 1), partition_dir(data_dir, 1))
    after = write_through_journal(data_dir, NUM_PARTITIONS, rounds=1, per_round=3)[1]
    assert recover(data_dir) == {}
    assert records_of(data_dir, 1) == imported + after
    assert not [n for n in os.listdir(partition_dir(data_dir, 1)) if n.endswith(".broken")]


def test_the_documented_repair_of_a_damaged_journal_loses_nothing_the_files_hold(
    data_dir, written
) -> None:
    """docs/operations.md, "Repairing a damaged partition": cut the journal segment at
    the byte named and move the later segments away. What the files already hold stays."""
    (_, segment), *later = list_journal_segments_of(data_dir)
    with open(segment, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(JournalCorruptionError) as refused:
        StateLog.open(data_dir, NUM_PARTITIONS)
    assert f"{segment}: damaged journal at byte 0" in str(refused.value)
    os.truncate(segment, refused.value.position)
    for _, path in later:
        os.rename(path, str(path) + ".aside")
    assert verify(data_dir).ok
    assert recover(data_dir) == {}
    for p in range(NUM_PARTITIONS):
        assert records_of(data_dir, p) == written[p]


def test_the_documented_repair_of_a_lost_checkpoint_after_a_clean_stop(data_dir, written) -> None:
    """docs/operations.md: after a clean stop, move the journal aside and write meta as
    format 1; the next open converts the directory again and nothing is lost."""
    assert recover(data_dir) == {}  # a clean open and close: the last checkpoint
    os.remove(os.path.join(data_dir, "journal", "CHECKPOINT"))
    report = verify(data_dir)
    assert any("CHECKPOINT is missing" in problem for problem in report.problems)
    os.rename(os.path.join(data_dir, "journal"), data_dir + ".journal-aside")
    with open(os.path.join(data_dir, "meta"), "w") as f:
        f.write(f'{{"format": 1, "num_partitions": {NUM_PARTITIONS}}}\n')
    assert verify(data_dir).ok
    assert recover(data_dir) == {}
    assert read_checkpoint_of(data_dir).partitions.keys() == set(range(NUM_PARTITIONS))
    for p in range(NUM_PARTITIONS):
        assert records_of(data_dir, p) == written[p]
