"""GroupCommitter: what one cycle covers, when waiters resolve, and the failure path.

No test waits on time: fdatasync calls are gated (held until the test lets them go)
where a test needs a cycle to be in flight. The blockbuster fixture makes every test
here fail if the committer blocks the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import queue
import random
import shutil
import threading
import time
from typing import Any

import pytest
from blockbuster import BlockingError

from persistence import (
    DurabilityError,
    FaultInjectingFileOps,
    FileOps,
    GroupCommitter,
    LogCorruptionError,
    LogRecord,
    PartitionFailedError,
    StateLog,
    fileops,
    statelog,
    verify,
)
from persistence.journal import list_journal_segments, read_checkpoint, scan_journal
from tests.harness.wait import wait_until
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    append_records,
    open_log,
    read_back,
    record_fields,
    write_records,
)


class RecordingFileOps(FaultInjectingFileOps):
    """Remembers the path of every fdatasync."""

    def __init__(self) -> None:
        super().__init__()
        self.datasynced: list[str] = []

    def fdatasync(self, fd: int) -> None:
        self.datasynced.append(self.path_of(fd))
        super().fdatasync(fd)


class GatedFileOps(FaultInjectingFileOps):
    """Each fdatasync announces itself on `entered`, then waits for a permit (and then
    fails if a fault is armed for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered: queue.Queue[str] = queue.Queue()
        self.permits = threading.Semaphore(0)
        self.gated = True

    def fdatasync(self, fd: int) -> None:
        if self.gated:
            self.entered.put(self.path_of(fd))
            assert self.permits.acquire(timeout=30), "the test never let the fdatasync go"
        super().fdatasync(fd)

    def ungate(self) -> None:
        """Let every fdatasync from now on go at once (the checkpoint at close)."""
        self.gated = False
        self.permits.release(1000)

    async def next_fdatasync(self) -> str:
        return await asyncio.to_thread(self.entered.get, True, 30)


def open_all(
    data_dir: str, fs: FileOps | None, num_partitions: int, segment_bytes: int
) -> StateLog:
    log = open_log(data_dir, fs=fs, num_partitions=num_partitions, segment_bytes=segment_bytes)
    for part in log.partitions:
        part.open()
    return log


async def opened(
    data_dir: str,
    fs: FileOps | None = None,
    *,
    num_partitions: int = 3,
    segment_bytes: int = 1 << 20,
) -> StateLog:
    return await asyncio.to_thread(open_all, data_dir, fs, num_partitions, segment_bytes)


def partition_of(path: str) -> int:
    return int(path.split(os.sep)[-2])


async def append_and_wait(
    committer: GroupCommitter, log: StateLog, partition: int, count: int, first: int = 0
) -> list[LogRecord]:
    appended = append_records(log.partition(partition), count, first)
    await asyncio.gather(*(committer.wait_durable(partition, r.offset) for r in appended))
    return appended


async def test_the_event_loop_guard_is_armed(data_dir: str) -> None:
    with pytest.raises(BlockingError):
        os.stat(os.path.dirname(data_dir))


def in_journal(path: str) -> bool:
    return f"{os.sep}journal{os.sep}" in path


async def test_every_partition_dirty_in_a_cycle_shares_one_journal_record_and_fdatasync(
    data_dir: str,
) -> None:
    fs = RecordingFileOps()
    log = await opened(data_dir, fs, num_partitions=4)
    committer = GroupCommitter(log)
    committer.start()
    waits = []
    appended = {}
    for partition in (0, 1, 3):
        appended[partition] = append_records(log.partition(partition), 2)
        waits += [committer.wait_durable(partition, r.offset) for r in appended[partition]]
    before = len(fs.datasynced)
    await asyncio.gather(*waits)
    assert committer.cycles == 1
    synced = fs.datasynced[before:]
    # One flush made three partitions durable; their own files were not synced.
    assert len([path for path in synced if in_journal(path)]) == 1
    assert not [path for path in synced if path.endswith(".log")]
    scan = await asyncio.to_thread(scan_journal, FileOps(), os.path.join(data_dir, "journal"), 0)
    (record,) = scan.records
    assert [(e.partition, e.first_offset, e.frame_count) for e in record.entries] == [
        (0, 0, 2),
        (1, 0, 2),
        (3, 0, 2),
    ]
    await committer.close()
    await asyncio.to_thread(log.close)
    for partition, records in appended.items():
        assert await asyncio.to_thread(read_back, data_dir, partition, num_partitions=4) == records


async def test_each_cycle_reports_its_partitions_and_its_one_flush_time(data_dir: str) -> None:
    log = await opened(data_dir, RecordingFileOps(), num_partitions=4)
    cycles: list[tuple[int, list[float]]] = []
    committer = GroupCommitter(log, on_cycle=lambda n, times: cycles.append((n, times)))
    committer.start()
    waits = []
    for partition in (0, 2, 3):
        (record,) = append_records(log.partition(partition), 1)
        waits.append(committer.wait_durable(partition, record.offset))
    await asyncio.gather(*waits)
    assert len(cycles) == 1
    count, times = cycles[0]
    assert count == 3
    assert len(times) == 1
    assert times[0] >= 0
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_a_waiter_resolves_only_once_its_offset_is_fsynced(data_dir: str) -> None:
    fs = GatedFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    (first,) = append_records(log.partition(0), 1)
    first_durable = committer.wait_durable(0, first.offset)
    await fs.next_fdatasync()  # the first cycle is writing, held in fdatasync
    assert not first_durable.done()
    assert log.partition(0).durable_end_offset == 0

    (second,) = append_records(log.partition(0), 1, first=1)  # arrives mid-cycle
    second_durable = committer.wait_durable(0, second.offset)
    fs.permits.release()
    await first_durable
    assert log.partition(0).durable_end_offset == 1

    await fs.next_fdatasync()  # the second cycle, which alone covers the second append
    assert not second_durable.done()
    fs.permits.release()
    await second_durable
    assert log.partition(0).durable_end_offset == 2
    assert committer.cycles == 2
    fs.ungate()
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_a_failed_journal_fsync_fails_every_waiter_of_its_cycle(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    acknowledged = {p: await append_and_wait(committer, log, p, 2) for p in range(3)}

    fs.fail("fdatasync", errno.EIO, path_contains="journal/")
    appended = {p: append_records(log.partition(p), 2, first=2) for p in range(3)}
    waits = [committer.wait_durable(p, r.offset) for p in range(3) for r in appended[p]]
    outcomes = await asyncio.gather(*waits, return_exceptions=True)

    # They shared the flush: they share its failure.
    for failed in outcomes:
        assert isinstance(failed, DurabilityError)
        assert isinstance(failed.cause, OSError)
        assert failed.cause.errno == errno.EIO
    assert sorted(p for p, _ in failures) == [0, 1, 2]
    assert [log.partition(p).durable_end_offset for p in range(3)] == [2, 2, 2]
    with pytest.raises(PartitionFailedError):
        log.partition(1).append(*record_fields(9))
    await committer.wait_durable(1, 1)  # what was durable before still is

    for p in range(3):
        report = await asyncio.to_thread(log.partition(p).reset_to_durable)
        assert report.log_end_offset == 2
    again = await append_and_wait(committer, log, 1, 2, first=20)
    assert [r.offset for r in again] == [2, 3]
    await committer.close()
    await asyncio.to_thread(log.close)

    on_disk = await asyncio.to_thread(read_back, data_dir, 1, num_partitions=3)
    assert on_disk == acknowledged[1] + again
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == acknowledged[0]
    assert (await asyncio.to_thread(verify, data_dir)).ok


async def test_a_failed_partition_write_fails_that_partition_alone_and_loses_nothing(
    data_dir: str,
) -> None:
    """The journal record was durable: the cycle's waiters are answered, the partition
    whose file write failed stops, and its reset writes the frames in from the journal."""
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    acknowledged = {p: await append_and_wait(committer, log, p, 2) for p in range(3)}
    fs.fail("write", errno.ENOSPC, path_contains="partitions/1/", short_write=True)
    appended = {p: append_records(log.partition(p), 2, first=2) for p in range(3)}
    await asyncio.gather(
        *(committer.wait_durable(p, r.offset) for p in range(3) for r in appended[p])
    )
    assert [(p, e.errno) for p, e in failures if isinstance(e, OSError)] == [(1, errno.ENOSPC)]
    with pytest.raises(PartitionFailedError):
        log.partition(1).append(*record_fields(9))
    report = await asyncio.to_thread(log.partition(1).reset_to_durable)
    assert report.log_end_offset == 4
    await committer.close()
    await asyncio.to_thread(log.close)
    for p in range(3):
        on_disk = await asyncio.to_thread(read_back, data_dir, p, num_partitions=3)
        assert on_disk == acknowledged[p] + appended[p]
    assert (await asyncio.to_thread(verify, data_dir)).ok


async def test_one_barrier_settles_every_partition_and_names_the_failed_ones(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    await committer.prepared()  # the journal's segments exist by now
    await append_and_wait(committer, log, 2, 1)
    fs.fail("write", errno.EIO, path_contains="journal/")
    targets = {p: append_records(log.partition(p), 3)[-1].offset for p in range(2)}
    barrier = committer.wait_durable_many(targets)
    failed = await barrier.future
    assert sorted(failed) == [0, 1]
    assert isinstance(failed[0], DurabilityError)
    assert failed[0].cause.errno == errno.EIO
    assert not barrier.pending
    assert [log.partition(p).durable_end_offset for p in range(3)] == [0, 0, 1]
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_a_barrier_over_durable_offsets_is_done_at_once(data_dir: str) -> None:
    log = await opened(data_dir, RecordingFileOps())
    committer = GroupCommitter(log)
    committer.start()
    records = await append_and_wait(committer, log, 0, 2)
    barrier = committer.wait_durable_many({0: records[-1].offset})
    assert barrier.future.done()
    assert barrier.future.result() == {}
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_waiters_appended_after_the_failed_batch_fail_too(data_dir: str) -> None:
    fs = GatedFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    fs.fail("fdatasync", errno.EIO, path_contains="journal/")
    (first,) = append_records(log.partition(0), 1)
    first_durable = committer.wait_durable(0, first.offset)
    while not in_journal(await fs.next_fdatasync()):
        fs.permits.release()  # creating the journal's segments
    (later,) = append_records(log.partition(0), 1, first=1)  # after the failing batch
    later_durable = committer.wait_durable(0, later.offset)
    # The failing fdatasync, then the one that erases its record (journal.py), and on.
    fs.ungate()
    for waiter in (first_durable, later_durable):
        with pytest.raises(DurabilityError):
            await waiter
    with pytest.raises(DurabilityError):
        await committer.wait_durable(0, later.offset)  # a failed partition answers at once
    assert log.partition(0).durable_end_offset == 0
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_after_a_failed_journal_write_the_next_record_goes_to_a_fresh_segment(
    data_dir: str,
) -> None:
    """Never append after a failed write or fsync on a journal segment: what the failed
    record left there is zeroed, and a restart replays neither it nor a gap."""
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 0, 3)
    journal = os.path.join(data_dir, "journal")
    fs.fail("fdatasync", errno.EIO, path_contains="journal/")
    (lost,) = append_records(log.partition(0), 1, first=3)
    with pytest.raises(DurabilityError):
        await committer.wait_durable(0, lost.offset)
    await asyncio.to_thread(log.partition(0).reset_to_durable)
    more = await append_and_wait(committer, log, 0, 2, first=10)
    segments = await asyncio.to_thread(list_journal_segments, FileOps(), journal)
    scan = await asyncio.to_thread(scan_journal, FileOps(), journal, 0)
    kept_record, next_record = scan.records
    # The failed record is gone (zeroed); the next one opened the next segment.
    assert [e.first_offset for e in kept_record.entries] == [0]
    assert [e.first_offset for e in next_record.entries] == [3]
    assert kept_record.lsn < segments[1][0] == next_record.lsn
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept + more


async def test_a_roll_fsyncs_the_segment_it_seals(data_dir: str) -> None:
    fs = RecordingFileOps()
    log = await opened(data_dir, fs, segment_bytes=3 * FRAME_SIZE)
    committer = GroupCommitter(log)
    committer.start()
    appended = await append_and_wait(committer, log, 0, 5)  # 0-2 fill a segment, 3-4 roll
    directory = log.partition(0).partition_dir
    assert segment_file(directory, 0) in fs.datasynced
    assert segment_file(directory, 3) not in fs.datasynced
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == appended


def segment_file(directory: str, base: int) -> str:
    return os.path.join(directory, f"{base:020d}.log")


async def test_reset_to_durable_can_be_retried_when_it_fails(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 2, 2)
    fs.fail("fdatasync", errno.EIO, path_contains="journal/")
    (lost,) = append_records(log.partition(2), 1, first=2)
    with pytest.raises(DurabilityError):
        await committer.wait_durable(2, lost.offset)

    fs.fail("truncate", errno.EIO, path_contains="partitions/2/")
    with pytest.raises(OSError, match="injected"):
        await asyncio.to_thread(log.partition(2).reset_to_durable)
    with pytest.raises(PartitionFailedError):
        log.partition(2).append(*record_fields(0))
    await asyncio.to_thread(log.partition(2).reset_to_durable)
    more = await append_and_wait(committer, log, 2, 1, first=5)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 2, num_partitions=3) == kept + more


async def test_a_reset_refuses_a_file_shorter_than_its_synced_size_and_grows_nothing(
    data_dir: str,
) -> None:
    # A reset cuts a partition's file back to the size its last checkpoint synced; a
    # file that holds less lost records, and ftruncate would "cut" it up to that size
    # with zeros where they were (a bug did so once: 05f9c8f). Refused loudly instead.
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log, checkpoint_bytes=1)  # after every cycle
    committer.start()
    await append_and_wait(committer, log, 2, 3)
    await wait_until(lambda: log.partition(2).synced[1] > 0, "a checkpoint synced partition 2")
    fs.fail("fdatasync", errno.EIO, path_contains="journal/")
    (lost,) = append_records(log.partition(2), 1, first=3)
    with pytest.raises(DurabilityError):
        await committer.wait_durable(2, lost.offset)
    fs.clear()
    path = os.path.join(log.partition(2).partition_dir, f"{0:020d}.log")
    short = log.partition(2).synced[1] - 10
    await asyncio.to_thread(os.truncate, path, short)
    with pytest.raises(LogCorruptionError, match="ends before byte"):
        await asyncio.to_thread(log.partition(2).reset_to_durable)
    assert await asyncio.to_thread(os.path.getsize, path) == short
    await committer.close()
    await asyncio.to_thread(log.close)


