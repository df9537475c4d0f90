"""The journal's flush by the kernel (persistence/kernel_flush.py): Linux AIO's FDSYNC,
its end signalled to the event loop. The committer answers a cycle when the kernel's
flush ends and writes the partition files after, in the commit thread.

What must hold: nothing is answered before its record is durable; a failed flush fails
its whole cycle and the next record goes to a fresh segment, as with the commit
thread's fdatasync; a kernel that refuses the flush moves it to the commit thread and
loses no cycle; a partition whose files fail after the answer stops, and what was
answered comes back from the journal. The kills at each step are in
test_crash_steps.py (both flushes).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import platform
import sys

import pytest

import persistence.commit
from persistence import (
    DurabilityError,
    FileOps,
    GroupCommitter,
    PartitionFailedError,
    kernel_flush,
    verify,
)
from persistence.journal import list_journal_segments, scan_journal
from persistence.kernel_flush import KernelFlush
from persistence.segments import segment_path
from persistence.statelog import partition_dir
from tests.harness.wait import wait_until
from tests.persistence.log_helpers import FRAME_SIZE, append_records, read_back, record_fields
from tests.persistence.test_group_commit import append_and_wait, opened

LINUX_AIO = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")


class ScriptedFlush:
    """A real kernel flush whose nth call goes as told: "eio" fails in the kernel (the
    future fails, after the real flush), "refuse" at submission (OSError at once),
    "hold" completes only once ``release`` is set too."""

    def __init__(self, real: KernelFlush, script: dict[int, str]) -> None:
        self.real, self.script, self.calls = real, script, 0
        self.release = asyncio.Event()

    @property
    def flushes(self) -> int:
        return self.real.flushes

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.real.start(loop)

    def fdatasync(self, fd: int) -> asyncio.Future[None]:
        self.calls += 1
        how = self.script.get(self.calls)
        if how == "refuse":
            raise OSError(errno.EINVAL, "io_submit(IOCB_CMD_FDSYNC): Invalid argument")
        flushed = self.real.fdatasync(fd)
        if how is None:
            return flushed
        return asyncio.ensure_future(self._after(flushed, how))

    async def _after(self, flushed: asyncio.Future[None], how: str) -> None:
        await flushed
        if how == "eio":
            raise OSError(errno.EIO, "fdatasync: Input/output error")
        await self.release.wait()

    def close(self) -> None:
        self.real.close()


class Script:
    """What the committers of a test get: their flushes, and what the nth call does."""

    def __init__(self) -> None:
        self.calls: dict[int, str] = {}
        self.flushes: list[ScriptedFlush] = []

    def __setitem__(self, nth: int, how: str) -> None:
        self.calls[nth] = how


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script()
    open_real = KernelFlush.open

    def open_scripted() -> ScriptedFlush:
        real = open_real()
        assert real is not None
        script.flushes.append(ScriptedFlush(real, script.calls))
        return script.flushes[-1]

    monkeypatch.setattr(persistence.commit.KernelFlush, "open", staticmethod(open_scripted))
    return script


def test_this_machine_has_the_kernel_flush() -> None:
    """Where the table has the system calls, the flush is there (else the tests below
    would test the commit thread twice)."""
    assert LINUX_AIO, "the kernel flush is Linux AIO: these tests need Linux on x86_64/aarch64"
    flush = KernelFlush.open()
    assert flush is not None
    flush.close()


@pytest.mark.parametrize("where", ["another OS", "io_setup refused"])
async def test_without_the_kernel_flush_the_log_says_why_and_the_thread_flushes(
    data_dir: str,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if where == "another OS":
        monkeypatch.setattr(kernel_flush.sys, "platform", "darwin")
        why = "Linux AIO is Linux only (this is darwin)"
    else:
        # A system call number no kernel has: io_setup fails with ENOSYS, as a seccomp
        # profile's refusal (EPERM) or a spent aio-max-nr (EAGAIN) would fail it.
        numbers = kernel_flush._SYSCALLS[platform.machine()]
        monkeypatch.setitem(kernel_flush._SYSCALLS, platform.machine(), (9999, *numbers[1:]))
        why = "io_setup refused: Function not implemented"
    log = await opened(data_dir, FileOps())
    committer = GroupCommitter(log)
    with caplog.at_level(logging.INFO, logger="sharecoord.log"):
        committer.start()
    assert f"journal flush: in the commit thread ({why})" in caplog.text
    kept = await append_and_wait(committer, log, 0, 2)
    kept += await append_and_wait(committer, log, 0, 2, first=2)
    assert committer.kernel_flushes is None
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept


async def test_a_flush_completes_on_the_loop_and_a_bad_descriptor_is_refused_at_once(
    tmp_path,
) -> None:
    flush = KernelFlush.open()
    assert flush is not None
    flush.start(asyncio.get_running_loop())
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        for round_ in range(3):
            os.pwrite(fd, b"x" * 100, round_ * 100)
            await flush.fdatasync(fd)
        assert flush.flushes == 3
        with pytest.raises(OSError, match="Bad file descriptor") as refused:
            flush.fdatasync(fd + 1000)
        assert refused.value.errno == errno.EBADF
        pending = flush.fdatasync(fd)
        with pytest.raises(RuntimeError, match="one kernel flush at a time"):
            flush.fdatasync(fd)
        await pending
    finally:
        os.close(fd)
        flush.close()


async def test_plain_files_get_the_kernel_flush_and_lose_nothing(data_dir: str) -> None:
    log = await opened(data_dir, FileOps(), num_partitions=3)
    committer = GroupCommitter(log)
    committer.start()
    acknowledged = {p: [] for p in range(3)}
    for round_ in range(5):
        for p in range(3):
            acknowledged[p] += await append_and_wait(committer, log, p, 3, first=10 * round_)
    flushes = committer.kernel_flushes
    await committer.close()
    await asyncio.to_thread(log.close)
    # The first cycle opens the journal's first segment (the commit thread's); the
    # others fit it.
    assert flushes is not None
    assert flushes >= committer.cycles - 1 >= 14
    for p in range(3):
        assert await asyncio.to_thread(read_back, data_dir, p, num_partitions=3) == acknowledged[p]
    assert (await asyncio.to_thread(verify, data_dir)).ok


async def test_the_thread_flush_can_be_asked_for(data_dir: str) -> None:
    log = await opened(data_dir, FileOps())
    committer = GroupCommitter(log, kernel_flush=False)
    committer.start()
    kept = await append_and_wait(committer, log, 0, 3)
    assert committer.kernel_flushes is None
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept


async def test_a_failed_kernel_flush_fails_its_cycle_and_the_next_record_starts_a_segment(
    data_dir: str, scripted: Script
) -> None:
    log = await opened(data_dir, FileOps())
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    kept = {p: await append_and_wait(committer, log, p, 2) for p in (0, 1)}
    assert committer.kernel_flushes == 1  # the first cycle opened the segment
    (flush,) = scripted.flushes
    scripted[flush.calls + 1] = "eio"
    lost = {p: append_records(log.partition(p), 2, first=2) for p in (0, 1)}
    waits = [committer.wait_durable(p, r.offset) for p in (0, 1) for r in lost[p]]
    outcomes = await asyncio.gather(*waits, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, DurabilityError)
        assert outcome.cause.errno == errno.EIO
    assert sorted(p for p, _ in failures) == [0, 1]
    assert [log.partition(p).durable_end_offset for p in (0, 1)] == [2, 2]
    with pytest.raises(PartitionFailedError):
        log.partition(0).append(*record_fields(9))

    for p in (0, 1):
        await committer.run_exclusive(log.partition(p).reset_to_durable)
    more = await append_and_wait(committer, log, 0, 2, first=10)
    journal = os.path.join(data_dir, "journal")
    segments = await asyncio.to_thread(list_journal_segments, FileOps(), journal)
    records = (await asyncio.to_thread(scan_journal, FileOps(), journal, 0)).records
    # The failed record was zeroed; the next one opened the next segment.
    assert [[e.first_offset for e in r.entries] for r in records] == [[0], [0], [2]]
    assert records[1].lsn < segments[1][0] == records[2].lsn
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept[0] + more
    assert await asyncio.to_thread(read_back, data_dir, 1, num_partitions=3) == kept[1]
    assert (await asyncio.to_thread(verify, data_dir)).ok


async def test_a_kernel_that_refuses_the_flush_hands_it_to_the_commit_thread(
    data_dir: str, scripted: Script, caplog: pytest.LogCaptureFixture
) -> None:
    log = await opened(data_dir, FileOps())
    committer = GroupCommitter(log)
    committer.start()
    kept = await append_and_wait(committer, log, 0, 2)
    (flush,) = scripted.flushes
    scripted[flush.calls + 1] = "refuse"
    with caplog.at_level(logging.WARNING, logger="sharecoord.log"):
        kept += await append_and_wait(committer, log, 0, 2, first=2)
    assert "journal flush: in the commit thread from now on" in caplog.text
    assert committer.kernel_flushes is None
    kept += await append_and_wait(committer, log, 0, 2, first=4)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=3) == kept


async def test_files_that_fail_after_the_answer_stop_the_partition_and_lose_nothing(
    data_dir: str,
) -> None:
    """The answer does not wait for the partition's files: a batch whose record the
    kernel flushed is answered, its files fail after, the partition stops, and a
    reset brings the answered records back from the journal."""
    log = await opened(data_dir, FileOps(), num_partitions=2)
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    kept = await append_and_wait(committer, log, 1, 2)
    # Partition 1's segment descriptor now refuses writes (the same number, open on
    # /dev/null for reading): its next write fails as a broken disk's would.
    part = log.partition(1)
    active = part._active_fd
    assert active is not None
    broken = os.open(os.devnull, os.O_RDONLY)
    os.dup2(broken, active)
    os.close(broken)
    answered = await append_and_wait(committer, log, 1, 2, first=2)
    other = await append_and_wait(committer, log, 0, 2)
    await wait_until(lambda: failures, "partition 1's files failed")
    assert [p for p, _ in failures] == [1]
    assert isinstance(failures[0][1], OSError)
    with pytest.raises(PartitionFailedError):
        part.append(*record_fields(9))
    assert part.durable_end_offset == 4
    await committer.run_exclusive(part.reset_to_durable)
    assert part.durable_end_offset == 4
    after = await append_and_wait(committer, log, 1, 1, first=4)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert await asyncio.to_thread(read_back, data_dir, 1, num_partitions=2) == (
        kept + answered + after
    )
    assert await asyncio.to_thread(read_back, data_dir, 0, num_partitions=2) == other


async def test_a_roll_that_fails_in_the_commit_thread_after_the_answer_stops_the_partition(
    data_dir: str,
) -> None:
    """The loop writes only what fits the active segment; a batch that rolls is the
    commit thread's, after the answer. Its failure (the next segment cannot be
    created) reaches the committer from there and stops the partition."""
    log = await opened(data_dir, FileOps(), num_partitions=2, segment_bytes=2 * FRAME_SIZE)
    failures: list[tuple[int, BaseException]] = []
    committer = GroupCommitter(log, on_partition_failure=lambda p, e: failures.append((p, e)))
    committer.start()
    kept = await append_and_wait(committer, log, 1, 2)  # its first segment is full
    blocker = segment_path(partition_dir(data_dir, 1), 2)
    await asyncio.to_thread(os.mkdir, blocker)  # where the next segment would be
    answered = await append_and_wait(committer, log, 1, 1, first=2)
    await wait_until(lambda: failures, "partition 1's roll failed")
    assert [p for p, _ in failures] == [1]
    assert isinstance(failures[0][1], FileExistsError)
    with pytest.raises(PartitionFailedError):
        log.partition(1).append(*record_fields(9))
    await asyncio.to_thread(os.rmdir, blocker)
    await committer.run_exclusive(log.partition(1).reset_to_durable)
    after = await append_and_wait(committer, log, 1, 1, first=3)
    await committer.close()
    await asyncio.to_thread(log.close)
    assert (
        await asyncio.to_thread(
            read_back, data_dir, 1, num_partitions=2, segment_bytes=2 * FRAME_SIZE
        )
        == kept + answered + after
    )


async def test_a_reset_never_runs_while_a_cycle_is_in_the_kernel(
    data_dir: str, scripted: Script
) -> None:
    """run_exclusive waits for the cycle in flight: a reset cannot bump a partition's
    generation between the cycle's check of it and the batch's journal record."""
    log = await opened(data_dir, FileOps())
    committer = GroupCommitter(log)
    committer.start()
    await append_and_wait(committer, log, 0, 1)
    await append_and_wait(committer, log, 0, 1, first=1)  # the journal's segment is open
    (flush,) = scripted.flushes
    scripted[flush.calls + 1] = "hold"
    calls = flush.calls
    (record,) = append_records(log.partition(0), 1, first=2)
    durable = committer.wait_durable(0, record.offset)
    await wait_until(lambda: flush.calls > calls, "the cycle's flush in the kernel")
    ran: list[str] = []
    exclusive = asyncio.ensure_future(committer.run_exclusive(lambda: ran.append("job")))
    # A job the commit thread runs now: the exclusive one would have run before it.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(committer._executor, lambda: ran.append("probe"))
    assert ran == ["probe"]
    assert not durable.done()
    flush.release.set()
    await durable
    await exclusive
    assert ran == ["probe", "job"]
    await committer.close()
    await asyncio.to_thread(log.close)
