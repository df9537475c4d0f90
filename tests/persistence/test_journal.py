"""The shared journal (persistence/journal.py): its record format, segments, scan, torn
tails and damage, and CHECKPOINT."""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable

import pytest

from persistence import FaultInjectingFileOps, LogError, fileops
from persistence.fileops import FileOps
from persistence.journal import (
    RECORD_HEAD,
    UNFINISHED_SUFFIX,
    Checkpoint,
    Journal,
    JournalCorruptionError,
    PartitionCheckpoint,
    list_journal_segments,
    read_checkpoint,
    scan_journal,
    segment_file,
    write_checkpoint,
)

FS = FileOps()
SEGMENT = 4096


@pytest.fixture
def directory(tmp_path) -> str:
    path = tmp_path / "journal"
    path.mkdir()
    return str(path)


def frames(n: int, size: int = 40) -> bytes:
    """Stand-ins for frames: the journal carries them as opaque bytes."""
    return bytes([n % 251]) * size


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write(journal: Journal, count: int, *, size: int = 40) -> list[int]:
    lsns = []
    for n in range(count):
        record = journal.append([(n % 3, n, 1, frames(n, size)), (7, 100 + n, 2, b"xy")])
        lsns.append(record.lsn)
    return lsns


def test_a_record_is_laid_out_as_the_module_docstring_says(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    journal.append([(5, 42, 1, b"abc")])
    raw = read_bytes(segment_file(directory, 0))
    length, crc, lsn, entries = RECORD_HEAD.unpack_from(raw, 0)
    assert (lsn, entries) == (0, 1)
    assert length == 16 + 20 + 3  # header after the length field, one entry, its frames
    assert crc == zlib.crc32(raw[8 : 4 + length])
    assert struct.unpack_from(">IqII", raw, 20) == (5, 42, 1, 3)
    assert raw[40:43] == b"abc"
    assert raw[43:SEGMENT] == bytes(SEGMENT - 43)  # zeros end the records


def test_records_read_back_in_order_with_their_lsn_equal_to_their_position(
    directory: str,
) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 10)
    scan = scan_journal(FS, directory, 0)
    assert [r.lsn for r in scan.records] == lsns
    assert scan.records[3].entries[0].frames == frames(3)
    assert [e.partition for e in scan.records[4].entries] == [1, 7]
    assert scan.end_lsn == journal.end_lsn
    assert scan.torn_at is None


def test_a_record_that_does_not_fit_goes_to_the_next_segment(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 60)  # about 100 bytes each: more than one segment
    bases = [base for base, _ in list_journal_segments(FS, directory)]
    assert bases[:2] == [0, SEGMENT]
    assert any(lsn == SEGMENT for lsn in lsns)  # the first record of the second segment
    assert [r.lsn for r in scan_journal(FS, directory, 0).records] == lsns


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    write(journal, 2)
    big = journal.append([(0, 2, 1, frames(2, 3 * SEGMENT))])
    small = journal.append([(0, 3, 1, b"z")])
    assert big.lsn == SEGMENT
    assert small.lsn >= big.end_lsn
    scan = scan_journal(FS, directory, 0)
    assert [r.lsn for r in scan.records][-2:] == [big.lsn, small.lsn]


def test_a_scan_from_an_lsn_skips_what_lies_below_it(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 60)
    assert [r.lsn for r in scan_journal(FS, directory, lsns[37]).records] == lsns[37:]


@pytest.mark.parametrize("cut", range(1, 102))
def test_a_torn_tail_at_every_byte_of_the_last_record_ends_the_journal(
    directory: str, cut: int
) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 3)
    last = scan_journal(FS, directory, 0).records[-1]
    assert last.end_lsn - last.lsn == 102  # so that `cut` runs over every byte of it
    path = segment_file(directory, 0)
    with open(path, "r+b") as segment:  # what a crash mid-write may leave: a prefix
        segment.seek(last.lsn + cut)
        segment.write(bytes(last.end_lsn - last.lsn - cut))
    scan = scan_journal(FS, directory, 0, keep_torn_tail=True)
    assert [r.lsn for r in scan.records] == lsns[:2]
    if not read_bytes(path)[last.lsn : last.lsn + cut].strip(b"\0"):
        # Only the length field's zero high bytes landed: nothing to tell from no write.
        assert (scan.torn_at, scan.broken_path) == (None, None)
        return
    assert scan.torn_at is not None
    assert scan.torn_at[:2] == (path, last.lsn)
    assert scan.broken_path is not None  # the torn bytes, kept
    assert read_bytes(scan.broken_path).rstrip(b"\0") != b""