def test_without_a_journal_a_reset_refuses_a_file_shorter_than_its_durable_size(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = open_log(data_dir, fs=fs)
    part = log.partition(0)
    part.open()
    write_records(part, 3)
    path = os.path.join(part.partition_dir, f"{0:020d}.log")
    durable = os.path.getsize(path)
    fs.fail("fdatasync", errno.EIO)
    with pytest.raises(OSError, match="injected"):
        write_records(part, 1, first=3)
    fs.clear()
    os.truncate(path, durable - 10)
    with pytest.raises(LogCorruptionError, match="ends before byte"):
        part.reset_to_durable()
    assert os.path.getsize(path) == durable - 10
    log.close()


async def test_close_commits_appends_nobody_waited_for(data_dir: str) -> None:
    log = await opened(data_dir)
    committer = GroupCommitter(log)
    committer.start()
    unwaited = append_records(log.partition(1), 4)
    await committer.close()
    assert log.partition(1).durable_end_offset == 4
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 1, num_partitions=3) == unwaited


async def test_waiting_for_an_offset_never_appended_is_an_error(data_dir: str) -> None:
    log = await opened(data_dir)
    committer = GroupCommitter(log)
    committer.start()
    with pytest.raises(ValueError, match="never appended"):
        committer.wait_durable(0, 0)
    await committer.close()
    with pytest.raises(RuntimeError, match="not running"):
        committer.wait_durable(0, 0)
    await asyncio.to_thread(log.close)


