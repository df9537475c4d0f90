"""A node of a cluster on PostgreSQL SIGKILLed and started again at once with the same
``--node-id`` (as a service manager's restart does), while the leases of the process it
replaces are still live (docs/design.md#cluster-mode): the new process never loaded
those partitions, so it must not renew those leases as its own. They run out, it
claims them with a new epoch, loads them from PostgreSQL and serves every state
partition again, every acknowledged write there."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp

from tests.harness import TOPIC, AcknowledgedGroup, Api, Spawn, body, next_write, wait_until
from tests.postgres import PostgresServer
from tests.server.postgres_cluster import GROUP, PARTITIONS, SHARE_PARTITIONS, start_cluster


async def write_round(api: Api, model: AcknowledgedGroup, rng: random.Random) -> None:
    writes = {k: next_write(rng, k, model.exact(k)) for k in model.keys}
    entries = [entry for entry, _ in writes.values()]
    assert set(await api.codes("write", body(GROUP, (TOPIC, entries)))) == {0}
    for k, (_, expected) in writes.items():
        model.acknowledge(k, expected)


async def test_a_node_restarted_at_once_with_its_id_claims_and_serves_its_partitions_again(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    cluster = await start_cluster(spawn, tmp_path, postgres, 1, "--lease-ms", "3000")
    node = cluster.nodes[0]
    model = AcknowledgedGroup(GROUP, range(SHARE_PARTITIONS))
    rng = random.Random(29)
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
        await write_round(api, model, rng)
    before = await asyncio.to_thread(cluster.epochs)
    await asyncio.to_thread(node.kill)
    await asyncio.to_thread(node.start)  # at once: the old leases are live still
    await wait_until(
        lambda: asyncio.to_thread(cluster.epochs),
        "every state partition to be claimed anew (a higher epoch)",
        until=lambda epochs: all(epochs[p] > before[p] for p in range(PARTITIONS)),
    )
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        await model.check(api)
        await write_round(api, model, rng)
        await model.check(api)
