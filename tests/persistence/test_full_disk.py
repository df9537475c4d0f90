"""A full disk at start-up and after a failure (docs/design.md#a-full-disk), the disk's
refusals injected: ENOSPC on every write through FaultInjectingFileOps (the end-to-end
tests do it with a really full tmpfs, tests/server/test_e2e_full_disk.py).

An open that may wait for room writes nothing: the writes that end it are left to
finish_opening. A partition whose catch-up with the journal the disk refused catches up
when it opens, whichever way it is opened. What it will hold then can be read without
writing (read_recovered), through the same recovery run on a scratch view of the files.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable

import pytest

from persistence import FaultInjectingFileOps, FileOps, GroupCommitter, LogRecord, StateLog
from persistence.fileops import create_file_durably, write_file_atomically
from persistence.journal import list_journal_segments
from persistence.scratch import ScratchFileOps
from tests.persistence.log_helpers import (
    append_records,
    frame_starts,
    newest_segment,
    tree_snapshot,
    write_through_journal,
)

NUM_PARTITIONS = 3


def full() -> FaultInjectingFileOps:
    """Every write refused as by a full disk."""
    fs = FaultInjectingFileOps()
    fs.fail("write", errno.ENOSPC, times=None)
    return fs


@pytest.fixture
def written(data_dir: str) -> list[list[LogRecord]]:
    """Records in the journal and the files; partition 1's file then lost its last
    frames (the crash came before the last cycles reached it), and the journal's last
    segment got a torn tail."""
    written = write_through_journal(data_dir, NUM_PARTITIONS, rounds=4, per_round=3)
    path = newest_segment(data_dir, 1)
    os.truncate(path, frame_starts(path)[5])
    _, segment = list_journal_segments(FileOps(), os.path.join(data_dir, "journal"))[-1]
    with open(segment, "r+b") as f:
        data = f.read()
        f.seek(len(data.rstrip(b"\0")))
        f.write(b"\x17" * 33)
    return written


def test_a_write_that_fails_leaves_no_file_behind(tmp_path) -> None:
    fs = FaultInjectingFileOps()
    fs.fail("write", errno.ENOSPC, short_write=True)
    with pytest.raises(OSError, match="No space left"):
        write_file_atomically(fs, str(tmp_path / "CHECKPOINT"), b"x" * 100)
    fs.fail("fsync", errno.ENOSPC)
    with pytest.raises(OSError, match="No space left"):
        create_file_durably(fs, str(tmp_path / "cut.broken"), b"y" * 100)
    assert os.listdir(tmp_path) == []


def test_an_open_on_a_full_disk_writes_nothing_and_finishes_once_there_is_room(
    data_dir, written
) -> None:
    before = tree_snapshot(data_dir)
    with pytest.raises(OSError, match="No space left"):
        StateLog.open(data_dir, NUM_PARTITIONS, fs=full())
    assert tree_snapshot(data_dir) == before  # not even a temporary file

    fs = full()
    log = StateLog.open(data_dir, NUM_PARTITIONS, fs=fs, full_disk_ok=True)
    try:
        assert log.opening_unfinished
        assert tree_snapshot(data_dir) == before
        with pytest.raises(OSError, match="No space left"):
            log.finish_opening()
        assert tree_snapshot(data_dir) == before
        fs.clear()
        log.finish_opening()
        assert not log.opening_unfinished
        journal = os.listdir(os.path.join(data_dir, "journal"))
        assert [name for name in journal if name.endswith(".broken")], journal
        for part in log.partitions:
            part.open()
            assert list(part.read()) == written[part.partition]
    finally:
        log.close()


def test_a_catch_up_the_disk_refused_is_done_when_the_partition_opens(data_dir, written) -> None:
    """Both ways a loader opens it: open(), and reset_to_durable() (the runtime's retry
    after a failed load), which once opened the files without the journal's frames."""
    fs = full()
    log = StateLog.open(data_dir, NUM_PARTITIONS, fs=fs, full_disk_ok=True)
    try:
        part = log.partition(1)
        with pytest.raises(OSError, match="No space left"):
            part.open()
        with pytest.raises(OSError, match="No space left"):
            part.reset_to_durable()
        fs.clear()
        part.reset_to_durable()
        assert list(part.read()) == written[1]
    finally:
        log.close()
    log = StateLog.open(data_dir, NUM_PARTITIONS)
    try:
        log.partition(1).open()
        assert list(log.partition(1).read()) == written[1]
    finally:
        log.close()


def test_read_recovered_is_what_the_open_will_leave_and_writes_nothing(data_dir, written) -> None:
    with open(newest_segment(data_dir, 2), "ab") as f:
        f.write(b"\x42" * 21)  # a torn tail to cut, with .broken bytes to keep
    fs = full()
    log = StateLog.open(data_dir, NUM_PARTITIONS, fs=fs, full_disk_ok=True)
    try:
        for p in (1, 2):
            with pytest.raises(OSError, match="No space left"):
                log.partition(p).open()
            before = tree_snapshot(data_dir)
            seen: list[LogRecord] = []
            log.partition(p).read_recovered(seen.append)
            assert tree_snapshot(data_dir) == before
            assert seen == written[p]
        fs.clear()
        for p in (1, 2):
            opened: list[LogRecord] = []
            log.partition(p).open(on_record=opened.append)
            assert opened == written[p]
    finally:
        log.close()


