"""Routing across a cluster of two real daemons (docs/api.md#the-cluster-file,
find-coordinator): the client, given one node, sends each key to the owner of its state
partition, caches owners, and recovers when an owner it cached is no longer one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from client import (
    ConfigurationError,
    DeadlineExceeded,
    InitializePartition,
    UnknownTopicOrPartition,
)
from client.retry import Failure
from client.routing import Router
from protocol import errors
from protocol.routing import partition_for
from protocol.topic_id import canonical_topic_id
from tests.client.conftest import TOPIC, entry_results, request_ended
from tests.harness import Daemon, DaemonConfig, cluster_file, free_ports, run_cli

NUM_PARTITIONS = 50
HALVES = ("0-24", "25-49")


def owner_of(group: str, partition: int, topic_id: str = TOPIC) -> int:
    """The node of the two that owns the key, by the cluster file's halves."""
    state_partition = partition_for(group, canonical_topic_id(topic_id), partition, NUM_PARTITIONS)
    return 0 if state_partition < 25 else 1


def start_cluster(
    directory: Path, ranges: Sequence[str] = HALVES, args: Sequence[str] = ()
) -> list[Daemon]:
    ports = free_ports(len(ranges))
    path = cluster_file(directory / "cluster.toml", ports, ranges, NUM_PARTITIONS)
    nodes = [
        Daemon(
            DaemonConfig(
                directory / f"node{i}",
                ("--node-id", str(i), "--cluster", str(path), *args),
                listen=f"127.0.0.1:{port}",
                partitions=None,  # the cluster file's
            )
        )
        for i, port in enumerate(ports)
    ]
    for node in nodes:
        node.start(ready=False)
    for node in nodes:
        node.wait_ready()
    return nodes


def restart_cluster(nodes: list[Daemon], directory: Path, ranges: Sequence[str]) -> None:
    """Stop both nodes, hand the state partitions out anew, start them where they were.
    The partitions change hands without their state (nobody wrote any): each node adopts
    its new ones, or it would refuse them (docs/operations.md#moving-a-state-partition)."""
    for node in nodes:
        node.stop()
    cluster_file(directory / "cluster.toml", [n.port for n in nodes], ranges, NUM_PARTITIONS)
    for node, owned in zip(nodes, ranges, strict=True):
        args = ("partition", "adopt", "--data-dir", str(node.data_dir), "--partition", owned)
        done = run_cli(*args)
        assert done.returncode == 0, done.stderr
    for node in nodes:
        node.start(ready=False)
    for node in nodes:
        node.wait_ready()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Daemon]]:
    nodes = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[list[Daemon], Path]]:
    """A cluster this test may restart or reconfigure."""
    nodes: list[Daemon] = []
    try:
        yield nodes, tmp_path
    finally:
        for node in nodes:
            node.stop()


async def test_each_key_goes_to_its_owner_when_bootstrapped_with_one_node(cluster, clients, group):
    client = clients(cluster[0].url)
    partitions = range(100)
    owners = [owner_of(group, p) for p in partitions]
    assert set(owners) == {0, 1}
    before = [await entry_results(node, "initialize", 0) for node in cluster]
    refused_before = [await entry_results(node, "initialize", 16) for node in cluster]
    await asyncio.gather(
        *(client.initialize(group, TOPIC, p, state_epoch=0, start_offset=p) for p in partitions)
    )
    states = await asyncio.gather(
        *(client.read(group, TOPIC, p, leader_epoch=0) for p in partitions)
    )
    assert [s.start_offset for s in states] == list(partitions)
    for node_id, node in enumerate(cluster):
        initialized = await entry_results(node, "initialize", 0) - before[node_id]
        assert initialized == owners.count(node_id)
        assert await entry_results(node, "initialize", 16) == refused_before[node_id]
    assert client.stats.not_coordinator == 0


async def test_owners_are_learned_once_and_cached(cluster, clients, group):
    client = clients(cluster[1].url)
    await client.initialize_many(group, [(TOPIC, InitializePartition(p, 0, 0)) for p in range(200)])
    # Every state partition these keys need, looked up together in one request.
    assert client.stats.coordinator_lookups == 1
    await asyncio.gather(*(client.read_summary(group, TOPIC, p) for p in range(200)))
    await client.read(group, TOPIC, 7, leader_epoch=0)
    assert client.stats.coordinator_lookups == 1


