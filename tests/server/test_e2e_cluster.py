"""Two daemons on loopback sharing a cluster file (docs/api.md#find-coordinator and
docs/api.md#the-cluster-file; docs/design.md#growing-past-one-machine).

Each owns half of the state partitions: an entry for a key the other owns answers 16 in
its result while the owned ones in the same request succeed; find-coordinator answers
the same on both nodes; admin state on the wrong node names the owner.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import aiohttp
import pytest

from protocol.routing import partition_for
from tests.harness import (
    TOPIC,
    TOPIC_RFC4122,
    Api,
    Daemon,
    DaemonExited,
    body,
    free_ports,
    init_entry,
    part,
    partitions_in,
    read_entry,
    write_entry,
)
from tests.kafka_client import KafkaClient, kafka_address, message_class

NUM_PARTITIONS = 8
OWNED = {0: "0-3", 1: "4-7"}
GROUP = "cluster"
MSG_NOT_COORDINATOR = "This is not the correct coordinator."


def write_cluster_file(
    path: Path,
    ports: dict[int, int],
    kafka_ports: dict[int, int] | None = None,
    owned: dict[int, str] = OWNED,
) -> None:
    nodes = "".join(
        textwrap.dedent(
            f"""
            [[node]]
            id = {node}
            host = "127.0.0.1"
            port = {ports[node]}
            partitions = ["{owned[node]}"]
            """
        )
        + (f"kafka_port = {kafka_ports[node]}\n" if kafka_ports else "")
        for node in (0, 1)
    )
    last = int(owned[1].rpartition("-")[2])
    path.write_text(f"num_partitions = {last + 1}\n{nodes}")


async def start_cluster(
    spawn, tmp_path: Path, *, kafka: bool, owned: dict[int, str] = OWNED
) -> dict[int, Daemon]:
    """Nodes 0 and 1 owning the ``owned`` ranges (node 1 the last), each on its own data
    directory and the ports named in the file (with ``kafka``, each with a Kafka listener
    at its ``kafka_port`` too)."""
    for _ in range(5):  # a port taken between choosing and binding it: choose again
        chosen = free_ports(4 if kafka else 2)
        ports = {0: chosen[0], 1: chosen[1]}
        kafka_ports = {0: chosen[2], 1: chosen[3]} if kafka else {}
        cluster_file = tmp_path / "cluster.toml"
        await asyncio.to_thread(write_cluster_file, cluster_file, ports, kafka_ports, owned)
        try:
            return {
                node: await spawn(
                    tmp_path / f"node{node}",
                    "--node-id",
                    str(node),
                    "--cluster",
                    str(cluster_file),
                    *(("--kafka-listener", f"127.0.0.1:{kafka_ports[node]}") if kafka else ()),
                    listen=f"127.0.0.1:{ports[node]}",
                    partitions=int(owned[1].rpartition("-")[2]) + 1,
                )
                for node in (0, 1)
            }
        except DaemonExited as exc:
            if "address already in use" not in exc.stderr.lower():
                raise
    pytest.fail("no free ports for the cluster")


@pytest.fixture
async def cluster(spawn, tmp_path) -> dict[int, Daemon]:
    return await start_cluster(spawn, tmp_path, kafka=False)


def owner(partition: int) -> int:
    return 0 if partition_for(GROUP, TOPIC, partition, NUM_PARTITIONS) < 4 else 1


async def test_entries_for_the_other_nodes_partitions_answer_16(cluster, fmt):
    on_node0 = partitions_in(1, NUM_PARTITIONS, group_id=GROUP, count=2)
    on_node1 = partitions_in(6, NUM_PARTITIONS, group_id=GROUP, count=2)
    entries = [on_node0[0], on_node1[0], on_node0[1], on_node1[1]]
    async with aiohttp.ClientSession() as session:
        apis = {node: Api(session, daemon.url, fmt) for node, daemon in cluster.items()}
        for node, api in apis.items():
            results = await api.results(
                "initialize", body(GROUP, (TOPIC, [init_entry(p, 1, 0) for p in entries]))
            )
            for partition, result in zip(entries, results, strict=True):
                assert result["partition"] == partition
                if owner(partition) == node:
                    assert (result["error_code"], result["error_message"]) == (0, None)
                else:
                    assert result == {
                        "partition": partition,
                        "error_code": 16,
                        "error_message": MSG_NOT_COORDINATOR,
                    }
        # Every RPC, with its error result's defaults.
        expected_defaults = {
            "read": {"state_epoch": 0, "start_offset": 0, "state_batches": []},
            "read-summary": {
                "state_epoch": 0,
                "leader_epoch": 0,
                "start_offset": 0,
                "delivery_complete_count": -1,
            },
        }
        for rpc, make in (
            ("read", lambda p: read_entry(p, 1)),
            ("write", lambda p: write_entry(p, state_epoch=1, leader_epoch=1)),
            ("read-summary", read_entry),
            ("delete", part),
        ):
            results = await apis[0].results(rpc, body(GROUP, (TOPIC, [make(p) for p in entries])))
            assert [r["error_code"] for r in results] == [0, 16, 0, 16], rpc
            for result in results[1::2]:
                for name, value in expected_defaults.get(rpc, {}).items():
                    assert result[name] == value, (rpc, result)
        # Node 0 deleted its keys; node 1's are still there, on node 1 only.
        for partition in on_node1:
            assert await apis[1].state(GROUP, TOPIC, partition) is not None
        for partition in on_node0:
            assert await apis[0].state(GROUP, TOPIC, partition) is None


async def test_find_coordinator_answers_for_any_key_on_any_node(cluster, fmt):
    keys = [f"{GROUP}:{TOPIC}:{p}" for p in range(12)] + ["g:nope:1", "", f"{GROUP}:{TOPIC}:1:2"]
    async with aiohttp.ClientSession() as session:
        answers = []
        for daemon in cluster.values():
            reply = await Api(session, daemon.url, fmt).post("/v1/find-coordinator", {"keys": keys})
            assert reply.status == 200
            answers.append(reply.body["coordinators"])
    assert answers[0] == answers[1]
    for p, coordinator in enumerate(answers[0][:12]):
        state_partition = partition_for(GROUP, TOPIC, p, NUM_PARTITIONS)
        node = owner(p)
        assert coordinator == {
            "key": keys[p],
            "state_partition": state_partition,
            "node_id": node,
            "host": "127.0.0.1",
            "port": cluster[node].port,
            "error_code": 0,
            "error_message": None,
        }
    assert {c["node_id"] for c in answers[0][:12]} == {0, 1}
    for bad in answers[0][12:]:
        assert (bad["error_code"], bad["state_partition"], bad["node_id"]) == (42, -1, -1)
        assert (bad["host"], bad["port"]) == ("", -1)


async def test_admin_state_on_the_wrong_node_names_the_owner(cluster):
    partition = partitions_in(5, NUM_PARTITIONS, group_id=GROUP)[0]
    async with aiohttp.ClientSession() as session:
        right = Api(session, cluster[1].url)
        wrong = Api(session, cluster[0].url)
        await right.rpc("initialize", body(GROUP, (TOPIC, [init_entry(partition, 1, 0)])))
        assert await right.state(GROUP, TOPIC, partition) is not None
        reply = await wrong.admin_state(GROUP, TOPIC, partition)
        assert reply.status == 421
        assert reply.body["error_code"] == 16
        message = reply.body["error_message"]
        assert "node 1" in message
        assert f"127.0.0.1:{cluster[1].port}" in message
        # Each node lists only its own state partitions.
        for node, daemon in cluster.items():
            listing = await Api(session, daemon.url).request("GET", "/v1/admin/partitions")
            expected = [0, 1, 2, 3] if node == 0 else [4, 5, 6, 7]
            assert [p["partition"] for p in listing.body["partitions"]] == expected


# Group ids whose key strings are odd but valid: padding that a trim would drop, a ``:``
# that a split from the left would take for the separator, beyond ASCII (UTF-16 hashing).
ODD_GROUPS = (
    "cluster",
    " orders-group",
    "orders-group ",
    "\torders-group\n",
    "g:with:colons",
    ":",
    "ends-with-colon:",
    "größe",
    "\U0001f600-group",
)
KEY_PARTITIONS = range(6)
# Kafka's default of 50 state partitions: with a power of two up to 32, a leading
# character adds a multiple of the count to the hash and never moves a key.
HALVES_OF_50 = {0: "0-24", 1: "25-49"}


def test_a_trimmed_group_id_would_route_elsewhere():
    """What the two tests below catch: the finding's group id hashes to another node
    than its trimmed self for some of their keys."""
    node = {p: 0 if p < 25 else 1 for p in range(50)}
    moved = [
        p
        for p in KEY_PARTITIONS
        if node[partition_for(" orders-group", TOPIC, p, 50)]
        != node[partition_for("orders-group", TOPIC, p, 50)]
    ]
    assert moved


async def test_the_node_find_coordinator_names_is_the_one_that_serves_the_key(spawn, tmp_path):
    """find-coordinator parses and hashes the key string; the RPCs route the request's
    fields. Both must agree for every group id a key can carry, also with the topic id
    sent in its RFC 4122 spelling."""
    cluster = await start_cluster(spawn, tmp_path, kafka=False, owned=HALVES_OF_50)
    async with aiohttp.ClientSession() as session:
        apis = {node: Api(session, daemon.url) for node, daemon in cluster.items()}
        for group in ODD_GROUPS:
            keys = [f"{group}:{TOPIC}:{p}" for p in KEY_PARTITIONS]
            reply = await apis[1].post("/v1/find-coordinator", {"keys": keys})
            found = reply.body["coordinators"]
            assert {c["error_code"] for c in found} == {0}, (group, found)
            for node, api in apis.items():
                entries = [init_entry(p, 1, 0) for p in KEY_PARTITIONS]
                answer = await api.rpc("initialize", body(group, (TOPIC_RFC4122, entries)))
                codes = [r["error_code"] for r in answer["results"][0]["partitions"]]
                assert codes == [0 if c["node_id"] == node else 16 for c in found], (group, node)
                for c in found:
                    if c["node_id"] == node:
                        assert c["port"] == cluster[node].port


async def test_the_kafka_listeners_findcoordinator_names_the_node_that_serves_the_key(
    spawn, tmp_path
):
    """The same over Kafka's protocol: FindCoordinator v6 on one node names the node
    (and its Kafka listener) whose InitializeShareGroupState answers 0, the other 16."""
    nodes = await start_cluster(spawn, tmp_path, kafka=True, owned=HALVES_OF_50)
    listeners = {node: kafka_address(daemon.stdout_lines) for node, daemon in nodes.items()}
    clients = {node: await KafkaClient.connect(*address) for node, address in listeners.items()}
    find = message_class("find_coordinator", 6, "request")
    try:
        for group in ODD_GROUPS:
            keys = tuple(f"{group}:{TOPIC}:{p}" for p in KEY_PARTITIONS)
            found = (await clients[1].send(find(key_type=2, coordinator_keys=keys))).coordinators
            assert {int(c.error_code) for c in found} == {0}, (group, found)
            for node, client in clients.items():
                entries = [init_entry(p, 1, 0) for p in KEY_PARTITIONS]
                answer = await client.rpc("initialize", body(group, (TOPIC, entries)))
                codes = [r["error_code"] for r in answer["results"][0]["partitions"]]
                assert codes == [0 if c.node_id == node else 16 for c in found], (group, node)
                for c in found:
                    if c.node_id == node:
                        assert (c.host, c.port) == listeners[node]
    finally:
        for client in clients.values():
            await client.close()