async def test_a_checkpoint_syncs_the_written_partitions_and_frees_the_journal(
    data_dir: str,
) -> None:
    fs = RecordingFileOps()
    log = await opened(data_dir, fs, num_partitions=3)
    committer = GroupCommitter(log, checkpoint_bytes=1)  # after every cycle
    committer.start()
    for round_number in range(5):
        await append_and_wait(committer, log, round_number % 2, 2, first=round_number * 2)
    await committer.close()
    assert committer.checkpoints >= 2
    checkpoint = await asyncio.to_thread(
        read_checkpoint, FileOps(), os.path.join(data_dir, "journal")
    )
    for p in (0, 1):
        synced = checkpoint.partitions[p]
        assert synced.next_offset == log.partition(p).log_end_offset
        assert synced.size == log.partition(p).size_bytes
        assert synced.lsn == log.journal.end_lsn if log.journal else False
    assert [path for path in fs.datasynced if path.endswith(".log")]
    await asyncio.to_thread(log.close)


class SlowSyncFileOps(FaultInjectingFileOps):
    """Each fdatasync of a partition file takes at least SYNC_S."""

    SYNC_S = 0.005

    def fdatasync(self, fd: int) -> None:
        if self.path_of(fd).endswith(".log"):
            time.sleep(self.SYNC_S)
        super().fdatasync(fd)


