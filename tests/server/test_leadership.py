"""server/leadership.py on a real PostgreSQL store, its clock in the test's hands: how
long a node may answer for a partition, and what a round does with a lease it lost."""

from __future__ import annotations

import asyncio

from persistence.postgres import PostgresStore, leases
from server.leadership import Leadership
from tests.persistence.stores import fresh_schema

LEASE_MS = 3000


class Host:
    """The node's side, recorded."""

    def __init__(self) -> None:
        self.adopted: list[int] = []
        self.dropped: list[int] = []

    def adopt(self, partition: int) -> None:
        self.adopted.append(partition)

    async def drop(self, partition: int) -> None:
        self.dropped.append(partition)

    def adopting(self) -> bool:
        return False


async def leadership_on(
    postgres, clock: list[float], schema: str | None = None
) -> tuple[Leadership, Host, PostgresStore]:
    store = await asyncio.to_thread(
        PostgresStore.open, postgres.uri(), 4, 1, schema=schema or fresh_schema(), timeout_ms=2000
    )
    host = Host()
    return Leadership(store, host, lease_ms=LEASE_MS, monotonic=lambda: clock[0]), host, store


async def test_a_node_stops_answering_before_its_lease_can_have_expired(postgres):
    clock = [1000.0]
    leadership, host, store = await leadership_on(postgres, clock)
    try:
        await leadership._round()  # alone: it claims every partition
        assert leadership.led == [0, 1, 2, 3] == sorted(host.adopted)
        assert all(leadership.may_serve(p) for p in range(4))
        # The lease runs LEASE_MS from when PostgreSQL ran the claim, after it was sent:
        # the node stops short of that, by its own clock, with no round in between.
        clock[0] += LEASE_MS / 1000 * 0.85
        assert all(leadership.may_serve(p) for p in range(4))
        clock[0] += LEASE_MS / 1000 * 0.1
        assert not any(leadership.may_serve(p) for p in range(4))
    finally:
        await asyncio.to_thread(store.close)


async def test_a_round_drops_a_partition_another_node_claimed(postgres):
    clock = [1000.0]
    leadership, host, store = await leadership_on(postgres, clock)
    try:
        await leadership._round()

        def steal() -> int | None:
            with store.connection("test") as conn:
                conn.execute(
                    store.tables.sql(
                        "UPDATE {leaders} SET lease_expiry = NULL WHERE state_partition = 2"
                    )
                )
                return leases.claim(conn, store.tables, 2, 7, LEASE_MS)

        assert await asyncio.to_thread(steal) is not None
        await leadership._round()
        assert 2 not in leadership.led and not leadership.may_serve(2)
        await asyncio.sleep(0)  # the drop's task
        await leadership.stop()
        assert host.dropped == [2]
        assert store.held_epoch(2) is None  # a commit carrying it is fenced
    finally:
        await asyncio.to_thread(store.close)


async def test_a_node_restarted_within_its_lease_leads_its_partitions_again(postgres):
    """The first run's leases are still live when the second run's first round renews
    them: it must serve them again (under a new epoch), not renew them for nobody."""
    clock = [1000.0]
    schema = fresh_schema()
    first, _, first_store = await leadership_on(postgres, clock, schema)
    try:
        await first._round()
        epochs = {p: first_store.held_epoch(p) for p in range(4)}
    finally:
        await asyncio.to_thread(first_store.close)  # SIGKILL-like: no release
    again, host, store = await leadership_on(postgres, clock, schema)
    try:
        await again._round()
        assert again.led == [0, 1, 2, 3] == sorted(host.adopted)
        for p in range(4):
            epoch = store.held_epoch(p)
            assert epoch is not None and epoch > epochs[p]
    finally:
        await asyncio.to_thread(store.close)


async def test_a_partition_dropped_while_its_lease_lived_on_is_claimed_again(postgres):
    """A drop by the node's own deadline (or a refused commit) can leave PostgreSQL's
    lease live; the next renewal must not keep it for a node that no longer serves it."""
    clock = [1000.0]
    leadership, host, store = await leadership_on(postgres, clock)
    try:
        await leadership._round()
        leadership.lost(1, RuntimeError("test"))
        assert not leadership.may_serve(1)
        await asyncio.sleep(0)  # the drop's task
        dropped_epoch = leadership._store.held_epoch(1)
        assert dropped_epoch is None
        await leadership._round()
        assert leadership.may_serve(1)
        assert host.adopted.count(1) == 2
    finally:
        await leadership.stop()
        await asyncio.to_thread(store.close)
