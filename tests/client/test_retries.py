"""Retries against real failures: a daemon SIGKILLed and restarted mid-call, a daemon
still loading (14), a failed fsync (15); deadlines; and errors that must not be retried
(docs/semantics.md §12: the persister retries 3, 14, 15 and 16)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from client import (
    ACKNOWLEDGED,
    CoordinatorNotAvailable,
    DeadlineExceeded,
    FencedLeaderEpoch,
    ReadPartition,
    ReadResult,
    StateBatch,
    WritePartition,
)
from persistence import FAILPOINTS_ENV, StateLog
from protocol.records import ShareKey, ShareSnapshot, encode_record
from protocol.routing import partition_for
from protocol.state_batch import StateBatch as Batch
from protocol.topic_id import canonical_topic_id
from tests.client.conftest import TOPIC, entry_results, trace
from tests.harness import Acknowledged, free_ports

FAST_RETRIES = {"retry_backoff_ms": 10, "retry_backoff_max_ms": 100}


def request_failed() -> tuple[aiohttp.TraceConfig, asyncio.Event]:
    """A trace config whose event is set when a request raises (refused, reset...)."""
    failed = asyncio.Event()

    async def on_exception(*_: object) -> None:
        failed.set()

    config = aiohttp.TraceConfig()
    config.on_request_exception.append(on_exception)
    return config, failed


async def test_calls_complete_across_a_daemon_killed_and_restarted(
    daemons, clients, group, tmp_path
):
    daemon = daemons.make(tmp_path / "data", partitions=None)
    await asyncio.to_thread(daemon.start)
    tracer, failed = request_failed()
    client = clients(daemon.url, deadline_s=60, trace_configs=[tracer], **FAST_RETRIES)
    partitions = range(20)
    for p in partitions:
        await client.initialize(group, TOPIC, p, state_epoch=0, start_offset=0)
    # Each leader's last acknowledged write: the offset it started at.
    acknowledged = Acknowledged(dict.fromkeys(partitions, 0), matches=holds_write_at)
    wanted = dict.fromkeys(partitions, 3)  # acknowledged writes to wait for, per leader
    stop = asyncio.Event()
    progress = asyncio.Event()

    async def leader(p: int) -> None:
        # Like a share-partition leader: one write in flight, each awaited.
        offset = 0
        while not stop.is_set():
            offset += 1
            await client.write(
                group,
                TOPIC,
                p,
                state_epoch=0,
                leader_epoch=0,
                start_offset=offset,
                state_batches=[StateBatch(offset, offset + 9, ACKNOWLEDGED, 1)],
            )
            acknowledged.acknowledge(p, offset)
            if all(acknowledged.exact(q) >= wanted[q] for q in partitions):
                progress.set()

    leaders = [asyncio.ensure_future(leader(p)) for p in partitions]
    await progress.wait()
    await asyncio.to_thread(daemon.kill)  # writes in flight lose their answers
    await failed.wait()  # and the next attempts are refused: calls are retrying
    assert not any(task.done() for task in leaders)
    retries = client.stats.retries
    wanted = {p: acknowledged.exact(p) + 1 for p in partitions}
    progress.clear()
    await asyncio.to_thread(daemon.start)  # same data directory, same port
    await progress.wait()  # every leader got a write through after the restart
    stop.set()
    await asyncio.gather(*leaders)
    assert client.stats.retries > retries
    # Every acknowledged write is there: the last one each leader made.
    shown = {p: await client.read(group, TOPIC, p, leader_epoch=0) for p in partitions}
    acknowledged.verify(shown)


def holds_write_at(offset: int, state: ReadResult) -> bool:
    """Whether ``state`` is what a leader's write at ``offset`` left."""
    return (state.start_offset, state.state_batches) == (
        offset,
        [StateBatch(offset, offset + 9, ACKNOWLEDGED, 1)],
    )


def build_big_log(data_dir: Path, group: str, records: int) -> None:
    """A one-partition log that takes the daemon a while to replay, ending with the
    snapshot of ``(group, TOPIC, 0)`` at start offset 777."""
    log = StateLog.open(data_dir, 1)
    try:
        part = log.partition(0)
        part.open()
        batches = [Batch(2 * i, 2 * i, ACKNOWLEDGED, 1) for i in range(20)]
        topic = canonical_topic_id(TOPIC)
        for i in range(records):
            key = ShareKey("filler", topic, i)
            part.append(*encode_record(ShareSnapshot(key, 0, 0, 0, 0, 1, 1, batches)), 1)
            if i % 10_000 == 0:
                part.commit()
        key = ShareKey(group, topic, 0)
        part.append(*encode_record(ShareSnapshot(key, 0, 4, 0, 777, 1, 1, [])), 1)
        part.commit()
    finally:
        log.close()


async def test_a_loading_daemon_answers_14_and_the_call_waits_for_the_load(
    daemons, clients, group, tmp_path
):
    daemon = daemons.make(tmp_path / "data", partitions=1)
    await asyncio.to_thread(build_big_log, daemon.data_dir, group, 60_000)
    await asyncio.to_thread(daemon.start, ready=False)
    client = clients(daemon.url, num_partitions=1, deadline_s=120, **FAST_RETRIES)
    summary, state = await asyncio.gather(
        client.read_summary(group, TOPIC, 0), client.admin_state(group, TOPIC, 0)
    )
    assert (summary.start_offset, summary.state_epoch) == (777, 4)
    assert state is not None and state.start_offset == 777
    assert await entry_results(daemon, "read-summary", 14) >= 1
    assert client.stats.retries >= 1


