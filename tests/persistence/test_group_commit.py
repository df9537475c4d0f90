"""GroupCommitter: what one cycle covers, when waiters resolve, and the failure path.

No test waits on time: fdatasync calls are gated (held until the test lets them go)
where a test needs a cycle to be in flight. The blockbuster fixture makes every test
here fail if the committer blocks the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import queue
import random
import threading

import pytest
from blockbuster import BlockingError
from log_helpers import FRAME_SIZE, append_records, open_log, read_back, record_fields

from persistence import (
    DurabilityError,
    FaultInjectingFileOps,
    FileOps,
    GroupCommitter,
    LogRecord,
    PartitionFailedError,
    StateLog,
    verify,
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

    def fdatasync(self, fd: int) -> None:
        self.entered.put(self.path_of(fd))
        assert self.permits.acquire(timeout=30), "the test never let the fdatasync go"
        super().fdatasync(fd)

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


async def test_every_partition_dirty_in_a_cycle_is_fsynced_in_that_cycle(data_dir: str) -> None:
    fs = RecordingFileOps()
    log = await opened(data_dir, fs, num_partitions=4)
    committer = GroupCommitter(log)
    committer.start()
    waits = []
    for partition in (0, 1, 3):
        (record,) = append_records(log.partition(partition), 1)
        waits.append(committer.wait_durable(partition, record.offset))
    await asyncio.gather(*waits)
    assert committer.cycles == 1
    assert sorted(partition_of(path) for path in fs.datasynced) == [0, 1, 3]
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_each_cycle_reports_its_partitions_and_their_write_times(data_dir: str) -> None:
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
    assert len(times) == 3
    assert all(seconds >= 0 for seconds in times)
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
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_a_failed_fsync_fails_exactly_that_partitions_waiters(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    acknowledged = {p: await append_and_wait(committer, log, p, 2) for p in range(3)}

    fs.fail("fsync", errno.EIO, path_contains="partitions/1/")
    appended = {p: append_records(log.partition(p), 2, first=2) for p in range(3)}
    waits = [committer.wait_durable(p, r.offset) for p in range(3) for r in appended[p]]
    outcomes = await asyncio.gather(*waits, return_exceptions=True)

    assert outcomes[:2] == [None, None]
    assert outcomes[4:] == [None, None]
    for failed in outcomes[2:4]:
        assert isinstance(failed, DurabilityError)
        assert failed.partition == 1
        assert isinstance(failed.cause, OSError)
        assert failed.cause.errno == errno.EIO
    assert [(p, e.errno) for p, e in failures if isinstance(e, OSError)] == [(1, errno.EIO)]
    assert len(failures) == 1
    assert log.partition(1).durable_end_offset == 2
    with pytest.raises(PartitionFailedError):
        log.partition(1).append(*record_fields(9))
    await committer.wait_durable(1, 1)  # what was durable before still is

    report = await asyncio.to_thread(log.partition(1).reset_to_durable)
    assert report.log_end_offset == 2
    again = await append_and_wait(committer, log, 1, 2, first=20)
    assert [r.offset for r in again] == [2, 3]
    await committer.close()
    await asyncio.to_thread(log.close)

    on_disk = await asyncio.to_thread(read_back, data_dir, 1, num_partitions=3)
    assert on_disk == acknowledged[1] + again
    assert (await asyncio.to_thread(verify, data_dir)).ok


async def test_one_barrier_settles_every_partition_and_names_the_failed_one(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    fs.fail("fsync", errno.EIO, path_contains="partitions/2/")
    targets = {p: append_records(log.partition(p), 3)[-1].offset for p in range(3)}
    barrier = committer.wait_durable_many(targets)
    failed = await barrier.future
    assert list(failed) == [2]
    assert isinstance(failed[2], DurabilityError)
    assert failed[2].cause.errno == errno.EIO
    assert not barrier.pending
    assert [log.partition(p).durable_end_offset for p in range(3)] == [3, 3, 0]
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
    fs.fail("fdatasync", errno.EIO, path_contains="partitions/0/")
    (first,) = append_records(log.partition(0), 1)
    first_durable = committer.wait_durable(0, first.offset)
    await fs.next_fdatasync()
    (later,) = append_records(log.partition(0), 1, first=1)  # after the failing batch
    later_durable = committer.wait_durable(0, later.offset)
    fs.permits.release()
    for waiter in (first_durable, later_durable):
        with pytest.raises(DurabilityError):
            await waiter
    with pytest.raises(DurabilityError):
        await committer.wait_durable(0, later.offset)  # a failed partition answers at once
    assert log.partition(0).durable_end_offset == 0
    await committer.close()
    await asyncio.to_thread(log.close)


async def test_a_short_write_is_cut_back_to_the_durable_end(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 0, 3)
    fs.fail("write", errno.ENOSPC, path_contains="partitions/0/", short_write=True)
    (lost,) = append_records(log.partition(0), 1, first=3)
    with pytest.raises(DurabilityError) as failed:
        await committer.wait_durable(0, lost.offset)
    assert isinstance(failed.value.cause, OSError)
    assert failed.value.cause.errno == errno.ENOSPC
    segment = log.partition(0).segments[-1].path
    # Half a frame landed, and was cut before the waiter heard of the failure: a crash
    # from here on cannot replay what was answered as failed.
    assert await asyncio.to_thread(os.path.getsize, segment) == 3 * FRAME_SIZE

    await asyncio.to_thread(log.partition(0).reset_to_durable)
    assert await asyncio.to_thread(os.path.getsize, segment) == 3 * FRAME_SIZE
    more = await append_and_wait(committer, log, 0, 2, first=10)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept + more


async def test_a_failed_fsync_cuts_the_unsynced_frames_before_the_waiters_hear(
    data_dir: str,
) -> None:
    """Whole frames written but not fsynced are cut (in the page cache) before a waiter
    learns of the failure, even while the reset cannot run (every fsync fails), so a
    process that dies then does not replay them."""
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, segment_bytes=3 * FRAME_SIZE)
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 0, 2)
    fs.fail("fsync", errno.EIO, path_contains="partitions/0/", times=None)
    appended = append_records(log.partition(0), 3, first=2)  # written, then the fsync fails
    outcomes = await asyncio.gather(
        *(committer.wait_durable(0, r.offset) for r in appended), return_exceptions=True
    )
    assert all(isinstance(o, DurabilityError) for o in outcomes)
    assert all(o.durable_end_offset == 2 for o in outcomes)  # type: ignore[union-attr]
    directory = log.partition(0).partition_dir
    names = sorted(await asyncio.to_thread(os.listdir, directory))
    assert names == ["00000000000000000000.log"]
    assert await asyncio.to_thread(os.path.getsize, segment_file(directory, 0)) == 2 * FRAME_SIZE
    with pytest.raises(OSError, match="injected"):
        await asyncio.to_thread(log.partition(0).reset_to_durable)
    await committer.close()
    await asyncio.to_thread(log.close)
    fs.clear()
    on_disk = await asyncio.to_thread(
        read_back, data_dir, 0, num_partitions=3, segment_bytes=3 * FRAME_SIZE
    )
    assert on_disk == kept


def segment_file(directory: str, base: int) -> str:
    return os.path.join(directory, f"{base:020d}.log")


async def test_a_failure_after_a_roll_keeps_what_the_fsync_before_the_roll_covered(
    data_dir: str,
) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, segment_bytes=3 * FRAME_SIZE)
    committer = GroupCommitter(log)
    committer.start()
    fs.fail("write", errno.EIO, path_contains="00000000000000000003.log")
    appended = append_records(log.partition(0), 5)  # one batch: 0-2 fill a segment, 3-4 roll
    outcomes = await asyncio.gather(
        *(committer.wait_durable(0, r.offset) for r in appended), return_exceptions=True
    )
    assert outcomes[:3] == [None, None, None]
    assert all(isinstance(o, DurabilityError) for o in outcomes[3:])
    assert log.partition(0).durable_end_offset == 3

    await asyncio.to_thread(log.partition(0).reset_to_durable)
    assert [s.base_offset for s in log.partition(0).segments] == [0]
    more = await append_and_wait(committer, log, 0, 4, first=10)
    assert [s.base_offset for s in log.partition(0).segments] == [0, 3, 6]
    await committer.close()
    await asyncio.to_thread(log.close)
    on_disk = await asyncio.to_thread(
        read_back, data_dir, 0, num_partitions=3, segment_bytes=3 * FRAME_SIZE
    )
    assert on_disk == appended[:3] + more


async def test_reset_to_durable_can_be_retried_when_it_fails(data_dir: str) -> None:
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs)
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 2, 2)
    fs.fail("write", errno.EIO, path_contains="partitions/2/", short_write=True)
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


async def test_nothing_unacknowledged_is_ever_reported_durable(data_dir: str) -> None:
    """Random appends across partitions with random write and fsync faults: after
    failed partitions are reset, the disk holds exactly the acknowledged records."""
    rng = random.Random(932)
    fs = FaultInjectingFileOps()
    log = await opened(data_dir, fs, segment_bytes=8 * FRAME_SIZE)
    committer = GroupCommitter(log)
    committer.start()
    acknowledged: dict[int, list[LogRecord]] = {p: [] for p in range(3)}
    failed_rounds = 0
    for round_number in range(40):
        if rng.random() < 0.3:
            op = rng.choice(["write", "fdatasync", "fsync_dir"])
            fs.fail(op, errno.EIO, path_contains=f"partitions/{rng.randrange(3)}/")
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
