"""The compaction swap on a running log and offline: staging, commit, stale output, and
a swap that fails after its commit point. (Crashes at each step: the half-done swap
table.)"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os

import pytest

from persistence import (
    FaultInjectingFileOps,
    FileOps,
    GroupCommitter,
    LogRecord,
    PartitionFailedError,
    PartitionLog,
    StateLog,
    SwapIncompleteError,
    commit_staged,
    encode_frame,
    pending_staged,
    write_staged,
)
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    append_records,
    file_bytes,
    open_log,
    read_back,
    write_records,
)

SEGMENT_BYTES = 16 * FRAME_SIZE
RECORDS = 3 * 16 + 10  # segments 0, 16, 32 sealed; 48 active


@pytest.fixture
def log(data_dir: str) -> StateLog:
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
    log.partition(0).open()
    write_records(log.partition(0), RECORDS)
    return log


def latest_per_key(records: list[LogRecord]) -> list[LogRecord]:
    return sorted({r.key: r for r in records}.values(), key=lambda r: r.offset)


def stage(part: PartitionLog, count: int, records: list[LogRecord]) -> list[LogRecord]:
    """Stage the fold of the first `count` segments; return the folded records."""
    replaced = part.segments[:count]
    end = part.segments[count].base_offset
    folded = latest_per_key([r for r in records if r.offset < end])
    write_staged(part.partition_dir, replaced[0].base_offset, folded, [s.path for s in replaced])
    return folded


def staging_files(part: PartitionLog) -> list[str]:
    return sorted(os.listdir(os.path.join(part.partition_dir, "compaction")))


def test_a_commit_on_a_running_log_swaps_the_segments_and_its_memory(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    folded = stage(part, 3, records)
    assert pending_staged(part.partition_dir) == [0]
    reading = part.read()
    assert next(reading) == records[0]  # a reader that started before the swap ...

    assert commit_staged(part, 0) == "committed"
    assert [s.base_offset for s in part.segments] == [0, 48]
    assert part.segments[0].size_bytes == len(folded) * FRAME_SIZE
    assert list(reading) == records[1:]  # ... reads the log it started on
    assert list(part.read()) == folded + records[48:]
    assert staging_files(part) == []
    more = write_records(part, 2, first=100)
    log.close()
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES) == folded + records[48:] + more


def test_an_offline_commit_swaps_the_segments_even_beside_a_torn_tail(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    newest = part.segments[-1].path
    log.close()
    with open(newest, "ab") as f:
        f.write(b"\x00\x00\x01")  # a crash tore the active segment; the swap never touches it
    folded = stage_offline(part.partition_dir, records)
    assert commit_staged(part.partition_dir, 0) == "committed"
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES) == folded + records[32:]


def stage_offline(partition_dir: str, records: list[LogRecord]) -> list[LogRecord]:
    folded = latest_per_key(records[:32])
    paths = [os.path.join(partition_dir, f"{b:020d}.log") for b in (0, 16)]
    write_staged(partition_dir, 0, folded, paths)
    return folded


def test_an_empty_cleaned_segment_is_allowed(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    write_staged(part.partition_dir, 0, [], [s.path for s in part.segments[:2]])
    assert commit_staged(part, 0) == "committed"
    assert [(s.base_offset, s.size_bytes) for s in part.segments[:2]] == [(0, 0), (32, 16 * 79)]
    assert list(part.read()) == records[32:]
    log.close()
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES) == records[32:]


async def test_a_commit_runs_beside_the_group_commit(data_dir: str) -> None:
    def setup() -> StateLog:
        log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
        log.partition(0).open()
        write_records(log.partition(0), RECORDS)
        return log

    log = await asyncio.to_thread(setup)
    part = log.partition(0)
    records = await asyncio.to_thread(lambda: list(part.read()))
    folded = await asyncio.to_thread(stage, part, 3, records)
    committer = GroupCommitter(log)
    committer.start()
    appended = append_records(part, 20, first=RECORDS)
    waits = [committer.wait_durable(0, r.offset) for r in appended]
    assert await asyncio.to_thread(commit_staged, part, 0) == "committed"
    await asyncio.gather(*waits)
    await committer.close()
    everything = await asyncio.to_thread(lambda: list(part.read()))
    assert everything == folded + records[48:] + appended
    await asyncio.to_thread(log.close)


# -- stale output ------------------------------------------------------------------------


def a_replaced_segment_was_pruned(part: PartitionLog, records: list[LogRecord]) -> None:
    stage(part, 2, records)
    part.prune(16)


def an_earlier_compaction_changed_a_replaced_segment(
    part: PartitionLog, records: list[LogRecord]
) -> None:
    stage(part, 3, records)
    partition_dir = part.partition_dir
    os.replace(
        os.path.join(partition_dir, "compaction", "00000000000000000000.cleaned"),
        os.path.join(partition_dir, "later.cleaned"),
    )
    os.replace(
        os.path.join(partition_dir, "compaction", "00000000000000000000.manifest"),
        os.path.join(partition_dir, "later.manifest"),
    )
    stage(part, 1, records)  # segment 0 alone: same names, another segment 0
    assert commit_staged(part, 0) == "committed"
    for suffix in ("cleaned", "manifest"):
        os.replace(
            os.path.join(partition_dir, f"later.{suffix}"),
            os.path.join(partition_dir, "compaction", f"00000000000000000000.{suffix}"),
        )


def the_active_segment_is_listed(part: PartitionLog, records: list[LogRecord]) -> None:
    write_staged(part.partition_dir, 0, records[:1], [s.path for s in part.segments])


def the_listed_segments_are_not_consecutive(part: PartitionLog, records: list[LogRecord]) -> None:
    segments = part.segments
    write_staged(part.partition_dir, 0, records[:1], [segments[0].path, segments[2].path])


def the_cleaned_file_reaches_past_the_replaced_range(
    part: PartitionLog, records: list[LogRecord]
) -> None:
    write_staged(part.partition_dir, 0, [records[40]], [s.path for s in part.segments[:2]])


def the_cleaned_file_was_damaged(part: PartitionLog, records: list[LogRecord]) -> None:
    stage(part, 2, records)
    cleaned = os.path.join(part.partition_dir, "compaction", "00000000000000000000.cleaned")
    with open(cleaned, "r+b") as f:
        f.seek(40)
        f.write(b"\xff")


STALE = [
    pytest.param(a_replaced_segment_was_pruned, "00000000000000000000.log is gone", id="pruned"),
    pytest.param(
        an_earlier_compaction_changed_a_replaced_segment,
        "segment 00000000000000000000.log changed",
        id="changed",
    ),
    pytest.param(the_active_segment_is_listed, "replace the active segment", id="active"),
    pytest.param(the_listed_segments_are_not_consecutive, "consecutive", id="not-consecutive"),
    pytest.param(
        the_cleaned_file_reaches_past_the_replaced_range,
        "reaches the next segment's base 32",
        id="past-range",
    ),
    pytest.param(the_cleaned_file_was_damaged, "checksum", id="damaged-cleaned"),
]


@pytest.mark.parametrize(("make_stale", "reason"), STALE)
def test_stale_output_is_deleted_and_nothing_else_changes(
    log: StateLog, make_stale: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    part = log.partition(0)
    records = list(part.read())
    make_stale(part, records)  # type: ignore[operator]
    segments_before = part.segments
    on_disk_before = {s.path: file_bytes(s.path) for s in segments_before}
    log_before = list(part.read())
    caplog.set_level(logging.WARNING, logger="sharecoord.log")

    assert commit_staged(part, 0) == "stale"
    assert staging_files(part) == []
    assert part.segments == segments_before
    assert {s.path: file_bytes(s.path) for s in segments_before} == on_disk_before
    assert list(part.read()) == log_before
    assert "stale" in caplog.text
    assert reason in caplog.text
    log.close()
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES) == log_before


def test_stale_output_is_detected_offline_from_the_files(log: StateLog) -> None:
    """Offline the fingerprint comes from the file: same size, another last frame."""
    part = log.partition(0)
    records = list(part.read())
    stage(part, 2, records)
    log.close()
    segment = os.path.join(part.partition_dir, "00000000000000000016.log")
    last = encode_frame(31, 0, 0, b"key-1", b"y" * 40)
    assert len(last) == FRAME_SIZE
    with open(segment, "r+b") as f:
        f.seek(15 * FRAME_SIZE)
        f.write(last)
    assert commit_staged(part.partition_dir, 0) == "stale"
    assert pending_staged(part.partition_dir) == []


def test_an_offline_commit_reads_only_the_last_frame_of_each_replaced_segment(
    log: StateLog,
) -> None:
    """The manifest says where each replaced segment's last frame starts: the commit
    checks that frame, not every byte of a segment the job has just read through."""
    part = log.partition(0)
    records = list(part.read())
    log.close()
    stage_offline(part.partition_dir, records)

    class CountingFileOps(FileOps):
        def __init__(self) -> None:
            self.read_from: dict[str, int] = {}
            self._paths: dict[int, str] = {}

        def open(self, path: str, flags: int, mode: int = 0o644) -> int:
            fd = super().open(path, flags, mode)
            self._paths[fd] = os.path.basename(path)
            return fd

        def pread(self, fd: int, size: int, offset: int) -> bytes:
            data = super().pread(fd, size, offset)
            name = self._paths[fd]
            self.read_from[name] = self.read_from.get(name, 0) + len(data)
            return data

        def read(self, fd: int, size: int) -> bytes:
            data = super().read(fd, size)
            name = self._paths[fd]
            self.read_from[name] = self.read_from.get(name, 0) + len(data)
            return data

    fs = CountingFileOps()
    assert commit_staged(part.partition_dir, 0, fs=fs) == "committed"
    for replaced in ("00000000000000000000.log", "00000000000000000016.log"):
        assert fs.read_from.get(replaced) == FRAME_SIZE
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES)[-26:] == records[32:]


def test_an_offline_commit_of_an_older_manifest_reads_the_segments_through(
    log: StateLog,
) -> None:
    """Manifests written before they carried the last frame's position still commit."""
    part = log.partition(0)
    records = list(part.read())
    log.close()
    folded = stage_offline(part.partition_dir, records)
    manifest = os.path.join(part.partition_dir, "compaction", f"{0:020d}.manifest")
    with open(manifest, encoding="utf-8") as f:
        document = json.load(f)
    for replaced in document["replaced"]:
        del replaced["last_frame_at"]
    with open(manifest, "w", encoding="utf-8") as f:
        json.dump(document, f)
    assert commit_staged(part.partition_dir, 0) == "committed"
    assert read_back(log.data_dir, 0, segment_bytes=SEGMENT_BYTES) == folded + records[32:]


