"""A cluster of real nodes (the harness) on real PostgreSQL servers (tests/postgres.py),
and writers that load it through the client library, for the tests of cluster mode
(docs/design.md#cluster-mode): tests/server/test_e2e_postgres_cluster.py (a node lost,
a zombie, the database away), test_e2e_postgres_failover.py (the primary lost) and the
reliability suite's crash loop on PostgreSQL.

``Cluster`` is the nodes and the server holding their store (the one to ask who leads:
a test that promotes a standby points it at the new primary); ``start_cluster`` starts
them on a schema of their own, on the server's URI or any other (libpq's multi-host
form); ``replicated`` is a primary with a synchronous standby; ``writing`` runs one
writer per share-partition through the client library while a test does harm, the
model of acknowledged state (tests/harness) keeping what was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from client import ShareCoordinatorClient
from protocol.routing import partition_for
from protocol.state_batch import StateBatch
from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    Daemon,
    Spawn,
    metric_value,
    next_write,
    wait_until,
)
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer, server_root

PARTITIONS = 8
GROUP = "cluster-group"
SHARE_PARTITIONS = 24  # spread over the 8 state partitions


def state_partition_of(partition: int) -> int:
    return partition_for(GROUP, TOPIC, partition, PARTITIONS)


@dataclass
class Cluster:
    server: PostgresServer
    schema: str
    nodes: list[Daemon]

    def leaders(self) -> dict[int, int]:
        """{state partition: node id} of the live leases (blocking)."""
        rows = self.server.execute(
            f"SELECT state_partition, node_id FROM {self.schema}.sharecoord_leaders "
            "WHERE lease_expiry > clock_timestamp()"
        )
        return {int(p): int(n) for p, n in (line.split("|") for line in rows.splitlines())}

    def epochs(self) -> dict[int, int]:
        rows = self.server.execute(
            f"SELECT state_partition, epoch FROM {self.schema}.sharecoord_leaders"
        )
        return {int(p): int(e) for p, e in (line.split("|") for line in rows.splitlines())}

    async def wait_led(self, *, by: set[int] | None = None) -> dict[int, int]:
        """Until every state partition has a live leader (among ``by``), each node
        holding some when there are enough partitions."""

        def balanced(leaders: dict[int, int]) -> bool:
            alive = by if by is not None else {i for i, _ in enumerate(self.nodes)}
            return len(leaders) == PARTITIONS and set(leaders.values()) == alive

        return await wait_until(
            lambda: asyncio.to_thread(self.leaders),
            "every state partition to have a live leader",
            until=balanced,
        )


async def start_cluster(
    spawn: Spawn,
    tmp_path: Path,
    server: PostgresServer,
    count: int,
    *flags: str,
    uri: str | None = None,
) -> Cluster:
    """``count`` nodes (ids 0, 1, ...) on ``uri`` (the server's own unless told), once
    every state partition has a live leader and each node leads some."""
    schema = fresh_schema()
    nodes = []
    for node_id in range(count):
        nodes.append(
            await spawn(
                tmp_path / f"node{node_id}",
                "--state-store",
                uri or server.uri(),
                "--state-store-schema",
                schema,
                "--node-id",
                str(node_id),
                *flags,
                partitions=PARTITIONS,
            )
        )
    cluster = Cluster(server, schema, nodes)
    await cluster.wait_led()
    return cluster


@contextlib.asynccontextmanager
async def own_server(name: str) -> AsyncIterator[PostgresServer]:
    """A PostgreSQL server of the test's own, for one it kills or freezes."""
    directory = server_root()
    root = await asyncio.to_thread(directory.__enter__)
    try:
        server = await asyncio.to_thread(PostgresServer.primary, root, name)
        try:
            yield server
        finally:
            await asyncio.to_thread(server.destroy)
    finally:
        await asyncio.to_thread(directory.__exit__, None, None, None)


@contextlib.asynccontextmanager
async def replicated(name: str) -> AsyncIterator[tuple[PostgresServer, PostgresServer]]:
    """A primary and its synchronous standby, of the test's own (it kills and promotes)."""
    directory = server_root()
    root = await asyncio.to_thread(directory.__enter__)
    servers: list[PostgresServer] = []
    try:
        servers.append(await asyncio.to_thread(PostgresServer.primary, root, f"{name}-0"))
        standby = await asyncio.to_thread(servers[0].standby, f"{name}-1", synchronous=True)
        servers.append(standby)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            await asyncio.to_thread(server.destroy)
        await asyncio.to_thread(directory.__exit__, None, None, None)


@dataclass
class Writers:
    """One writer per share-partition, each awaiting its write before the next (the
    client's at-least-once rule), all through the client library; the model keeps what
    was acknowledged, and when each share-partition was last written."""

    client: ShareCoordinatorClient
    model: AcknowledgedGroup
    rng: random.Random = field(default_factory=lambda: random.Random(23))
    # Each acknowledged write's (sent, answered) times, per share-partition.
    written_at: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    failed: int = 0
    running: bool = True
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self.tasks)

    async def run(self, partition: int) -> None:
        while self.running:
            entry, expected = next_write(self.rng, partition, self.model.exact(partition))
            sent = time.monotonic()
            try:
                await self.client.write(
                    GROUP,
                    TOPIC,
                    partition,
                    state_epoch=-1,
                    leader_epoch=-1,
                    start_offset=entry["start_offset"],
                    state_batches=[StateBatch(*b.values()) for b in entry["state_batches"]],
                    delivery_complete_count=entry["delivery_complete_count"],
                )
            except Exception:
                # Not acknowledged: it may or may not have been applied.
                self.model.unanswered(partition, expected)
                self.failed += 1
                self.running = False
                raise
            self.model.acknowledge(partition, expected)
            self.written_at.setdefault(partition, []).append((sent, time.monotonic()))

    def written_again(self, since: float, partitions: set[int]) -> dict[int, float]:
        """For each of ``partitions`` written by a write sent after ``since``, the
        seconds from ``since`` to the answer of the first such write."""
        return {
            p: next(done for sent, done in self.written_at[p] if sent > since) - since
            for p in partitions
            if self.written_at.get(p) and self.written_at[p][-1][0] > since
        }

    async def wait_written_again(self, since: float, partitions: set[int]) -> dict[int, float]:
        """Until every one of ``partitions`` was written again (``written_again``)."""
        return await wait_until(
            lambda: self.written_again(since, partitions),
            f"{len(partitions)} share-partitions to be written again",
            until=lambda found: len(found) == len(partitions),
        )

    async def check(self) -> None:
        """Every share-partition shows what was acknowledged (through its leader now)."""
        shown = {}
        for partition in self.model.keys:
            state = await self.client.admin_state(GROUP, TOPIC, partition)
            shown[partition] = None if state is None else _as_dict(state)
        wrong = self.model.mismatches(shown)
        assert not wrong, "\n".join(wrong)


