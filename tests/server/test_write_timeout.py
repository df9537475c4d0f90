"""A commit that does not finish within ``write_timeout_ms`` (Kafka's
share.coordinator.write.timeout.ms): the requests waiting on it answer 15 for what it
did not make durable, the others are not held, and once the disk answers again writes
succeed. The disk here is a FileOps whose fdatasync stops until the test lets it go."""

from __future__ import annotations

import asyncio
import threading
import time

from persistence import FileOps
from server.turns import Deadlines
from tests.harness import (
    TOPIC,
    batch,
    body,
    init_entry,
    part,
    partitions_in,
    read_entry,
    wait_until,
    write_entry,
)

GROUP = "timeouts"
TIMEOUT_MS = 300


class StallingFileOps(FileOps):
    """fdatasync waits while `stalled` is set (commit and checkpoint threads alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = False
        self.waiting = threading.Event()
        self.go = threading.Condition()

    def fdatasync(self, fd: int) -> None:
        with self.go:
            while self.stalled:
                self.waiting.set()
                self.go.wait()
        super().fdatasync(fd)

    def stall(self) -> None:
        with self.go:
            self.stalled = True

    def resume(self) -> None:
        with self.go:
            self.stalled = False
            self.go.notify_all()


async def test_a_commit_past_the_write_timeout_answers_15_then_writes_succeed(serve):
    fs = StallingFileOps()
    served = await serve(fs=fs, write_timeout_ms=TIMEOUT_MS, partitions=4)
    api = served.api("msgpack")
    assert await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(0), init_entry(1)]))) == [
        0,
        0,
    ]
    write = body(GROUP, (TOPIC, [write_entry(0, batch(0, 9, 2, 1), state_epoch=0)]))
    fs.stall()
    try:
        started = time.monotonic()
        # (Bounded here: a daemon without the timeout would wait for ever.)
        assert await asyncio.wait_for(api.codes("write", write), 10) == [15]
        waited = time.monotonic() - started
        assert fs.waiting.is_set(), "the commit never reached its fdatasync"
        assert TIMEOUT_MS / 1000 <= waited < 5, waited
        # A read of what is durable does not wait on the stuck commit.
        reads = await api.codes("read-summary", body(GROUP, (TOPIC, [{"partition": 1}])))
        assert reads == [0]
    finally:
        fs.resume()
    # The disk answers again: the next write is made durable and acknowledged.
    await wait_until(
        lambda: api.codes("write", write),
        "a write to succeed after the stall",
        until=lambda codes: codes == [0],
    )
    state = await api.state(GROUP, TOPIC, 0)
    assert state is not None
    assert [(b["first_offset"], b["last_offset"]) for b in state["state_batches"]] == [(0, 9)]


async def test_the_sweep_settles_expired_waits_only():
    loop = asyncio.get_running_loop()
    now = [100.0]
    deadlines = Deadlines(1.0, lambda: now[0])
    first, answered, later = (loop.create_future() for _ in range(3))
    deadlines.add(first)
    deadlines.add(answered)
    now[0] = 100.5
    deadlines.add(later)
    answered.set_result({5: None})
    deadlines.sweep()  # nothing expired yet
    assert not first.done() and not later.done()
    now[0] = 101.2
    deadlines.sweep()
    assert first.result() == {}  # timed out: settled with no failure, pending says the rest
    assert answered.result() == {5: None}  # its own answer stands
    assert not later.done()
    now[0] = 101.5
    deadlines.sweep()
    assert later.result() == {}
    assert deadlines.sweep_every_s == 0.1


async def test_a_read_of_a_quiet_key_does_not_wait_for_another_keys_commit(serve):
    """What a read shows rests on its key's records alone: with a commit stuck on one
    key of a state partition, the other keys of that partition read at once (0), while a
    read of the stuck key waits for that commit, and answers 15 when it times out."""
    fs = StallingFileOps()
    served = await serve(fs=fs, write_timeout_ms=2_000, partitions=2)
    api = served.api("msgpack")
    stuck, quiet = partitions_in(0, 2, group_id=GROUP, count=2)
    inits = [init_entry(stuck), init_entry(quiet)]
    assert await api.codes("initialize", body(GROUP, (TOPIC, inits))) == [0, 0]
    fs.stall()
    try:
        write = asyncio.create_task(
            api.codes("write", body(GROUP, (TOPIC, [write_entry(stuck, batch(0, 9, 2, 1))])))
        )
        await asyncio.to_thread(fs.waiting.wait, 30)
        assert fs.waiting.is_set(), "the commit never reached its fdatasync"
        for rpc, entry in (("read-summary", part(quiet)), ("read", read_entry(quiet))):
            assert await api.codes(rpc, body(GROUP, (TOPIC, [entry]))) == [0]
        state = await api.state(GROUP, TOPIC, quiet)
        assert state is not None and state["state_batches"] == []
        stuck_read = body(GROUP, (TOPIC, [part(stuck)]))
        assert await api.codes("read-summary", stuck_read) == [15]
        assert await write == [15]
    finally:
        fs.resume()
