"""Every RPC through the client against a real daemon, in both wire formats; typed errors
from the per-partition calls, errors as data from the batch calls (docs/api.md,
docs/semantics.md §5)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from client import (
    ACKNOWLEDGED,
    ACQUIRED,
    AVAILABLE,
    DeletePartition,
    FencedLeaderEpoch,
    FencedStateEpoch,
    Format,
    InitializePartition,
    InvalidRequest,
    ReadPartition,
    ReadResult,
    ReadSummaryPartition,
    ReadSummaryResult,
    StateBatch,
    WritePartition,
)
from protocol.errors import MSG_NEGATIVE_PARTITION, MSG_READ_UNINITIALIZED, MSG_WRITE_UNINITIALIZED
from tests.client.conftest import OTHER_TOPIC, TOPIC, TOPIC_RFC4122, refused_requests, trace

EXAMPLE = json.loads(
    (Path(__file__).parent.parent / "data" / "kip932-worked-example.json").read_text()
)
MEDIA_TYPES = {Format.MSGPACK: "application/msgpack", Format.JSON: "application/json"}


@pytest.fixture(params=[Format.MSGPACK, Format.JSON], ids=["msgpack", "json"])
def fmt(request: pytest.FixtureRequest) -> Format:
    return request.param


async def test_every_rpc_round_trips_in_both_formats(shared_daemon, clients, group, fmt):
    seen = trace()
    client = clients(shared_daemon.url, format=fmt, trace_configs=[seen.config])
    await client.initialize(group, TOPIC, 0, state_epoch=1, start_offset=-1)
    assert await client.read(group, TOPIC, 0, leader_epoch=3) == ReadResult(1, -1, [])
    await client.write(
        group,
        TOPIC,
        0,
        state_epoch=1,
        leader_epoch=3,
        start_offset=0,
        state_batches=[StateBatch(0, 9, ACQUIRED, 1)],
        delivery_complete_count=0,
    )
    await client.write(
        group,
        TOPIC,
        0,
        state_epoch=1,
        leader_epoch=3,
        start_offset=-1,
        state_batches=[StateBatch(0, 4, ACKNOWLEDGED, 1)],
    )
    # docs/semantics.md §14 row 4: the batches merge, the start offset stays.
    assert await client.read(group, TOPIC, 0, leader_epoch=3) == ReadResult(
        1, 0, [StateBatch(0, 4, ACKNOWLEDGED, 1), StateBatch(5, 9, ACQUIRED, 1)]
    )
    assert await client.read_summary(group, TOPIC, 0) == ReadSummaryResult(1, 3, 0, 0)
    await client.delete(group, TOPIC, 0)
    # docs/semantics.md §A.1 point 6: a key with no state summarises as -1, 0, 0, -1.
    assert await client.read_summary(group, TOPIC, 0) == ReadSummaryResult(0, 0, -1, -1)
    with pytest.raises(InvalidRequest, match=MSG_READ_UNINITIALIZED):
        await client.read(group, TOPIC, 0, leader_epoch=3)
    await client.delete(group, TOPIC, 0)  # deleting what has no state succeeds
    rpcs = [path.rsplit("/", 1)[1] for path in seen.paths() if "share-group-state" in path]
    assert sorted(set(rpcs)) == ["delete", "initialize", "read", "read-summary", "write"]
    assert {ct for _, path, ct in seen.requests if path.startswith("/v1/")} == {MEDIA_TYPES[fmt]}


async def test_kip932_worked_example_through_the_client(shared_daemon, clients, group, fmt):
    client = clients(shared_daemon.url, format=fmt)
    topic_id, partition = EXAMPLE["topic_id"], EXAMPLE["partition"]

    async def read_as_wire() -> dict:
        state = await client.read(group, topic_id, partition, leader_epoch=1)
        return {
            "partition": partition,
            "error_code": 0,
            "error_message": None,
            "state_epoch": state.state_epoch,
            "start_offset": state.start_offset,
            "state_batches": [msgspec.structs.asdict(b) for b in state.state_batches],
        }

    for step in EXAMPLE["steps"]:
        [p] = step["request"]["topics"][0]["partitions"]
        [expected] = step["expected_response"]["results"][0]["partitions"]
        if step["rpc"] == "initialize":
            await client.initialize(
                group,
                topic_id,
                partition,
                state_epoch=p["state_epoch"],
                start_offset=p["start_offset"],
            )
        elif step["rpc"] == "read":
            assert await read_as_wire() == expected, step["description"]
        else:
            await client.write(
                group,
                topic_id,
                partition,
                state_epoch=p["state_epoch"],
                leader_epoch=p["leader_epoch"],
                start_offset=p["start_offset"],
                state_batches=[StateBatch(**b) for b in p["state_batches"]],
            )
        assert expected["error_code"] == 0
        if "then_read" in step:
            [after] = step["then_read"]["expected_response"]["results"][0]["partitions"]
            assert await read_as_wire() == after, step["description"]


async def test_fenced_leader_epoch_raises_74(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    await client.initialize(group, TOPIC, 0, state_epoch=1, start_offset=0)
    await client.read(group, TOPIC, 0, leader_epoch=5)
    with pytest.raises(FencedLeaderEpoch) as info:
        await client.write(
            group, TOPIC, 0, state_epoch=1, leader_epoch=4, start_offset=-1, state_batches=[]
        )
    assert info.value.errno == 74
    with pytest.raises(FencedLeaderEpoch):
        await client.read(group, TOPIC, 0, leader_epoch=-1)  # no -1 exemption for reads


async def test_fenced_state_epoch_raises_124(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    await client.initialize(group, TOPIC, 0, state_epoch=7, start_offset=0)
    with pytest.raises(FencedStateEpoch) as info:
        await client.write(
            group, TOPIC, 0, state_epoch=6, leader_epoch=0, start_offset=-1, state_batches=[]
        )
    assert info.value.errno == 124
    with pytest.raises(FencedStateEpoch):
        await client.initialize(group, TOPIC, 0, state_epoch=6, start_offset=0)


async def test_write_to_an_uninitialized_share_partition_raises_42_with_kafkas_text(
    shared_daemon, clients, group
):
    client = clients(shared_daemon.url)
    with pytest.raises(InvalidRequest) as info:
        await client.write(
            group, TOPIC, 3, state_epoch=0, leader_epoch=0, start_offset=0, state_batches=[]
        )
    assert info.value.errno == 42
    assert info.value.message == MSG_WRITE_UNINITIALIZED


async def test_an_entry_the_daemon_refuses_raises_42_with_its_message(
    shared_daemon, clients, group
):
    client = clients(shared_daemon.url)
    with pytest.raises(InvalidRequest, match=MSG_NEGATIVE_PARTITION):
        await client.initialize(group, TOPIC, -1, state_epoch=0, start_offset=0)


async def test_batch_calls_return_errors_as_data_in_entry_order(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    await client.initialize(group, TOPIC, 0, state_epoch=2, start_offset=0)
    await client.initialize(group, TOPIC, 1, state_epoch=2, start_offset=0)
    await client.read(group, TOPIC, 1, leader_epoch=9)
    results = await client.write_many(
        group,
        [
            (TOPIC, WritePartition(0, 2, 0, 10, [StateBatch(10, 19, AVAILABLE, 1)])),
            (TOPIC, WritePartition(1, 2, 8, -1, [])),  # fenced leader epoch
            (TOPIC, WritePartition(0, 1, 0, -1, [])),  # fenced state epoch
            (TOPIC, WritePartition(2, 2, 0, -1, [])),  # uninitialized
            (TOPIC, WritePartition(-4, 2, 0, -1, [])),  # refused by the daemon's edge checks
            (TOPIC, WritePartition(0, 2, 0, -1, [StateBatch(0, 1, 300, 1)])),  # not an int8
            ("not-a-topic-id", WritePartition(0, 2, 0, -1, [])),
        ],
    )
    assert [(r.partition, r.error_code) for r in results] == [
        (0, 0),
        (1, 74),
        (0, 124),
        (2, 42),
        (-4, 42),
        (0, 42),
        (0, 42),
    ]
    assert results[0].error_message is None
    assert results[3].error_message == MSG_WRITE_UNINITIALIZED
    assert results[4].error_message == MSG_NEGATIVE_PARTITION
    assert "state_batches[0].delivery_state" in (results[5].error_message or "")
    assert "not-a-topic-id" in (results[6].error_message or "")

    reads = await client.read_many(
        group, [(TOPIC, ReadPartition(0, 0)), (TOPIC, ReadPartition(5, 0))]
    )
    assert (reads[0].error_code, reads[0].start_offset) == (0, 10)
    assert reads[0].state_batches == [StateBatch(10, 19, AVAILABLE, 1)]
    # An error result carries Kafka's schema defaults (docs/api.md).
    assert (reads[1].error_code, reads[1].state_epoch, reads[1].start_offset) == (42, 0, 0)


async def test_every_batch_call_answers_per_entry(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    initialized = await client.initialize_many(
        group, [(TOPIC, InitializePartition(p, 1, 100 + p)) for p in range(3)]
    )
    assert [(r.partition, r.error_code) for r in initialized] == [(0, 0), (1, 0), (2, 0)]
    summaries = await client.read_summary_many(
        group, [(OTHER_TOPIC, ReadSummaryPartition(0)), (TOPIC, ReadSummaryPartition(2))]
    )
    assert [(s.start_offset, s.state_epoch) for s in summaries] == [(-1, 0), (102, 1)]
    deleted = await client.delete_many(group, [(TOPIC, DeletePartition(p)) for p in range(3)])
    assert [r.error_code for r in deleted] == [0, 0, 0]
    assert await client.admin_state(group, TOPIC, 1) is None


async def test_a_bad_entry_fails_alone_and_never_reaches_the_wire(shared_daemon, clients, group):
    """Coalesced requests carry other callers' entries: one ill-typed entry must not
    turn the shared body into an HTTP 400 for all of them."""
    client = clients(shared_daemon.url, linger_ms=20)
    refused_before = await refused_requests(shared_daemon, "initialize")
    outcomes = await asyncio.gather(
        client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0),
        client.initialize(group, TOPIC, 1, state_epoch=2**31, start_offset=0),
        client.initialize(group, TOPIC, 2, state_epoch=0, start_offset=True),  # type: ignore[arg-type]
        client.initialize(group, "nope", 3, state_epoch=0, start_offset=0),
        client.initialize("", TOPIC, 4, state_epoch=0, start_offset=0),
        client.initialize(group, TOPIC, 5, state_epoch=0, start_offset=0),
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[5] is None
    messages = [str(o) for o in outcomes[1:5] if isinstance(o, InvalidRequest)]
    assert len(messages) == 4
    assert "state_epoch: expected an integer in int32 range, got 2147483648" in messages[0]
    assert "start_offset: expected an integer in int64 range, got a boolean" in messages[1]
    assert "topic_id 'nope'" in messages[2]
    assert "group_id" in messages[3]
    assert await refused_requests(shared_daemon, "initialize") == refused_before
    assert client.stats.entries_sent == 2


async def test_both_topic_id_spellings_name_one_share_partition(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    await client.initialize(group, TOPIC, 0, state_epoch=3, start_offset=42)
    assert (await client.read(group, TOPIC_RFC4122, 0, leader_epoch=0)).start_offset == 42
    state = await client.admin_state(group, TOPIC_RFC4122, 0)
    assert state is not None
    assert state.topic_id == TOPIC_RFC4122  # echoed as spelled (docs/semantics.md §A.1 point 17)


async def test_admin_state_shows_epochs_and_fencing_maxima(shared_daemon, clients, group):
    client = clients(shared_daemon.url)
    assert await client.admin_state(group, TOPIC, 0) is None
    await client.initialize(group, TOPIC, 0, state_epoch=4, start_offset=7)
    await client.read(group, TOPIC, 0, leader_epoch=2)
    await client.initialize(group, TOPIC, 0, state_epoch=4, start_offset=9)
    state = await client.admin_state(group, TOPIC, 0)
    assert state is not None
    assert (state.state_epoch, state.leader_epoch, state.start_offset) == (4, 0, 9)
    assert (state.fencing.state_epoch, state.fencing.leader_epoch) == (4, 2)
    assert state.snapshot_epoch == 1


async def test_find_coordinator_answers_per_key_with_errors_as_data(shared_daemon, clients):
    client = clients(shared_daemon.url)
    good, bad = await client.find_coordinator(["group1:AAAAAAAAAAAAAAAAAAAAAQ:0", "g:x"])
    # docs/semantics.md §1.3: this key belongs to state partition 20 of 50.
    assert (good.state_partition, good.node_id, good.error_code) == (20, 0, 0)
    assert (good.host, good.port) == ("127.0.0.1", shared_daemon.port)
    assert bad.error_code == 42
    assert (bad.state_partition, bad.node_id, bad.host, bad.port) == (-1, -1, "", -1)
    assert await client.find_coordinator([]) == []