async def test_a_stale_owner_answers_16_and_the_client_finds_the_new_one(
    own_cluster, clients, group
):
    nodes, directory = own_cluster
    nodes += await asyncio.to_thread(start_cluster, directory)
    client = clients(nodes[0].url)
    key = next(p for p in range(100) if owner_of(group, p) == 0)
    await client.read_summary(group, TOPIC, key)  # caches node 0 as the owner
    await asyncio.to_thread(restart_cluster, nodes, directory, ("25-49", "0-24"))
    lookups = client.stats.coordinator_lookups
    await client.initialize(group, TOPIC, key, state_epoch=0, start_offset=5)
    assert client.stats.not_coordinator == 1
    assert client.stats.coordinator_lookups == lookups + 1
    assert await entry_results(nodes[0], "initialize", 16) == 1
    assert await entry_results(nodes[1], "initialize", 0) == 1
    state = await client.admin_state(group, TOPIC, key)
    assert state is not None
    assert state.start_offset == 5


async def test_catalog_calls_fan_out_to_every_node(own_cluster, clients, group):
    nodes, directory = own_cluster
    nodes += await asyncio.to_thread(start_cluster, directory, HALVES, ["--topic-catalog"])
    # 3 is retriable (metadata may just be late): retried to the deadline, then told,
    # even when the deadline cuts the last attempt short.
    client = clients(nodes[0].url, deadline_s=3)
    keys = [next(p for p in range(100) if owner_of(group, p) == n) for n in (0, 1)]
    with pytest.raises(DeadlineExceeded) as info:
        await client.initialize(group, TOPIC, keys[1], state_epoch=0, start_offset=0)
    assert isinstance(info.value.last_error, UnknownTopicOrPartition)

    await client.register_topic(TOPIC, 100)
    for key in keys:
        await client.initialize(group, TOPIC, key, state_epoch=0, start_offset=0)
    assert [await entry_results(node, "initialize", 0) for node in nodes] == [1, 1]

    assert await client.delete_topic(TOPIC) == 2  # one share-partition on each node
    for key in keys:
        assert await client.admin_state(group, TOPIC, key) is None
    with pytest.raises(UnknownTopicOrPartition, match="not in the topic catalog of any node"):
        await client.delete_topic(TOPIC)


async def test_a_registration_arriving_late_lets_a_retrying_call_through(
    own_cluster, clients, group
):
    """3 is retriable (docs/semantics.md §12) because metadata can lag: the call waits for it."""
    nodes, directory = own_cluster
    nodes += await asyncio.to_thread(start_cluster, directory, HALVES, ["--topic-catalog"])
    tracer, answered = request_ended("/share-group-state/initialize")
    client = clients(nodes[1].url, deadline_s=30, trace_configs=[tracer])
    call = asyncio.ensure_future(client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=3))
    await answered.wait()
    await client.register_topic(TOPIC, 1)
    await call
    assert (await client.read_summary(group, TOPIC, 0)).start_offset == 3
    assert client.stats.retries >= 1
    assert await entry_results(nodes[owner_of(group, 0)], "initialize", 3) >= 1


async def test_a_client_counting_other_state_partitions_is_refused(shared_daemon, clients, group):
    client = clients(shared_daemon.url, num_partitions=NUM_PARTITIONS - 1)
    with pytest.raises(ConfigurationError, match="set num_partitions to the daemons'"):
        await client.read_summary(group, TOPIC, 0)


async def test_a_dead_bootstrap_node_is_skipped(shared_daemon, clients, group):
    [dead] = free_ports(1)
    client = clients([f"127.0.0.1:{dead}", shared_daemon.url])
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=11)
    assert (await client.read_summary(group, TOPIC, 0)).start_offset == 11
    assert client.stats.coordinator_lookups == 2  # the dead one, then the live one


async def test_a_lookup_out_of_time_says_why_the_lookup_before_failed():
    """A call that runs out of time while its owner is being looked up again ends with
    the reason the previous lookup failed, not only with "no answer in time"."""
    refused = Failure(
        errors.COORDINATOR_NOT_AVAILABLE, "request to http://node-a:9095 failed: refused", True
    )
    never = asyncio.Event()
    calls = 0

    async def find(url: str, keys: list[str]) -> Failure:
        nonlocal calls
        calls += 1
        if calls > 1:
            await never.wait()  # the second lookup gets no answer in time
        return refused

    router = Router(["http://node-a:9095"], 3, find, max_keys_per_request=10)
    try:
        assert await router.owners([2], timeout=5) == {2: refused}
        [late] = (await router.owners([2], timeout=0.05)).values()
        assert isinstance(late, Failure)
        assert late.code == errors.COORDINATOR_NOT_AVAILABLE and late.retriable
        assert "no find-coordinator answer for state partition 2 within the deadline" in (
            late.message
        )
        assert refused.message in late.message
    finally:
        await router.close()
