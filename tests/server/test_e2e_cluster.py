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
from tests.server.daemons import (
    TOPIC,
    TOPIC_RFC4122,
    Api,
    Daemon,
    DaemonExited,
    body,
    free_port,
    init_entry,
    part,
    partitions_in,
    read_entry,
    write_entry,
)

NUM_PARTITIONS = 8
OWNED = {0: "0-3", 1: "4-7"}
GROUP = "cluster"
MSG_NOT_COORDINATOR = "This is not the correct coordinator."


def write_cluster_file(path: Path, ports: dict[int, int]) -> None:
    nodes = "".join(
        textwrap.dedent(
            f"""
            [[node]]
            id = {node}
            host = "127.0.0.1"
            port = {ports[node]}
            partitions = ["{OWNED[node]}"]
            """
        )
        for node in (0, 1)
    )
    path.write_text(f"num_partitions = {NUM_PARTITIONS}\n{nodes}")


@pytest.fixture
async def cluster(spawn, tmp_path) -> dict[int, Daemon]:
    """Nodes 0 and 1, each on its own data directory and a port named in the file."""
    for _ in range(5):  # a port taken between choosing and binding it: choose again
        ports = {0: free_port(), 1: free_port()}
        if ports[0] == ports[1]:
            continue
        cluster_file = tmp_path / "cluster.toml"
        await asyncio.to_thread(write_cluster_file, cluster_file, ports)
        try:
            return {
                node: await spawn(
                    tmp_path / f"node{node}",
                    "--node-id",
                    str(node),
                    "--cluster",
                    str(cluster_file),
                    listen=f"127.0.0.1:{ports[node]}",
                    partitions=NUM_PARTITIONS,
                )
                for node in (0, 1)
            }
        except DaemonExited as exc:
            if "address already in use" not in exc.stderr.lower():
                raise
    pytest.fail("no two free ports for the cluster")


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


async def test_the_node_find_coordinator_names_is_the_one_that_serves_the_key(cluster):
    """find-coordinator parses and hashes the key string; the RPCs route the request's
    fields. Both must agree, also for group ids beyond ASCII (UTF-16 hashing) and a
    topic id sent in its RFC 4122 spelling."""
    async with aiohttp.ClientSession() as session:
        apis = {node: Api(session, daemon.url) for node, daemon in cluster.items()}
        for group in ("cluster", "größe", "\U0001f600-group", "g:with:colons"):
            keys = [f"{group}:{TOPIC}:{p}" for p in range(6)]
            reply = await apis[1].post("/v1/find-coordinator", {"keys": keys})
            owners = [c["node_id"] for c in reply.body["coordinators"]]
            if ":" in group:  # not a key Kafka can parse: 42 for each
                assert {c["error_code"] for c in reply.body["coordinators"]} == {42}
                continue
            for node, api in apis.items():
                entries = [init_entry(p, 1, 0) for p in range(6)]
                answer = await api.rpc("initialize", body(group, (TOPIC_RFC4122, entries)))
                codes = [r["error_code"] for r in answer["results"][0]["partitions"]]
                assert codes == [0 if owner == node else 16 for owner in owners], (group, node)