async def test_a_partition_that_fails_during_its_checkpoint_sync_is_not_counted_synced(
    data_dir: str,
) -> None:
    # The checkpoint thread syncs a partition's file; meanwhile a write to it fails and
    # its reset may cut the file back. The sync must not then count as covering the
    # file (seen in the suite: a reset cut a file to 0 bytes, the sync's late result
    # set its synced size back to 974, and the next reset "cut" the file up to that
    # size: 974 bytes of zeros where acknowledged records were).
    fs = GatedFileOps()
    fs.gated = False  # until the checkpoint's sync
    log = await opened(data_dir, fs, num_partitions=2)
    committer = GroupCommitter(log, checkpoint_bytes=1 << 30)  # no checkpoint but ours
    committer.start()
    await committer.prepared()
    await append_and_wait(committer, log, 0, 3)
    part = log.partition(0)
    synced_before, entry_before = part.synced, log.checkpoint.partitions.get(0)
    fs.gated = True
    checkpoint = asyncio.create_task(
        asyncio.to_thread(log.take_checkpoint, log.journal.end_lsn, {0})
    )
    assert (await fs.next_fdatasync()).endswith(".log")  # partition 0's, held
    part.fail(OSError(errno.EIO, "a write failed meanwhile"))
    fs.ungate()
    await checkpoint
    assert part.synced == synced_before
    assert log.checkpoint.partitions.get(0) == entry_before
    await committer.close()
    await asyncio.to_thread(log.close)


