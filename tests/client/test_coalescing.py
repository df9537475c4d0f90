"""Coalescing: concurrent calls to one node, for one RPC and one group, go out as one
request; every caller still gets exactly its own result, duplicates run in order, and a
request never exceeds the daemon's limits. Requests are counted by the daemon itself
(``sharecoord_rpc_requests_total``)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from client import (
    ACQUIRED,
    InitializePartition,
    InvalidRequest,
    ReadPartition,
    ReadSummaryPartition,
    StateBatch,
    WritePartition,
)
from tests.client.conftest import TOPIC, TOPIC_RFC4122, refused_requests, rpc_requests, scrape
from tests.harness import Daemon, DaemonConfig, metric_total

ENTRY_LIMIT = 10
BODY_LIMIT = 8192
BATCH_LIMIT = 50


@pytest.fixture(scope="module")
def limited_daemon(tmp_path_factory: pytest.TempPathFactory):
    """A daemon with small limits, to see requests split to fit them."""
    limits = (
        "--max-entries-per-request",
        str(ENTRY_LIMIT),
        "--max-body-bytes",
        str(BODY_LIMIT),
        "--max-state-batches-per-entry",
        str(BATCH_LIMIT),
    )
    data_dir = tmp_path_factory.mktemp("limited") / "data"
    daemon = Daemon(DaemonConfig(data_dir, limits, partitions=None)).start()
    yield daemon
    daemon.stop()


async def test_concurrent_calls_share_one_request_and_each_gets_its_own_result(
    shared_daemon, clients, group
):
    client = clients(shared_daemon.url, linger_ms=5)
    partitions = range(200)
    await client.initialize_many(
        group, [(TOPIC, InitializePartition(p, 0, 1000 + p)) for p in partitions]
    )
    before = await rpc_requests(shared_daemon, "read")
    states = await asyncio.gather(
        *(client.read(group, TOPIC, p, leader_epoch=0) for p in partitions)
    )
    assert [s.start_offset for s in states] == [1000 + p for p in partitions]
    assert await rpc_requests(shared_daemon, "read") - before == 1


async def test_calls_of_other_groups_or_rpcs_do_not_share_a_request(shared_daemon, clients, group):
    client = clients(shared_daemon.url, linger_ms=5)
    other = f"{group}-other"
    await asyncio.gather(
        client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=1),
        client.initialize(other, TOPIC, 0, state_epoch=0, start_offset=2),
    )
    requests = client.stats.requests
    summary, state = await asyncio.gather(
        client.read_summary(group, TOPIC, 0), client.read(other, TOPIC, 0, leader_epoch=0)
    )
    assert (summary.start_offset, state.start_offset) == (1, 2)
    assert client.stats.requests - requests == 2


async def test_linger_zero_sends_at_once_and_merges_what_queues_while_in_flight(
    shared_daemon, clients, group
):
    started = asyncio.Event()

    async def on_request_start(*_: object) -> None:
        started.set()

    tracer = aiohttp.TraceConfig()
    tracer.on_request_start.append(on_request_start)
    client = clients(shared_daemon.url, linger_ms=0, trace_configs=[tracer])
    await client.initialize_many(group, [(TOPIC, InitializePartition(p, 0, p)) for p in range(51)])
    before = await rpc_requests(shared_daemon, "read")
    started.clear()
    first = asyncio.ensure_future(client.read(group, TOPIC, 0, leader_epoch=0))
    await started.wait()  # linger 0: the first call goes out alone, at once
    rest = await asyncio.gather(
        *(client.read(group, TOPIC, p, leader_epoch=0) for p in range(1, 51))
    )
    assert (await first).start_offset == 0
    assert [s.start_offset for s in rest] == list(range(1, 51))
    assert await rpc_requests(shared_daemon, "read") - before == 2


async def test_duplicates_in_one_request_run_in_call_order(shared_daemon, clients, group):
    client = clients(shared_daemon.url, linger_ms=20)
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)
    before = await rpc_requests(shared_daemon, "write")
    # Both spellings name one key; the writes must still apply in the order made.
    spellings = [TOPIC, TOPIC_RFC4122, TOPIC, TOPIC_RFC4122, TOPIC]
    await asyncio.gather(
        *(
            client.write(
                group,
                topic_id,
                0,
                state_epoch=0,
                leader_epoch=0,
                start_offset=10 * (i + 1),
                state_batches=[StateBatch(100 + i, 100 + i, ACQUIRED, i + 1)],
            )
            for i, topic_id in enumerate(spellings)
        )
    )
    assert await rpc_requests(shared_daemon, "write") - before == 1
    first, second = await asyncio.gather(
        client.read(group, TOPIC, 0, leader_epoch=0),
        client.read(group, TOPIC_RFC4122, 0, leader_epoch=0),
    )
    assert first == second
    assert first.start_offset == 50
    assert first.state_batches == [StateBatch(100 + i, 100 + i, ACQUIRED, i + 1) for i in range(5)]


async def test_a_call_given_up_before_it_is_sent_is_dropped(shared_daemon, clients, group):
    client = clients(shared_daemon.url, linger_ms=50)
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)
    sent = client.stats.entries_sent
    kept = [asyncio.ensure_future(client.read_summary(group, TOPIC, p)) for p in (0, 1)]
    dropped = asyncio.ensure_future(client.read_summary(group, TOPIC, 2))
    await asyncio.sleep(0)  # all three are queued, none is sent (the linger)
    dropped.cancel()
    assert [s.start_offset for s in await asyncio.gather(*kept)] == [0, -1]
    assert client.stats.entries_sent - sent == 2


async def test_requests_split_at_the_entry_limit(limited_daemon, clients, group):
    client = clients(limited_daemon.url, linger_ms=5, max_entries_per_request=ENTRY_LIMIT)
    # Learn every owner first, so that all 35 calls are queued in the same turn.
    await client.read_summary_many(group, [(TOPIC, ReadSummaryPartition(p)) for p in range(35)])
    before = await rpc_requests(limited_daemon, "initialize")
    await asyncio.gather(
        *(client.initialize(group, TOPIC, p, state_epoch=0, start_offset=p) for p in range(35))
    )
    assert await rpc_requests(limited_daemon, "initialize") - before == 4
    before = await rpc_requests(limited_daemon, "read")
    states = await client.read_many(group, [(TOPIC, ReadPartition(p, 0)) for p in range(25)])
    assert [(s.error_code, s.start_offset) for s in states] == [(0, p) for p in range(25)]
    assert await rpc_requests(limited_daemon, "read") - before == 3
    assert await refused_requests(limited_daemon, "initialize") == 0


async def test_requests_split_to_fit_the_body_limit(limited_daemon, clients, group):
    client = clients(
        limited_daemon.url,
        linger_ms=5,
        max_entries_per_request=ENTRY_LIMIT,
        max_body_bytes=BODY_LIMIT,
    )
    await client.initialize_many(group, [(TOPIC, InitializePartition(p, 0, 0)) for p in range(10)])
    batches = [StateBatch(2 * i, 2 * i, ACQUIRED, 1) for i in range(BATCH_LIMIT)]
    before = await rpc_requests(limited_daemon, "write")
    results = await client.write_many(
        group, [(TOPIC, WritePartition(p, 0, 0, -1, batches)) for p in range(10)]
    )
    assert [r.error_code for r in results] == [0] * 10
    assert await rpc_requests(limited_daemon, "write") - before > 1
    errors = metric_total(
        await scrape(limited_daemon), "sharecoord_http_error_responses_total", status="413"
    )
    assert errors == 0
    state = await client.read(group, TOPIC, 9, leader_epoch=0)
    assert state.state_batches == batches


async def test_a_body_the_daemon_refuses_raises_invalid_request_with_its_message(
    limited_daemon, clients, group
):
    client = clients(limited_daemon.url)  # the default limits, above this daemon's
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)
    batches = [StateBatch(2 * i, 2 * i, ACQUIRED, 1) for i in range(BATCH_LIMIT + 1)]
    with pytest.raises(InvalidRequest, match=rf"state_batches.*limit of {BATCH_LIMIT}") as info:
        await client.write(
            group, TOPIC, 0, state_epoch=0, leader_epoch=0, start_offset=-1, state_batches=batches
        )
    assert info.value.errno == 42
    assert client.stats.retries == 0
    # In a batch call the refusal is every entry's result.
    results = await client.initialize_many(
        group, [(TOPIC, InitializePartition(p, 0, 0)) for p in range(ENTRY_LIMIT + 1)]
    )
    assert {r.error_code for r in results} == {42}
    assert all(f"limit of {ENTRY_LIMIT}" in (r.error_message or "") for r in results)