async def test_a_failed_partition_answers_15_and_only_that_entry_is_sent_again(
    daemons, clients, group, tmp_path
):
    control = tmp_path / "failpoints.json"
    daemon = daemons.make(tmp_path / "data", partitions=None, env={FAILPOINTS_ENV: str(control)})
    await asyncio.to_thread(daemon.start)
    client = clients(daemon.url, **FAST_RETRIES)
    topic = canonical_topic_id(TOPIC)
    state_partitions = {p: partition_for(group, topic, p, 50) for p in range(10)}
    failing, healthy = 0, next(p for p, sp in state_partitions.items() if sp != state_partitions[0])
    for p in (failing, healthy):
        await client.initialize(group, TOPIC, p, state_epoch=0, start_offset=0)
    # Its file write fails once (the journal already made the record durable: the
    # partition stops and repairs itself), and its first reloads cannot open its files.
    where = f"partitions/{state_partitions[failing]}/"
    faults = [
        {"op": "write", "errno": "EIO", "path_contains": where, "times": 1},
        {"op": "open", "errno": "EIO", "path_contains": where, "times": 4},
    ]
    await asyncio.to_thread(write_atomically, control, json.dumps({"faults": faults}))
    await client.initialize(group, TOPIC, failing, state_epoch=0, start_offset=0)
    sent = client.stats.entries_sent
    batches = [StateBatch(5, 6, ACKNOWLEDGED, 1)]
    results = await client.write_many(
        group,
        [(TOPIC, WritePartition(p, 0, 0, 5, batches)) for p in (failing, healthy)],
    )
    assert [r.error_code for r in results] == [0, 0]
    assert await entry_results(daemon, "write", 15) >= 1  # while the partition reloads
    assert await entry_results(daemon, "write", 0) == 2  # each write applied once
    assert client.stats.retries >= 1
    assert client.stats.entries_sent - sent == 2 + client.stats.retries
    for p in (failing, healthy):
        state = await client.read(group, TOPIC, p, leader_epoch=0)
        assert (state.start_offset, state.state_batches) == (5, batches)


def write_atomically(path: Path, text: str) -> None:
    temp = path.with_suffix(".tmp")
    temp.write_text(text)
    os.replace(temp, path)


async def test_running_out_of_time_raises_a_clear_timeout_error(clients, group):
    [port] = free_ports(1)  # nothing listens there: every attempt is refused
    client = clients(f"http://127.0.0.1:{port}", deadline_s=0.3, **FAST_RETRIES)
    with pytest.raises(DeadlineExceeded) as info:
        await client.read(group, TOPIC, 0, leader_epoch=0)
    error = info.value
    assert isinstance(error, TimeoutError)
    assert error.attempts > 1
    assert isinstance(error.last_error, CoordinatorNotAvailable)
    message = str(error)
    assert f"read of group {group!r} topic {TOPIC} partition 0" in message
    assert "did not succeed within its deadline of 0.3s" in message
    assert f"request to http://127.0.0.1:{port} failed" in message
    # A batch call answers the same as data: 15 and why.
    [result] = await client.read_many(group, [(TOPIC, ReadPartition(0, 0))], deadline_s=0.2)
    assert result.error_code == 15
    assert f"request to http://127.0.0.1:{port} failed" in (result.error_message or "")


async def test_max_retries_bounds_the_attempts(clients, group):
    [port] = free_ports(1)
    client = clients(f"127.0.0.1:{port}", max_retries=2, deadline_s=60, **FAST_RETRIES)
    with pytest.raises(CoordinatorNotAvailable, match="failed"):
        await client.read_summary(group, TOPIC, 0)
    assert client.stats.coordinator_lookups == 3


@pytest.fixture
async def black_hole() -> AsyncIterator[str]:
    """A server that accepts connections and never answers. Each connection is held
    from its accept (not from a handler task that may not have run yet when the test
    ends), so the teardown closes every one before the loop ends."""
    held: list[asyncio.BaseTransport] = []

    class Swallow(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            held.append(transport)

        def eof_received(self) -> bool:
            return True  # stay open, as a server that never answers would

    server = await asyncio.get_running_loop().create_server(Swallow, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()
    for transport in held:
        transport.close()
    await asyncio.sleep(0)  # their connection_lost, which closes the sockets


async def test_a_call_waiting_for_an_answer_ends_at_its_deadline(black_hole, clients, group):
    client = clients(black_hole, request_timeout_s=600, deadline_s=0.3)
    with pytest.raises(DeadlineExceeded, match=r"within its deadline of 0\.3s"):
        await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)


async def test_errors_that_are_not_retriable_are_raised_at_once(shared_daemon, clients, group):
    seen = trace()
    client = clients(shared_daemon.url, trace_configs=[seen.config])
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)
    await client.read(group, TOPIC, 0, leader_epoch=2)
    with pytest.raises(FencedLeaderEpoch):
        await client.write(
            group, TOPIC, 0, state_epoch=0, leader_epoch=1, start_offset=-1, state_batches=[]
        )
    assert len(seen.paths("/write")) == 1
    assert client.stats.retries == 0