# -- write_staged refuses bad input ----------------------------------------------------------


def test_staging_refuses_records_out_of_order_or_below_the_base(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    paths = [s.path for s in part.segments[1:3]]
    with pytest.raises(ValueError, match="out of order"):
        write_staged(part.partition_dir, 16, [records[20], records[18]], paths)
    with pytest.raises(ValueError, match="out of order"):
        write_staged(part.partition_dir, 16, [records[3]], paths)
    with pytest.raises(ValueError, match="first replaced segment"):
        write_staged(part.partition_dir, 0, [records[20]], paths)
    log.close()


def test_staging_twice_at_one_base_is_refused(log: StateLog) -> None:
    part = log.partition(0)
    records = list(part.read())
    stage(part, 2, records)
    with pytest.raises(FileExistsError):
        stage(part, 2, records)
    log.close()


# -- a swap that fails after its commit point ---------------------------------------------


def test_a_swap_failing_after_its_commit_point_stops_the_partition_until_reset(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES, fs=fs)
    part = log.partition(0)
    part.open()
    records = write_records(part, RECORDS)
    folded = stage(part, 3, records)
    fs.fail("unlink", errno.EIO, path_contains="00000000000000000016.log")
    with pytest.raises(SwapIncompleteError):
        commit_staged(part, 0)
    with pytest.raises(PartitionFailedError):
        part.append(0, b"k", b"v", 0)

    report = part.reset_to_durable()
    assert report.staging_actions == (
        "finished the half-done compaction swap 00000000000000000000.swap",
    )
    assert list(part.read()) == folded + records[48:]
    more = write_records(part, 2, first=200)
    log.close()
    assert read_back(data_dir, 0, segment_bytes=SEGMENT_BYTES) == folded + records[48:] + more
