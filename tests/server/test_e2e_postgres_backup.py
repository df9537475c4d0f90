"""The backup of a PostgreSQL store as docs/operations.md#backing-up-a-postgresql-store
gives it: ``pg_dump`` of a store while a node runs and writes to it, ``pg_restore`` into
a fresh database, the leases ended (and the epochs raised) as the restore step says,
then a node on the restored store reads back every write acknowledged before the dump
began, and ``log verify`` finds the restored store whole although the dump ran under
writes (pg_dump reads one snapshot; a commit cycle is one transaction)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
from pathlib import Path

import aiohttp

from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    Spawn,
    body,
    next_write,
    partitions_in,
    run_cli,
    wait_until,
)
from tests.persistence.stores import fresh_schema
from tests.postgres import QUERY_TIMEOUT_S, PostgresServer, find_bin_dir

NUM_PARTITIONS = 4
GROUP = "backed-up"
BUSY_GROUP = "busy"  # written throughout the dump


def pg_tool(program: str, *args: str) -> None:
    subprocess.run(
        [os.path.join(find_bin_dir(), program), *args],
        check=True,
        capture_output=True,
        timeout=QUERY_TIMEOUT_S * 4,
    )


async def node_on(spawn: Spawn, tmp_path: Path, uri: str, server: PostgresServer, schema: str):
    """A node on ``uri`` (a database of ``server``), once it leads every state
    partition."""
    node = await spawn(
        tmp_path,
        "--state-store", uri, "--state-store-schema", schema, "--node-id", "0",
        partitions=NUM_PARTITIONS,
    )  # fmt: skip
    dbname = uri.rsplit("/", 1)[1]

    def leaders() -> dict[int, int]:
        rows = server.execute(
            f"SELECT state_partition, node_id FROM {schema}.sharecoord_leaders "
            "WHERE lease_expiry > clock_timestamp()",
            dbname,
        )
        return {int(p): int(n) for p, n in (line.split("|") for line in rows.splitlines())}

    await wait_until(
        lambda: asyncio.to_thread(leaders),
        "the node to lead every state partition",
        until=lambda found: found == dict.fromkeys(range(NUM_PARTITIONS), 0),
    )
    return node


async def test_a_pg_dump_taken_under_writes_restores_every_acknowledged_write(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    schema = fresh_schema()
    node = await node_on(spawn, tmp_path / "node", postgres.uri(), postgres, schema)
    keys = [
        k for p in range(NUM_PARTITIONS) for k in partitions_in(p, NUM_PARTITIONS, group_id=GROUP)
    ]
    model = AcknowledgedGroup(GROUP, keys)
    busy = AcknowledgedGroup(BUSY_GROUP, range(8))
    rng = random.Random(17)
    dump = str(tmp_path / "sharecoord.dump")
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        assert set(await api.codes("initialize", model.init_body())) == {0}
        assert set(await api.codes("initialize", busy.init_body())) == {0}
        for _ in range(10):
            writes = {k: next_write(rng, k, model.exact(k)) for k in model.keys}
            entries = [entry for entry, _ in writes.values()]
            assert set(await api.codes("write", body(GROUP, (TOPIC, entries)))) == {0}
            for k, (_, expected) in writes.items():
                model.acknowledge(k, expected)

        done = asyncio.Event()

        async def keep_writing() -> int:
            written = 0
            while not done.is_set():
                k = rng.choice(busy.keys)
                entry, expected = next_write(rng, k, busy.exact(k))
                assert await api.codes("write", body(BUSY_GROUP, (TOPIC, [entry]))) == [0]
                busy.acknowledge(k, expected)
                written += 1
            return written

        writer = asyncio.create_task(keep_writing())
        # The dump, as the backup step gives it, with the node leading and writing.
        await asyncio.to_thread(
            pg_tool, "pg_dump", "--format=custom", "--schema", schema, "--file", dump,
            "--dbname", postgres.uri(),
        )  # fmt: skip
        done.set()
        assert await writer > 0
    assert await asyncio.to_thread(node.terminate) == 0

    # The restore: a fresh database, the dump in it, the leases ended and epochs raised.
    restored_db = f"restored_{schema}"
    await asyncio.to_thread(postgres.execute, f"CREATE DATABASE {restored_db}")
    restored = postgres.uri(restored_db)
    await asyncio.to_thread(pg_tool, "pg_restore", "--dbname", restored, dump)
    await asyncio.to_thread(
        postgres.execute,
        f"UPDATE {schema}.sharecoord_leaders SET lease_expiry = NULL, epoch = epoch + 1",
        restored_db,
    )
    verify = await asyncio.to_thread(
        run_cli, "log", "verify", "--state-store", restored, "--state-store-schema", schema
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr

    node = await node_on(spawn, tmp_path / "restored", restored, postgres, schema)
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        await model.check(api)
