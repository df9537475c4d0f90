"""The PostgreSQL store across the loss of its primary: a primary with a synchronous
standby, the store given libpq's multi-host URI; commits go on in a loop, the primary is
SIGKILLed, the standby promoted. Every commit acknowledged before the kill is on the
promoted standby, and the same URI reaches it: commits go on there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from persistence import GroupCommitter, LogRecord
from persistence.errors import StoreUnavailableError
from persistence.postgres import PostgresStore
from tests.figures import Figures
from tests.harness import wait_until
from tests.persistence.log_helpers import append_records
from tests.persistence.stores import postgres_opener
from tests.postgres import PostgresServer, running_servers, server_root

PARTITIONS = 4
BEFORE_KILL = 300  # records acknowledged before the primary dies
AFTER_PROMOTE = 100  # and after the promoted standby took over
RESET_TIMEOUT_S = 120  # a safety net, not a timing assertion


@pytest.fixture
def replicated() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    with server_root() as root, running_servers() as servers:
        primary = PostgresServer.primary(root)
        servers.append(primary)
        servers.append(primary.standby(synchronous=True))
        yield primary, servers[1]


def port_of(store: PostgresStore) -> int:
    """The port of the server the store's connections reach now."""
    with store.connection("test") as conn:
        row = conn.execute("SELECT current_setting('port')").fetchone()
    assert row is not None
    return int(row[0])


async def reset_when_reachable(store: PostgresStore, partitions: list[int]) -> None:
    """Reset each failed partition, trying again until the store can be reached."""
    for p in partitions:

        async def reset(p: int = p) -> bool:
            try:
                await asyncio.to_thread(store.partition(p).reset_to_durable)
            except StoreUnavailableError:
                return False
            return True

        await wait_until(reset, f"the store to take partition {p}'s reset", timeout=RESET_TIMEOUT_S)


async def test_what_was_acknowledged_survives_the_primary_on_the_promoted_standby(
    replicated: tuple[PostgresServer, PostgresServer], figures: Figures
) -> None:
    primary, standby = replicated
    uri = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        "?target_session_attrs=read-write&connect_timeout=5"
    )
    opener = postgres_opener(uri, PARTITIONS)
    store: Any = await asyncio.to_thread(opener.open)
    committer = GroupCommitter(store)
    committer.start()
    acked: dict[tuple[int, int], LogRecord] = {}
    failed_cycles = 0
    killed_at: float | None = None
    first_after_kill: float | None = None
    promote_s = 0.0
    first = 0
    deadline = time.monotonic() + RESET_TIMEOUT_S  # a safety net for the whole run
    try:
        while len(acked) < BEFORE_KILL + AFTER_PROMOTE or killed_at is None:
            assert time.monotonic() < deadline, f"only {len(acked)} records acknowledged"
            if killed_at is None and len(acked) >= BEFORE_KILL:
                await asyncio.to_thread(primary.kill)
                killed_at = time.monotonic()
                promote_s = await asyncio.to_thread(standby.promote)
            batch = {p: append_records(store.partition(p), 5, first) for p in range(PARTITIONS)}
            first += 5
            barrier = committer.wait_durable_many({p: r[-1].offset for p, r in batch.items()})
            failed = await barrier.future
            for p, records in batch.items():
                if p not in failed:
                    acked.update(((p, r.offset), r) for r in records)
            if failed:
                failed_cycles += 1
                assert killed_at is not None, f"a commit failed before the kill: {failed}"
                await reset_when_reachable(store, sorted(failed))
            elif killed_at is not None and first_after_kill is None:
                first_after_kill = time.monotonic() - killed_at
        assert await asyncio.to_thread(port_of, store) == standby.port  # the URI reached it
    finally:
        await committer.close()
        opener.close_all()
    # Read back from the promoted standby alone.
    survivor = await asyncio.to_thread(
        PostgresStore.open, standby.uri(), PARTITIONS, 9, schema=store.tables.schema
    )
    try:
        found = {}
        for p in range(PARTITIONS):
            records = await asyncio.to_thread(lambda p=p: list(survivor.partition(p).read()))
            found.update(((p, r.offset), r) for r in records)
    finally:
        await asyncio.to_thread(survivor.close)
    missing = [key for key, record in acked.items() if found.get(key) != record]
    assert not missing, f"{len(missing)} acknowledged records lost or changed"
    assert failed_cycles >= 1  # the kill was met by a commit
    figures.set("acknowledged", len(acked))
    figures.set("on_promoted_standby", len(acked) - len(missing))
    figures.set("failed_cycles", failed_cycles)
    figures.set("promote_s", round(promote_s, 2))
    figures.set("kill_to_next_commit_s", round(first_after_kill or 0.0, 2))
