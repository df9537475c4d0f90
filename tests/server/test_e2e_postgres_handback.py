"""A cluster file on the PostgreSQL store is a preference (docs/design.md#cluster-mode):
a preferred node that comes back gets its state partitions back by a clean hand-over
(the old leader stops, then releases, then the preferred node claims), with real
daemons on a real PostgreSQL server and load from the client library."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.figures import Figures
from tests.harness import (
    TOPIC,
    Api,
    Spawn,
    body,
    cluster_file,
    free_ports,
    wait_until,
)
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer
from tests.server.postgres_cluster import (
    GROUP,
    PARTITIONS,
    Cluster,
    state_partition_of,
    writing,
)

# Node 1 leads the low half on its own first (sorted first, it would hand back the
# high half for balance alone): getting exactly 0-3 back is the preference at work.
PREFERENCE = ("0-3", "4-7")
PREFERRED = {p: 0 if p < 4 else 1 for p in range(PARTITIONS)}


async def test_a_preferred_node_that_comes_back_gets_its_partitions_by_a_clean_hand_over(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer, figures: Figures
) -> None:
    ports = free_ports(2)
    path = await asyncio.to_thread(
        cluster_file, tmp_path / "cluster.toml", ports, PREFERENCE, PARTITIONS
    )
    schema = fresh_schema()
    nodes = []
    for node_id, port in enumerate(ports):
        flags = ["--state-store", postgres.uri(), "--state-store-schema", schema]
        flags += ["--node-id", str(node_id), "--cluster", str(path), "--lease-ms", "2000"]
        listen = f"127.0.0.1:{port}"
        directory = tmp_path / f"node{node_id}"
        nodes.append(await spawn(directory, *flags, listen=listen, partitions=PARTITIONS))
    cluster = Cluster(postgres, schema, nodes)
    await wait_until(
        lambda: asyncio.to_thread(cluster.leaders),
        "each node to lead the partitions the cluster file prefers it for",
        until=lambda leaders: leaders == PREFERRED,
    )
    # A share-partition whose state partition node 0 prefers, watched on node 1.
    watched = next(p for p in range(1000) if PREFERRED[state_partition_of(p)] == 0)
    summary = body(GROUP, (TOPIC, [{"partition": watched, "leader_epoch": -1}]))
    async with writing(cluster) as writers, aiohttp.ClientSession() as session:
        to_node1 = Api(session, nodes[1].url)
        await wait_until(
            lambda: len(writers.written_at) == len(writers.model.keys),
            "every share-partition written",
        )
        await asyncio.to_thread(nodes[0].kill)
        await wait_until(
            lambda: asyncio.to_thread(cluster.leaders),
            "node 1 to lead every state partition",
            until=lambda leaders: set(leaders.values()) == {1} and len(leaders) == PARTITIONS,
        )
        await wait_until(
            lambda: to_node1.codes("read-summary", summary),
            "node 1 to serve what it took over",
            until=lambda codes: codes == [0],
        )
        epochs_before = await asyncio.to_thread(cluster.epochs)

        # Node 1's answers for the watched share-partition while node 0 comes back.
        answers: list[int] = []
        watching = True

        async def watch() -> None:
            while watching:
                answers.extend(await to_node1.codes("read-summary", summary))

        watcher = asyncio.create_task(watch())
        restarted_at = time.monotonic()
        await asyncio.to_thread(nodes[0].start)
        await wait_until(
            lambda: asyncio.to_thread(cluster.leaders),
            "node 0 to get back the partitions the cluster file prefers it for",
            until=lambda leaders: leaders == PREFERRED,
        )
        handed_back_s = time.monotonic() - restarted_at
        # Node 1 answers 16 for them from then on, and said it handed them back.
        await wait_until(
            lambda: len(answers) >= 3 and answers[-1] == 16, "node 1 to answer 16 a few times"
        )
        watching = False
        await watcher
        # Every share-partition is written again after the hand-over, through node 0
        # for the partitions it got back.
        resumed_at = time.monotonic()
        await wait_until(
            lambda: all(times[-1][0] > resumed_at for times in writers.written_at.values()),
            "every share-partition written after the hand-over",
        )
        await writers.stop()
        assert writers.failed == 0
        await writers.check()
    # A clean hand-over: once node 1 stopped answering for it, it never answered again
    # (not a single success after the first refusal), and node 0 claimed each partition
    # with a new epoch.
    first_refusal = next(i for i, code in enumerate(answers) if code != 0)
    assert set(answers[first_refusal:]) <= {14, 15, 16}, answers
    assert answers[-1] == 16
    epochs_after = await asyncio.to_thread(cluster.epochs)
    assert all(epochs_after[p] > epochs_before[p] for p in range(4))
    assert all(epochs_after[p] == epochs_before[p] for p in range(4, PARTITIONS))
    assert "handed back state partitions 0-3" in await asyncio.to_thread(nodes[1].stderr_text)
    figures.set("seconds_from_restart_to_hand_back", round(handed_back_s, 2))
    figures.set("answers_watched_on_the_old_leader", len(answers))
    figures.set("acknowledged_writes", sum(len(t) for t in writers.written_at.values()))
