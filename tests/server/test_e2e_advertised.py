"""What find-coordinator names for a node (docs/api.md#find-coordinator): the listen
address, this machine's host name for a wildcard listen host, the
``--advertised-listener`` when given; and a listen port that disagrees with the cluster
file stops the start in one line."""

from __future__ import annotations

import asyncio
import socket
import textwrap

import aiohttp

from tests.harness import TOPIC, Api, free_port, run_cli

KEY = f"g:{TOPIC}:3"


async def coordinator(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as session:
        reply = await Api(session, url).post("/v1/find-coordinator", {"keys": [KEY]})
    assert reply.status == 200, reply.body
    (answer,) = reply.body["coordinators"]
    return answer  # type: ignore[no-any-return]


async def test_a_wildcard_listen_host_is_advertised_by_host_name(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data", listen="0.0.0.0:0")
    answer = await coordinator(f"http://127.0.0.1:{daemon.port}")
    assert (answer["host"], answer["port"]) == (socket.gethostname(), daemon.port)
    assert answer["host"] != "0.0.0.0"


async def test_the_advertised_listener_is_what_find_coordinator_names(spawn, tmp_path):
    daemon = await spawn(
        tmp_path / "data", "--advertised-listener", "coord-7.example:19095", "--node-id", "7"
    )
    answer = await coordinator(daemon.url)
    assert (answer["node_id"], answer["host"], answer["port"]) == (7, "coord-7.example", 19095)


async def test_a_listen_port_the_cluster_file_does_not_name_is_refused(tmp_path):
    cluster = tmp_path / "cluster.toml"
    port = free_port()
    text = f"""
        num_partitions = 2
        [[node]]
        id = 0
        host = "127.0.0.1"
        port = {port}
        partitions = ["0-1"]
        """
    await asyncio.to_thread(cluster.write_text, textwrap.dedent(text))
    done = await asyncio.to_thread(
        run_cli,
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--partitions",
        "2",
        "--cluster",
        str(cluster),
        "--listen",
        f"127.0.0.1:{port + 1}",
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert f"has port {port + 1}" in line
    assert f"node 0 is reached at 127.0.0.1:{port}" in line
    assert not await asyncio.to_thread((tmp_path / "data").exists)