def test_read_recovered_after_a_failed_write_is_what_the_reset_will_leave(data_dir) -> None:
    """A running partition whose files refused a batch the journal made durable: the
    reset lays it into the files; read_recovered shows it without writing."""
    fs = FaultInjectingFileOps()
    log = StateLog.open(data_dir, NUM_PARTITIONS, fs=fs)
    part = log.partition(0)
    part.open()
    failures: list[BaseException] = []

    async def run() -> list[LogRecord]:
        committer = GroupCommitter(log, on_partition_failure=lambda p, exc: failures.append(exc))
        committer.start()
        try:
            kept = append_records(part, 4)
            await asyncio.gather(*(committer.wait_durable(0, r.offset) for r in kept))
            fs.fail("write", errno.ENOSPC, path_contains="partitions/0/", times=None)
            more = append_records(part, 3, first=4)
            await asyncio.gather(*(committer.wait_durable(0, r.offset) for r in more))
            return kept + more
        finally:
            await committer.close()

    try:
        durable = asyncio.run(run())
        assert failures and part.failure is not None
        before = tree_snapshot(data_dir)
        seen: list[LogRecord] = []
        part.read_recovered(seen.append)
        assert tree_snapshot(data_dir) == before
        assert seen == durable
        with pytest.raises(OSError, match="No space left"):
            part.reset_to_durable()
        fs.clear()
        part.reset_to_durable()
        assert list(part.read()) == durable
    finally:
        log.close()


def test_the_scratch_view_does_what_the_disk_does_and_leaves_it_as_it_was(tmp_path) -> None:
    """The same calls on a copy through the real FileOps and on the original through a
    ScratchFileOps: same answers, and the original unchanged."""
    for root in (tmp_path / "real", tmp_path / "view"):
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "a.log").write_bytes(b"0123456789" * 10)
        (root / "sub" / "b.log").write_bytes(b"bee")
    view_root = str(tmp_path / "view")
    before = tree_snapshot(view_root)
    real, view = FileOps(), ScratchFileOps(FileOps())
    answers = [script(real, str(tmp_path / "real")), script(view, view_root)]
    assert answers[0] == answers[1]
    assert tree_snapshot(view_root) == before


def script(fs: FileOps, root: str) -> list[object]:
    """Calls of every kind recovery makes, and what they answer."""
    sub = os.path.join(root, "sub")
    seen: list[object] = []
    fd = fs.open(os.path.join(sub, "a.log"), os.O_RDWR)
    seen.append(fs.pread(fd, 7, 95))
    fs.pwrite_all(fd, b"tail", 100)
    fs.pwrite_all(fd, b"more", 104)
    fs.truncate(fd, 102)
    fs.pwrite_all(fd, b"XY", 110)  # a hole before it
    seen += [fs.size(fd), fs.pread(fd, 30, 90)]
    fs.fdatasync(fd)
    fs.close(fd)
    fd = fs.open(os.path.join(sub, "c.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
    fs.write_all(fd, b"new")
    fs.write_all(fd, b"er")
    fs.close(fd)
    for attempt in (
        lambda: fs.open(os.path.join(sub, "c.log"), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
        lambda: fs.open(os.path.join(sub, "none.log"), os.O_RDONLY),
        lambda: fs.unlink(os.path.join(sub, "none.log")),
        lambda: fs.mkdir(sub),
    ):
        seen.append(_error_of(attempt))
    fs.rename(os.path.join(sub, "b.log"), os.path.join(sub, "d.log"))
    fs.unlink(os.path.join(sub, "a.log"))
    fs.mkdir(os.path.join(root, "new"))
    write_file_atomically(fs, os.path.join(root, "new", "MANIFEST"), b"{}")
    seen += [sorted(fs.listdir(sub)), sorted(fs.listdir(root)), fs.exists(sub + "/a.log")]
    for name in ("c.log", "d.log"):
        fd = fs.open(os.path.join(sub, name), os.O_RDONLY)
        seen += [fs.read(fd, 2), fs.read(fd, 100), fs.read(fd, 100)]
        fs.close(fd)
    fd = fs.open(os.path.join(sub, "d.log"), os.O_WRONLY | os.O_TRUNC)
    seen.append(fs.size(fd))
    fs.close(fd)
    return seen


def _error_of(call: Callable[[], object]) -> str:
    try:
        call()
    except OSError as exc:
        return type(exc).__name__
    return "no error"


async def test_the_committer_says_the_disk_is_full_and_when_it_has_room(data_dir) -> None:
    """No room for the journal's next segment: `disk_full` is set (writes are to be
    refused before they reach a shard), and cleared once the segment could be made."""
    fs = FaultInjectingFileOps()
    log = await asyncio.to_thread(StateLog.open, data_dir, NUM_PARTITIONS, fs=fs)
    fs.fail("write", errno.ENOSPC, path_contains="journal/", times=None)
    said: asyncio.Queue[BaseException | None] = asyncio.Queue()
    committer = GroupCommitter(log, on_disk_full=said.put_nowait)
    committer.start()
    try:
        full_disk = await asyncio.wait_for(said.get(), 60)
        assert isinstance(full_disk, OSError) and committer.disk_full is full_disk
        journal = await asyncio.to_thread(os.listdir, os.path.join(data_dir, "journal"))
        assert not [name for name in journal if name.endswith(".journal")], journal
        fs.clear()
        assert await asyncio.wait_for(said.get(), 60) is None
        assert committer.disk_full is None
    finally:
        await committer.close()
        await asyncio.to_thread(log.close)
