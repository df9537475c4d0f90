"""The client and a leader it cannot reach any more (docs/design.md#cluster-mode): on
the PostgreSQL store a dead node's state partitions move to another node, and nobody
answers 16 for them meanwhile, only connection errors. The client asks who leads now
after an owner it could not reach, instead of knocking on the dead node's door until
its deadline runs out. Real daemons on a real PostgreSQL server."""

from __future__ import annotations

import asyncio

from client import ACKNOWLEDGED, StateBatch
from protocol.routing import partition_for
from protocol.topic_id import canonical_topic_id
from tests.client.conftest import TOPIC
from tests.server.postgres_cluster import PARTITIONS, start_cluster

# Far longer than a takeover (a lease of 2 s), far shorter than the wait for ever the
# client would do without asking again: without the re-lookup the write below fails.
DEADLINE_S = 30.0


async def test_a_write_whose_leader_died_finds_the_new_leader(
    spawn, clients, group, tmp_path, postgres
):
    cluster = await start_cluster(spawn, tmp_path, postgres, 2, "--lease-ms", "2000")
    leaders = await asyncio.to_thread(cluster.leaders)
    partition = next(
        p
        for p in range(1000)
        if leaders[partition_for(group, canonical_topic_id(TOPIC), p, PARTITIONS)] == 0
    )
    client = clients(
        [node.url for node in cluster.nodes],
        num_partitions=PARTITIONS,
        deadline_s=DEADLINE_S,
        retry_backoff_ms=20,
        retry_backoff_max_ms=200,
    )

    async def write(offset: int) -> None:
        await client.write(
            group, TOPIC, partition, state_epoch=0, leader_epoch=0, start_offset=offset,
            state_batches=[StateBatch(offset, offset + 9, ACKNOWLEDGED, 1)],
        )  # fmt: skip

    await client.initialize(group, TOPIC, partition, state_epoch=0, start_offset=0)
    await write(10)  # node 0, the leader, is now the cached owner
    lookups = client.stats.coordinator_lookups
    await asyncio.to_thread(cluster.nodes[0].kill)
    await write(20)  # refused connections, then whoever leads now
    assert client.stats.coordinator_lookups > lookups
    state = await client.read(group, TOPIC, partition, leader_epoch=0)
    assert state.start_offset == 20
    assert [(b.first_offset, b.last_offset) for b in state.state_batches] == [(20, 29)]
    leaders_now = await asyncio.to_thread(cluster.leaders)
    assert set(leaders_now.values()) == {1}