def _as_dict(state: object) -> dict[str, object]:
    return {
        "start_offset": state.start_offset,  # type: ignore[attr-defined]
        "state_batches": [
            {
                "first_offset": b.first_offset,
                "last_offset": b.last_offset,
                "delivery_state": b.delivery_state,
                "delivery_count": b.delivery_count,
            }
            for b in state.state_batches  # type: ignore[attr-defined]
        ],
        "delivery_complete_count": state.delivery_complete_count,  # type: ignore[attr-defined]
    }


@contextlib.asynccontextmanager
async def writing(cluster: Cluster) -> AsyncIterator[Writers]:
    bootstrap = [node.url for node in cluster.nodes]
    async with ShareCoordinatorClient(
        bootstrap, num_partitions=PARTITIONS, deadline_s=60.0, retry_backoff_max_ms=200
    ) as client:
        model = AcknowledgedGroup(GROUP, range(SHARE_PARTITIONS))
        api = Api(aiohttp.ClientSession(), cluster.nodes[0].url)
        try:
            # Each share-partition initialized, through whichever node leads it.
            for partition in model.keys:
                await client.initialize(GROUP, TOPIC, partition, state_epoch=1, start_offset=0)
        finally:
            await api.session.close()
        writers = Writers(client, model)
        writers.tasks = [asyncio.create_task(writers.run(p)) for p in model.keys]
        try:
            yield writers
        finally:
            await writers.stop()


async def check_on_a_fresh_node(
    spawn: Spawn, tmp_path: Path, cluster: Cluster, model: AcknowledgedGroup, uri: str
) -> None:
    """Every node stopped (SIGTERM: each releases its leases), a node that never ran
    before leads every state partition alone, so that it read each from PostgreSQL: it
    shows what was acknowledged (the model of acknowledged state)."""
    for node in cluster.nodes:
        await asyncio.to_thread(node.stop)
    fresh_id = 100
    fresh = await spawn(
        tmp_path / "fresh",
        "--state-store",
        uri,
        "--state-store-schema",
        cluster.schema,
        "--node-id",
        str(fresh_id),
        partitions=PARTITIONS,
    )
    await wait_until(
        lambda: asyncio.to_thread(cluster.leaders),
        "the fresh node to lead every state partition",
        until=lambda leaders: len(leaders) == PARTITIONS and set(leaders.values()) == {fresh_id},
    )
    async with aiohttp.ClientSession() as session:
        api = Api(session, fresh.url)

        async def led() -> float:
            return metric_value(await api.metrics(), "sharecoord_partitions_led")

        # The node itself counts every partition as led (it builds a runtime for each
        # as it counts it), and /readyz is 200 once every partition it leads is loaded:
        # the table alone says claimed, not loaded.
        await wait_until(
            led, "the fresh node to count every partition led", until=lambda n: n == PARTITIONS
        )
        await api.wait_ready()
        await model.check(api)
    await asyncio.to_thread(fresh.terminate)