@pytest.mark.parametrize("spread", [0.0, 2.0])
async def test_a_paced_checkpoint_pauses_after_each_partition_sync_as_long_as_spread_says(
    data_dir: str, monkeypatch: pytest.MonkeyPatch, spread: float
) -> None:
    log = await opened(data_dir, SlowSyncFileOps(), num_partitions=3)
    committer = GroupCommitter(log, checkpoint_bytes=1 << 30)  # no checkpoint but ours
    committer.start()
    await committer.prepared()  # the journal's segments made: no pause but the checkpoint's
    for p in range(3):
        await append_and_wait(committer, log, p, 2)
    pauses: list[float] = []
    monkeypatch.setattr(fileops, "_pause", pauses.append)
    await asyncio.to_thread(log.take_checkpoint, log.journal.end_lsn, {0, 1, 2}, None, spread)
    monkeypatch.undo()
    if spread:
        # One pause per partition synced, `spread` times its sync (which took at least
        # SYNC_S), never above the cap.
        assert len(pauses) == 3
        for pause in pauses:
            assert spread * SlowSyncFileOps.SYNC_S <= pause <= fileops.PACE_MAX_S
    else:
        assert pauses == []
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_closing_hurries_the_journal_before_the_last_checkpoint(
    data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last checkpoint runs in the thread that may be making the next journal
    # segment, paced: close tells the journal to finish it at full speed, first.
    log = await opened(data_dir, num_partitions=2)
    journal = log.journal
    assert journal is not None
    events: list[str] = []
    hurry, take = journal.hurry, log.take_checkpoint

    def hurrying() -> None:
        events.append("hurry")
        hurry()

    def checkpoint(lsn: int, written: set[int], on_failure: Any = None, spread: float = 0.0) -> Any:
        events.append(f"checkpoint {spread}")
        return take(lsn, written, on_failure, spread)

    monkeypatch.setattr(journal, "hurry", hurrying)
    monkeypatch.setattr(log, "take_checkpoint", checkpoint)
    committer = GroupCommitter(log, checkpoint_bytes=1 << 30)  # none but the last
    committer.start()
    await append_and_wait(committer, log, 0, 2)
    await committer.close()
    assert events == ["hurry", "checkpoint 0.0"]
    await asyncio.to_thread(log.close)


async def test_the_periodic_checkpoints_are_paced_and_the_last_one_at_close_is_not(
    data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = await opened(data_dir, num_partitions=3)
    spreads: list[float] = []
    take = log.take_checkpoint

    def recording(lsn: int, written: set[int], on_failure: Any = None, spread: float = 0.0) -> Any:
        spreads.append(spread)
        return take(lsn, written, on_failure, spread)

    monkeypatch.setattr(log, "take_checkpoint", recording)
    monkeypatch.setattr(fileops, "_pause", lambda seconds: None)
    committer = GroupCommitter(log, checkpoint_bytes=1)  # after every cycle
    committer.start()
    for round_number in range(3):
        await append_and_wait(committer, log, round_number, 2)
    await committer.close()
    assert len(spreads) >= 2
    assert spreads[:-1] == [statelog.CHECKPOINT_SPREAD] * (len(spreads) - 1)
    assert spreads[-1] == 0.0
    await asyncio.to_thread(log.close)


async def test_a_failed_checkpoint_fsync_keeps_the_journal_and_stops_that_partition(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, num_partitions=2)
    failures: list[int] = []
    failed = asyncio.Event()

    def on_failure(partition: int, error: BaseException) -> None:
        failures.append(partition)
        failed.set()

    # A checkpoint after every cycle, or on the ticker when one was still running as
    # the cycle of partition 1 ended (100 ms rather than the 10 s default).
    committer = GroupCommitter(
        log, checkpoint_bytes=1, checkpoint_interval_ms=100, on_partition_failure=on_failure
    )
    committer.start()
    fs.fail("fdatasync", errno.EIO, path_contains="partitions/1/", times=None)
    kept = {p: await append_and_wait(committer, log, p, 2) for p in range(2)}
    await failed.wait()  # the checkpoint after the cycle meets the fault
    assert failures == [1]
    pinned_lsn = log.checkpoint.partitions.get(1)
    more = await append_and_wait(committer, log, 0, 2, first=2)  # the others go on
    assert log.checkpoint.partitions.get(1) == pinned_lsn  # its frames stay in the journal
    fs.clear()
    await asyncio.to_thread(log.partition(1).reset_to_durable)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=2) == kept[0] + more
    assert await asyncio.to_thread(read_back, data_dir, 1, num_partitions=2) == kept[1]


class _HeldSyncs(FaultInjectingFileOps):
    """Holds the fdatasync of one partition's files until released."""

    def __init__(self, held: str, *, kernel_flush: bool = False) -> None:
        super().__init__()
        self.held, self.reached, self.release = held, threading.Event(), threading.Event()
        self.kernel_flush = kernel_flush

    def allows_kernel_flush(self) -> bool:
        return self.kernel_flush  # it holds writes only, never a flush

    def fdatasync(self, fd: int) -> None:
        if self.held in self.path_of(fd):
            self.reached.set()
            assert self.release.wait(60), "the test never released the sync"
        super().fdatasync(fd)


async def test_a_partition_stops_as_its_checkpoint_sync_fails_not_when_the_checkpoint_ends(
    data_dir: str,
) -> None:
    """A status read after the fault is gone must not show it active and then see it
    stop: the stop comes as the sync fails, while the checkpoint syncs the others."""
    fs = _HeldSyncs("partitions/1/")
    log = await opened(data_dir, fs, num_partitions=2)
    failed = asyncio.Event()
    committer = GroupCommitter(
        log, checkpoint_bytes=1, on_partition_failure=lambda partition, error: failed.set()
    )
    committer.start()
    fs.fail("fdatasync", errno.EIO, path_contains="partitions/0/", times=None)
    try:
        (first,) = append_records(log.partition(0), 1)
        (second,) = append_records(log.partition(1), 1)
        # One cycle carries both, so the checkpoint after it syncs both, 0 first.
        await asyncio.gather(
            committer.wait_durable(0, first.offset), committer.wait_durable(1, second.offset)
        )
        assert await asyncio.to_thread(fs.reached.wait, 60)  # 0's sync failed; 1's is held
        fs.clear()
        await asyncio.wait_for(failed.wait(), 60)
        assert committer.checkpoints == 0  # the checkpoint has not ended
        with pytest.raises(PartitionFailedError):
            log.partition(0).append(*record_fields(1))
    finally:
        fs.release.set()
    await asyncio.to_thread(log.partition(0).reset_to_durable)
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_past_journal_max_bytes_writes_are_refused(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, num_partitions=2)
    committer = GroupCommitter(log, checkpoint_bytes=1, journal_max_bytes=4 * FRAME_SIZE)
    committer.start()
    fs.fail("fdatasync", errno.EIO, path_contains="partitions/1/", times=None)
    await append_and_wait(committer, log, 1, 1)
    assert not committer.refusing_writes
    for first in range(0, 40, 4):
        await append_and_wait(committer, log, 0, 4, first=first)
    assert committer.refusing_writes  # partition 1 pins the journal
    fs.clear()
    await asyncio.to_thread(log.partition(1).reset_to_durable)
    await append_and_wait(committer, log, 1, 1, first=1)
    while committer.refusing_writes:
        await append_and_wait(committer, log, 0, 1, first=100)
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_nothing_unacknowledged_is_ever_reported_durable(data_dir: str) -> None:
    """Random appends across partitions with random journal and partition faults: after
    failed partitions are reset, the disk holds the acknowledged records, and of the
    others only those a partition write failure left in the journal (a durable record
    whose file write failed is answered: it is no longer unknown)."""
    rng = random.Random(932)
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, segment_bytes=8 * FRAME_SIZE)
    committer = GroupCommitter(log, checkpoint_bytes=4 * FRAME_SIZE)
    committer.start()
    acknowledged: dict[int, list[LogRecord]] = {p: [] for p in range(3)}
    failed_rounds = 0
    for round_number in range(40):
        if rng.random() < 0.3:
            op = rng.choice(["write", "fdatasync", "fsync_dir"])
            where = rng.choice(["journal/", *(f"partitions/{p}/" for p in range(3))])
            fs.fail(op, errno.EIO, path_contains=where)
        batches = {
            p: append_records(log.partition(p), rng.randint(1, 6), round_number * 10)
            for p in range(3)
        }
        waits = [(p, r, committer.wait_durable(p, r.offset)) for p in range(3) for r in batches[p]]
        for p, record, future in waits:
            try:
                await future
            except DurabilityError:
                continue
            acknowledged[p].append(record)
        fs.clear()
        for p in range(3):
            if log.partition(p).failure is not None:
                failed_rounds += 1
                await asyncio.to_thread(log.partition(p).reset_to_durable)
    assert failed_rounds > 0
    await committer.close()
    await asyncio.to_thread(log.close)
    for p in range(3):
        on_disk = await asyncio.to_thread(
            read_back, data_dir, p, num_partitions=3, segment_bytes=8 * FRAME_SIZE
        )
        assert on_disk == acknowledged[p]