def test_damage_followed_by_a_valid_record_refuses_naming_file_and_byte(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    write(journal, 5)
    second = scan_journal(FS, directory, 0).records[1]
    path = segment_file(directory, 0)
    with open(path, "r+b") as segment:
        segment.seek(second.lsn + 30)
        segment.write(b"\xff")  # a flipped byte in the middle of the second record
    with pytest.raises(JournalCorruptionError) as refused:
        scan_journal(FS, directory, 0)
    assert (refused.value.path, refused.value.position) == (path, second.lsn)
    assert f"{path}: damaged journal at byte {second.lsn}" in str(refused.value)


def test_damage_at_a_segments_end_with_records_in_the_next_refuses(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    write(journal, 60)
    first_segment = [r for r in scan_journal(FS, directory, 0).records if r.lsn < SEGMENT]
    last = first_segment[-1]
    with open(segment_file(directory, 0), "r+b") as segment:
        segment.seek(last.lsn + 20)
        segment.write(b"\x00\x01")
    with pytest.raises(JournalCorruptionError):
        scan_journal(FS, directory, 0)


def test_a_live_scan_stops_quietly_at_the_first_record_it_cannot_read(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 5)
    with open(segment_file(directory, 0), "r+b") as segment:
        segment.seek(lsns[2] + 30)
        segment.write(b"\xff")
    assert [r.lsn for r in scan_journal(FS, directory, 0, live=True).records] == lsns[:2]


def test_a_journal_started_after_a_recovery_never_reuses_an_lsn(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    write(journal, 3)
    journal.close()
    again = Journal.start(FS, directory, SEGMENT, at_least=100)
    assert again.end_lsn == SEGMENT  # after the segment there is
    beyond = Journal.start(FS, directory, SEGMENT, at_least=10 * SEGMENT)
    assert beyond.end_lsn == 10 * SEGMENT  # after what a checkpoint already counts


def test_segments_wholly_below_an_lsn_are_deleted_but_never_the_current(directory: str) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 100)
    before = [b for b, _ in list_journal_segments(FS, directory)]
    assert len(before) >= 3
    journal.delete_below(lsns[-1] + 1)
    after = [b for b, _ in list_journal_segments(FS, directory)]
    assert after and after[0] == before[-1] == journal.end_lsn // SEGMENT * SEGMENT
    assert [r.lsn for r in scan_journal(FS, directory, lsns[-1]).records] == [lsns[-1]]


def test_the_checkpoint_round_trips_and_a_missing_or_bad_one_is_an_error(directory: str) -> None:
    checkpoint = Checkpoint(
        {0: PartitionCheckpoint(10, 0, 300, 7), 3: PartitionCheckpoint(5, 9, 0, 9)}
    )
    write_checkpoint(FS, directory, checkpoint)
    assert read_checkpoint(FS, directory) == checkpoint
    assert checkpoint.lowest_lsn() == 5
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
    with open(os.path.join(directory, "CHECKPOINT"), "w") as bad:
        bad.write('{"format": 1, "partitions": {"0": {"lsn": "x"}}}')
    with pytest.raises(LogError, match="not a valid checkpoint"):
        read_checkpoint(FS, directory)
    os.unlink(os.path.join(directory, "CHECKPOINT"))
    with pytest.raises(LogError, match="is missing"):
        read_checkpoint(FS, directory)


class FailingDisk(FileOps):
    """fdatasync fails while `broken`; so does every write after the first failure
    (the record lands whole, its fsync fails, and the disk refuses its erasure)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        self.failed = False

    def fdatasync(self, fd: int) -> None:
        if self.broken:
            self.failed = True
            raise OSError(5, "Input/output error (test)")
        super().fdatasync(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.broken and self.failed:
            raise OSError(5, "Input/output error (test)")
        return super().pwrite(fd, data, offset)


def test_no_record_follows_a_failed_one_until_it_is_erased(directory: str) -> None:
    disk = FailingDisk()
    journal = Journal(disk, directory, 0, SEGMENT)
    good = write(journal, 2)
    disk.broken = True
    with pytest.raises(OSError, match="Input/output error"):
        journal.append([(0, 2, 1, frames(2))])  # lands whole; its fsync fails
    void = scan_journal(FS, directory, 0, live=True).records[-1].lsn
    assert void not in good and journal.is_void(void)  # a reader would see it: skip it
    with pytest.raises(OSError, match="Input/output error"):
        journal.append([(0, 2, 1, frames(3))])  # not written: the failed one is still there
    assert [r.lsn for r in scan_journal(FS, directory, 0).records] == [*good, void]
    disk.broken = False
    after = journal.append([(0, 2, 1, frames(4))]).lsn  # erases first, then a fresh segment
    assert not journal.is_void(void)
    assert after >= SEGMENT
    assert [r.lsn for r in scan_journal(FS, directory, 0).records] == [*good, after]


class SyncCountingFileOps(FaultInjectingFileOps):
    """Counts the files opened and each file's fsyncs."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []
        self.fsyncs: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        self.opened.append(path)
        return super().open(path, flags, mode)

    def fsync(self, fd: int) -> None:
        self.fsyncs.append(self.path_of(fd))
        super().fsync(fd)


def test_the_next_segment_is_made_paced_once_records_are_written(
    directory: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before any record the segments are made at once (the daemon's start waits for
    # them); then the next one is written a MiB at a time, each MiB but the last synced
    # and followed by its pause, under a name of its own that is renamed into place.
    fs = SyncCountingFileOps()
    pauses: list[float] = []
    monkeypatch.setattr(fileops, "_pause", pauses.append)
    fresh = Journal(fs, directory, 0, SEGMENT)
    fresh.ensure_spare()
    assert [b for b, _ in list_journal_segments(FS, directory)] == [0, SEGMENT]
    assert pauses == []
    assert fs.opened == [segment_file(directory, 0), segment_file(directory, SEGMENT)]

    size = 3 * 1024 * 1024 + 100
    busy = str(tmp_path / "busy")
    os.mkdir(busy)
    journal = Journal(fs, busy, 0, size)
    journal.append([(0, 0, 1, b"abc")])  # its roll made the first segment
    fs.fsyncs.clear()
    journal.ensure_spare()
    spare = segment_file(busy, size)
    assert fs.fsyncs == [spare + UNFINISHED_SUFFIX] * 4  # 3 MiB synced, then the whole
    assert len(pauses) == 3
    assert all(0 < pause <= fileops.PACE_MAX_S for pause in pauses)
    assert os.path.getsize(spare) == size and read_bytes(spare) == bytes(size)
    assert sorted(os.listdir(busy)) == [os.path.basename(p) for p in (segment_file(busy, 0), spare)]


def test_a_hurried_journal_makes_the_rest_of_its_paced_segment_at_full_speed(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon stops while the next segment is being made: its last checkpoint waits
    # for the thread that makes it, so the rest is written without pauses.
    size = 3 * 1024 * 1024 + 100
    fs = SyncCountingFileOps()
    journal = Journal(fs, directory, 0, size)
    journal.append([(0, 0, 1, b"abc")])
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        journal.hurry()  # as GroupCommitter.close does, during the first pause

    monkeypatch.setattr(fileops, "_pause", pause)
    fs.fsyncs.clear()
    journal.ensure_spare()
    spare = segment_file(directory, size)
    assert len(pauses) == 1
    assert fs.fsyncs == [spare + UNFINISHED_SUFFIX] * 2  # the first MiB, then the whole
    assert read_bytes(spare) == bytes(size)


def test_a_roll_never_waits_for_the_paced_segment_and_takes_the_one_it_made(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The checkpoint thread makes the next segment, paced; the writes reach its base
    # meanwhile: the roll makes it at once itself, and the paced one is thrown away
    # rather than renamed over a segment that holds records.
    size = 1024 * 1024 + SEGMENT  # two chunks: a pause between them
    journal = Journal(FS, directory, 0, size)
    write(journal, 1)  # records are written: the next segment is paced
    paused, go_on = threading.Event(), threading.Event()

    def pause(seconds: float) -> None:
        paused.set()
        assert go_on.wait(60)

    monkeypatch.setattr(fileops, "_pause", pause)
    failures: list[BaseException] = []
    lsns: list[int] = []

    def run(work: Callable[[], object]) -> threading.Thread:
        def guarded() -> None:
            try:
                work()
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=guarded)
        thread.start()
        return thread

    maker, writer = run(journal.ensure_spare), None
    try:
        assert paused.wait(60)
        # Past the first segment, into the one the roll makes, while the maker pauses.
        writer = run(lambda: lsns.extend(write(journal, 30, size=size // 20)))
        writer.join(60)
        assert not writer.is_alive(), "the roll waited for the paced segment"
    finally:
        go_on.set()
        maker.join()
        if writer is not None:
            writer.join()
    assert failures == []
    assert journal.end_lsn > size
    assert [r.lsn for r in scan_journal(FS, directory, 0).records][-30:] == lsns
    assert not [n for n in os.listdir(directory) if n.endswith(UNFINISHED_SUFFIX)]


def test_a_segment_a_crash_left_half_made_is_deleted_when_the_journal_starts(
    directory: str,
) -> None:
    journal = Journal(FS, directory, 0, SEGMENT)
    lsns = write(journal, 3)
    journal.close()
    unfinished = segment_file(directory, SEGMENT) + UNFINISHED_SUFFIX
    with open(unfinished, "wb") as half:
        half.write(bytes(SEGMENT // 2))
    again = Journal.start(FS, directory, SEGMENT)
    assert not os.path.exists(unfinished)
    assert again.end_lsn == SEGMENT  # the half-made one was never a segment
    assert [r.lsn for r in scan_journal(FS, directory, 0).records] == lsns
