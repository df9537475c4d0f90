"""Moving state between a data directory and a PostgreSQL store with ``sharecoord
partition export`` and ``import``
(docs/operations.md#moving-state-between-a-data-directory-and-postgresql), with real
daemons and the real commands: every key written
on one store reads back as it was from a node on the other, in both directions; an
export from a running node's store is taken while it serves; and an import into the
store is refused while a node leads the partition, refused over records that are not
the export's, and a no-op when they are.
"""

from __future__ import annotations

import asyncio
import random
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
from tests.postgres import PostgresServer
from tests.server.postgres_cluster import Cluster

NUM_PARTITIONS = 4
GROUP = "moving"
WRITES = 10  # per share-partition


def cli(*args: str) -> tuple[int, str, str]:
    done = run_cli(*args)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


async def fill(api: Api) -> AcknowledgedGroup:
    """Two share-partitions in each state partition, initialized and written WRITES
    times each, every write acknowledged."""
    keys = [
        k
        for p in range(NUM_PARTITIONS)
        for k in partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=2)
    ]
    model = AcknowledgedGroup(GROUP, keys)
    rng = random.Random(11)
    assert set(await api.codes("initialize", model.init_body())) == {0}
    await write_more(api, model, rng, WRITES)
    return model


async def write_more(api: Api, model: AcknowledgedGroup, rng: random.Random, rounds: int) -> None:
    for _ in range(rounds):
        writes = {k: next_write(rng, k, model.exact(k)) for k in model.keys}
        entries = [entry for entry, _ in writes.values()]
        assert set(await api.codes("write", body(GROUP, (TOPIC, entries)))) == {0}
        for k, (_, expected) in writes.items():
            model.acknowledge(k, expected)


async def node_on(spawn: Spawn, tmp_path: Path, server: PostgresServer, schema: str, name: str):
    node = await spawn(
        tmp_path / name,
        "--state-store", server.uri(), "--state-store-schema", schema, "--node-id", "0",
        partitions=NUM_PARTITIONS,
    )  # fmt: skip
    cluster = Cluster(server, schema, [node])
    await wait_until(
        lambda: asyncio.to_thread(cluster.leaders),
        "the node to lead every state partition",
        until=lambda leaders: leaders == dict.fromkeys(range(NUM_PARTITIONS), 0),
    )
    return node


def store_flags(server: PostgresServer, schema: str) -> list[str]:
    return ["--state-store", server.uri(), "--state-store-schema", schema]


async def test_a_data_directory_moves_into_a_postgresql_store_and_a_node_there_reads_it(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    data_dir = tmp_path / "data"
    local = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        model = await fill(Api(session, local.url))
    assert await asyncio.to_thread(local.terminate) == 0

    schema = fresh_schema()
    exports = tmp_path / "exports"
    await asyncio.to_thread(exports.mkdir)
    for p in range(NUM_PARTITIONS):
        code, _, err = await asyncio.to_thread(
            cli, "partition", "export", "--data-dir", str(data_dir), "--partition", str(p),
            "--out", str(exports / str(p)),
        )  # fmt: skip
        assert code == 0, err
        code, out, err = await asyncio.to_thread(
            cli,
            "partition",
            "import",
            *store_flags(postgres, schema),
            "--from",
            str(exports / str(p)),
        )
        assert code == 0, err
        assert f"imported state partition {p} into " in out
        assert ("(its tables created now)" in out) == (p == 0), out
    # Run again, it finds its work done.
    code, out, _ = await asyncio.to_thread(
        cli, "partition", "import", *store_flags(postgres, schema), "--from", str(exports / "0")
    )
    assert code == 0 and "already holds this export" in out, out
    code, out, _ = await asyncio.to_thread(cli, "log", "verify", *store_flags(postgres, schema))
    assert code == 0, out

    node = await node_on(spawn, tmp_path, postgres, schema, "node")
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        await model.check(api)
        # The node leads every partition: an import is refused in one line, and nothing
        # is written.
        code, _, err = await asyncio.to_thread(
            cli, "partition", "import", *store_flags(postgres, schema), "--from", str(exports / "1")
        )
        assert code == 1 and "live lease" in err and len(err.splitlines()) == 1, err
        await write_more(api, model, random.Random(3), 1)
    assert await asyncio.to_thread(node.terminate) == 0  # releases its leases
    # The store's partition 1 has moved on from the export: no import over it.
    code, _, err = await asyncio.to_thread(
        cli, "partition", "import", *store_flags(postgres, schema), "--from", str(exports / "1")
    )
    assert code == 1 and "already holds" in err and "never overwrites" in err, err
    node = await node_on(spawn, tmp_path, postgres, schema, "again")
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        await model.check(api)


async def test_a_postgresql_store_moves_into_a_data_directory_exported_while_it_serves(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer
) -> None:
    schema = fresh_schema()
    node = await node_on(spawn, tmp_path, postgres, schema, "node")
    exports = tmp_path / "exports"
    await asyncio.to_thread(exports.mkdir)
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        await api.wait_ready()
        model = await fill(api)
        # Exported while the node leads every partition and serves.
        for p in range(NUM_PARTITIONS):
            code, out, err = await asyncio.to_thread(
                cli, "partition", "export", *store_flags(postgres, schema), "--partition", str(p),
                "--out", str(exports / str(p)),
            )  # fmt: skip
            assert code == 0, err
            assert "the store still serves the partition" in out
        assert (await api.readyz()).status == 200
    assert await asyncio.to_thread(node.terminate) == 0

    data_dir = tmp_path / "data"
    for p in range(NUM_PARTITIONS):
        code, out, err = await asyncio.to_thread(
            cli, "partition", "import", "--data-dir", str(data_dir), "--node-id", "0",
            "--from", str(exports / str(p)),
        )  # fmt: skip
        assert code == 0, err
        # The export holds the store's records exactly: importing it back finds them.
        code, out, err = await asyncio.to_thread(
            cli,
            "partition",
            "import",
            *store_flags(postgres, schema),
            "--from",
            str(exports / str(p)),
        )
        assert code == 0 and "already holds this export" in out, out + err
    code, out, _ = await asyncio.to_thread(cli, "log", "verify", "--data-dir", str(data_dir))
    assert code == 0, out
    local = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        await model.check(Api(session, local.url))