class _HeldWrites(FaultInjectingFileOps):
    """Holds every write to one partition's files until released (the journal's writes
    and all fdatasyncs go on)."""

    def __init__(self, held: str, *, kernel_flush: bool = False) -> None:
        super().__init__()
        self.held, self.reached, self.release = held, threading.Event(), threading.Event()
        self.kernel_flush = kernel_flush

    def allows_kernel_flush(self) -> bool:
        return self.kernel_flush  # it holds writes only, never a flush

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.held in self.path_of(fd):
            self.reached.set()
            assert self.release.wait(60), "the test never released the write"
        return super().write(fd, data)


@pytest.mark.parametrize("flush", ["thread", "kernel"])
async def test_a_checkpoint_never_counts_a_record_its_partition_files_do_not_have_yet(
    data_dir: str, tmp_path: pathlib.Path, flush: str
) -> None:
    """A timed checkpoint taken while a cycle's partition writes are still running
    counts only the cycles whose files are written: the record in flight stays in the
    journal for recovery. A copy of the directory taken then (a crash) recovers it.
    With the kernel's flush the record is answered before its files are written; the
    write held is one the commit thread does (a roll: the loop writes only what fits)."""
    kernel = flush == "kernel"
    fs = _HeldWrites(f"partitions{os.sep}0{os.sep}", kernel_flush=kernel)
    segment_bytes = 2 * FRAME_SIZE if kernel else 1 << 20
    log = await opened(data_dir, fs, num_partitions=2, segment_bytes=segment_bytes)
    failures: list[int] = []
    committer = GroupCommitter(
        log, checkpoint_interval_ms=20, on_partition_failure=lambda p, _: failures.append(p)
    )
    committer.start()
    try:
        first = []
        if kernel:
            fs.release.set()
            first = await append_and_wait(committer, log, 0, 2)  # its segment is full
            await wait_until(
                lambda: getattr(log.checkpoint.partitions.get(0), "next_offset", 0) == 2,
                "a checkpoint of partition 0's first segment",
            )
            fs.release.clear()
            fs.reached.clear()
        (earlier,) = append_records(log.partition(1), 1)
        await committer.wait_durable(1, earlier.offset)  # a partition for it to sync
        assert log.journal is not None
        before = log.journal.end_lsn
        checkpoints = committer.checkpoints
        (held,) = append_records(log.partition(0), 1, first=len(first))
        held_durable = committer.wait_durable(0, held.offset)
        assert await asyncio.to_thread(fs.reached.wait, 60)  # journaled, its file held
        assert log.journal.end_lsn > before
        if kernel:
            await held_durable  # answered: the journal has it
            assert committer.kernel_flushes
        await wait_until(
            lambda: committer.checkpoints > checkpoints, "a checkpoint while 0's write is held"
        )
        assert log.checkpoint.partitions[0].lsn <= before
        crashed = tmp_path / "crashed"
        await asyncio.to_thread(shutil.copytree, data_dir, crashed)
    finally:
        fs.release.set()
    await held_durable
    await committer.close()
    await asyncio.to_thread(log.close)
    assert failures == []
    recovered = await asyncio.to_thread(
        read_back, str(crashed), 0, num_partitions=2, segment_bytes=segment_bytes
    )
    assert recovered == [*first, held]
