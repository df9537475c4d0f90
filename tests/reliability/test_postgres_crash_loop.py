"""Issue 23, acceptance 6: the crash loop of cluster mode on PostgreSQL. Acknowledged
writes are never lost, and nothing never acknowledged appears, across SIGKILLs of nodes
and of the PostgreSQL primary.

Three nodes (``--lease-ms 2000``) on libpq's multi-host URI of a primary and its
synchronous standby, under load from the client library (one writer per share-partition,
tests/server/postgres_cluster.py), the model of acknowledged state (tests/harness)
keeping what was acknowledged. Each round, a random moment into the load, either

* a random node is SIGKILLed and started again on the same id once every share-partition
  was written again without it, or
* the primary is SIGKILLed and the standby promoted (``pg_ctl promote``); a new
  synchronous standby is made from the promoted primary with pg_basebackup, listening
  where the dead primary did, so that the URI names both again and the next kill of the
  primary again has a synchronous standby to promote.

Each round ends once every share-partition was written again after the kill. At the end
every node stops, and a node that never ran reads every share-partition back from the
last primary: it must show exactly what was acknowledged.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tests.figures import Figures
from tests.harness import Spawn, wait_until
from tests.postgres import PostgresServer, multi_host_uri
from tests.server.postgres_cluster import (
    SHARE_PARTITIONS,
    check_on_a_fresh_node,
    replicated,
    start_cluster,
    writing,
)

NODES = 3
LEASE_MS = "2000"


async def promote_and_replace(
    primary: PostgresServer, standby: PostgresServer, name: str
) -> tuple[PostgresServer, PostgresServer, float]:
    """SIGKILL ``primary``, promote ``standby``, and make a synchronous standby of it
    where ``primary`` listened. The new (primary, standby), and promote's seconds."""
    await asyncio.to_thread(primary.kill)
    promote_s = await asyncio.to_thread(standby.promote)
    await asyncio.to_thread(primary.remove)
    replacement = await asyncio.to_thread(
        standby.standby, name, synchronous=True, port=primary.port
    )
    return standby, replacement, promote_s


async def postgres_crash_loop(
    spawn: Spawn,
    tmp_path: Path,
    figures: Figures,
    *,
    node_kills: int,
    primary_kills: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    rounds = ["node"] * node_kills + ["primary"] * primary_kills
    rng.shuffle(rounds)
    slowest = {"node": 0.0, "primary": 0.0}
    promotes: list[float] = []
    async with replicated("loop") as (first_primary, first_standby):
        primary, standby = first_primary, first_standby
        # replicated() destroys the servers it made; the ones made here are kept too.
        made: list[PostgresServer] = []
        uri = multi_host_uri(primary, standby)
        cluster = await start_cluster(
            spawn, tmp_path, primary, NODES, "--lease-ms", LEASE_MS, uri=uri
        )
        try:
            async with writing(cluster) as writers:
                everything = set(writers.model.keys)
                await wait_until(
                    lambda: len(writers.written_at) == SHARE_PARTITIONS,
                    "every share-partition written",
                )
                for number, what in enumerate(rounds):
                    # A random moment into the load: some writes answered since the last
                    # round, a random fraction of a second more.
                    await asyncio.sleep(rng.random() * 0.5)
                    started = time.monotonic()
                    if what == "node":
                        victim = cluster.nodes[rng.randrange(NODES)]
                        await asyncio.to_thread(victim.kill)
                    else:
                        primary, standby, promote_s = await promote_and_replace(
                            primary, standby, f"loop-{number + 2}"
                        )
                        made.append(standby)
                        cluster.server = primary
                        promotes.append(promote_s)
                    found = await writers.wait_written_again(started, everything)
                    slowest[what] = max(slowest[what], *found.values())
                    if what == "node":
                        await asyncio.to_thread(victim.start)
                    figures.add(f"{what}_kills")
                await writers.stop()
                assert writers.failed == 0
            await check_on_a_fresh_node(spawn, tmp_path, cluster, writers.model, uri)
        finally:
            for server in made:
                await asyncio.to_thread(server.destroy)
    figures.set("acknowledged_writes", sum(len(t) for t in writers.written_at.values()))
    figures.set("acknowledged_writes_lost", 0)
    figures.set("slowest_rewrite_after_node_kill_s", round(slowest["node"], 2))
    figures.set("slowest_rewrite_after_primary_kill_s", round(slowest["primary"], 2))
    if promotes:
        figures.set("slowest_promote_s", round(max(promotes), 2))


async def test_postgres_crash_loop_loses_nothing_acknowledged(spawn, tmp_path, figures):
    await postgres_crash_loop(spawn, tmp_path, figures, node_kills=2, primary_kills=1, seed=1)


@pytest.mark.slow
async def test_postgres_crash_loop_long(spawn, tmp_path, figures):
    await postgres_crash_loop(spawn, tmp_path, figures, node_kills=100, primary_kills=10, seed=2)
