"""Seeing a cluster on PostgreSQL (docs/api.md#admin-endpoints, ``GET
/v1/admin/cluster``; docs/api.md#cli, ``sharecoord cluster status``), and what a node on
that store refuses because the data directory alone keeps it (the topic catalog), with
real daemons on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness import TOPIC, Api, Spawn, run_cli, wait_until
from tests.postgres import PostgresServer
from tests.server.postgres_cluster import PARTITIONS, Cluster, start_cluster


async def cluster_answer(api: Api, fmt: str = "json") -> dict[str, Any]:
    media = {"json": "application/json", "msgpack": "application/msgpack"}[fmt]
    reply = await api.request("GET", "/v1/admin/cluster", headers={"Accept": media})
    assert reply.status == 200, reply.body
    assert reply.content_type == media
    body: dict[str, Any] = reply.body
    return body


def status(cluster: Cluster, *flags: str) -> tuple[int, str]:
    """``sharecoord cluster status`` on the cluster's store (blocking): its exit code and
    what it printed."""
    done = run_cli(
        "cluster", "status", "--state-store", cluster.server.uri(),
        "--state-store-schema", cluster.schema, "--lease-ms", "2000", *flags,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout


def led_by(answer: dict[str, Any]) -> dict[int, int]:
    return {p["state_partition"]: p["node_id"] for p in answer["partitions"] if p["live"]}


async def test_the_cluster_is_seen_from_any_node_and_from_its_tables_a_dead_node_too(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    cluster = await start_cluster(spawn, tmp_path, postgres, 2, "--lease-ms", "2000")
    leaders = await asyncio.to_thread(cluster.leaders)
    async with aiohttp.ClientSession() as session:
        apis = [Api(session, node.url) for node in cluster.nodes]
        # Whichever node is asked, in both encodings: the leaders table as it is.
        for api in apis:
            for fmt in ("json", "msgpack"):
                answer = await cluster_answer(api, fmt)
                assert answer["lease_ms"] == 2000
                assert answer["partitions_without_leader"] == 0
                assert [p["state_partition"] for p in answer["partitions"]] == list(
                    range(PARTITIONS)
                )
                assert led_by(answer) == leaders
                assert all(p["lease_remaining_ms"] > 0 for p in answer["partitions"])
                nodes = {n["node_id"]: n for n in answer["nodes"]}
                assert sorted(nodes) == [0, 1]
                for node_id, node in enumerate(cluster.nodes):
                    assert nodes[node_id]["live"]
                    assert f"http://{nodes[node_id]['http_listener']}" == node.url
        code, text = await asyncio.to_thread(status, cluster)
        assert code == 0, text
        assert "every one led" in text and "2 of 2 nodes live" in text
        code, text = await asyncio.to_thread(status, cluster, "--json")
        assert code == 0
        assert led_by(json.loads(text)) == leaders

        # Node 0 dies: node 1 says so (its heartbeat ages past the lease), and leads all.
        await asyncio.to_thread(cluster.nodes[0].kill)
        answer = await wait_until(
            lambda: cluster_answer(apis[1]),
            "node 1 to show node 0 dead and lead every state partition",
            until=lambda a: not a["nodes"][0]["live"] and set(led_by(a).values()) == {1}
            and len(led_by(a)) == PARTITIONS,
        )  # fmt: skip
        assert answer["nodes"][0]["heartbeat_age_ms"] >= 2000
        code, text = await asyncio.to_thread(status, cluster)
        assert code == 0, text
        assert "1 of 2 nodes live" in text
        node_rows = text.split("\nNODE ")[1].splitlines()[1:]
        assert [row.split()[0] for row in node_rows] == ["0", "1"], text
        assert "DEAD" in node_rows[0] and " ago" in node_rows[0], text
        assert "live" in node_rows[1] and node_rows[1].endswith(str(PARTITIONS)), text

    # Both dead: nobody leads, and the command says so first, with its own exit code.
    await asyncio.to_thread(cluster.nodes[1].kill)

    def unled() -> tuple[int, str]:
        return status(cluster)

    # Each partition's lease expires on its own (renewed at its own moment, and apart
    # from the node's heartbeat): the command exits 3 from the first one on, so wait for
    # the last.
    code, text = await wait_until(
        lambda: asyncio.to_thread(unled),
        "cluster status to see every lease expire",
        until=lambda found: f"{PARTITIONS} WITHOUT A LIVE LEADER" in found[1].splitlines()[0],
    )
    lines = text.splitlines()
    assert code == 3, text
    assert "0 of 2 nodes live" in lines[0]
    rows = [line for line in lines if "NO LEADER (expired" in line]
    assert len(rows) == PARTITIONS, text
    code, text = await asyncio.to_thread(status, cluster, "--json")
    assert code == 3
    assert json.loads(text)["partitions_without_leader"] == PARTITIONS
    # The setting from the environment, as serve takes it.
    done = await asyncio.to_thread(
        run_cli,
        "cluster",
        "status",
        "--state-store-schema",
        cluster.schema,
        env={"SHARECOORD_STATE_STORE": cluster.server.uri()},
    )
    assert done.returncode == 3, done.stderr


async def test_cluster_status_names_a_schema_no_node_started_on(postgres: PostgresServer) -> None:
    done = await asyncio.to_thread(
        run_cli, "cluster", "status", "--state-store", postgres.uri(),
        "--state-store-schema", "nobody_here",
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert "nobody_here holds no sharecoord tables" in line


async def test_a_node_on_the_data_directory_has_no_cluster_to_show(
    spawn: Spawn, tmp_path: Path
) -> None:
    node = await spawn(tmp_path / "local")
    async with aiohttp.ClientSession() as session:
        reply = await Api(session, node.url).request("GET", "/v1/admin/cluster")
    assert reply.status == 409
    assert reply.body["error_code"] == 42
    assert "data directory" in reply.body["error_message"]


async def test_a_node_on_postgres_keeps_no_topic_catalog_file(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    """PUT and DELETE /v1/admin/topics are refused (409) rather than writing a catalog
    file that no other node of the cluster reads."""
    cluster = await start_cluster(spawn, tmp_path, postgres, 1)
    node = cluster.nodes[0]
    async with aiohttp.ClientSession() as session:
        for fmt in ("json", "msgpack"):
            api = Api(session, node.url, fmt)
            put = await api.register_topic(TOPIC, 4)
            assert put.status == 409, put.body
            assert put.body["error_code"] == 42
            assert "PostgreSQL" in put.body["error_message"]
            deleted = await api.delete_topic(TOPIC)
            assert deleted.status == 409, deleted.body
    written = await asyncio.to_thread(lambda: list(tmp_path.rglob("topics.json")))
    assert not written
