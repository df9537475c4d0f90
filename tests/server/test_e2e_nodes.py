"""State partitions on disk across cluster file changes
(docs/operations.md#moving-a-state-partition): two daemons, a cluster file that moves a
partition from node 0 to node 1, the refusal while its state has not moved, then
`sharecoord partition export` and `import` and the same state served by the new owner;
and a data directory made before OWNER files, upgraded in place."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.harness import (
    TOPIC,
    Api,
    Daemon,
    batch,
    body,
    free_ports,
    init_entry,
    partitions_in,
    read_entry,
    run_cli,
    write_entry,
)
from tests.planted_history import history_of, plant_history
from tests.tree_listing import tree_listing

N = 8
BEFORE = {0: "0-3", 1: "4-7"}
AFTER = {0: "0-1, 3", 1: "2, 4-7"}  # state partition 2 moves from node 0 to node 1
MOVED, STAYS = 2, 5
GROUP = "nodes"


def cluster_file(path: Path, ports: dict[int, int], ranges: dict[int, str]) -> Path:
    def entries(text: str) -> str:  # "0-1, 3" as ["0-1", 3]
        items = (r.strip() for r in text.split(","))
        return ", ".join(f'"{r}"' if "-" in r else r for r in items)

    nodes = "".join(
        textwrap.dedent(
            f"""
            [[node]]
            id = {node}
            host = "127.0.0.1"
            port = {ports[node]}
            partitions = [{entries(ranges[node])}]
            """
        )
        for node in sorted(ranges)
    )
    path.write_text(f"num_partitions = {N}\n{nodes}")
    return path


async def start(
    spawn: Any, tmp_path: Path, node: int, port: int, cluster: Path, *flags: str
) -> Daemon:
    daemon: Daemon = await spawn(
        tmp_path / f"node{node}",
        "--node-id",
        str(node),
        "--cluster",
        str(cluster),
        *flags,
        listen=f"127.0.0.1:{port}",
        partitions=N,
    )
    return daemon


async def stop(*daemons: Daemon) -> None:
    for daemon in daemons:
        assert await asyncio.to_thread(daemon.terminate) == 0, daemon.stderr_text()


async def write_state(api: Api, partitions: list[int]) -> None:
    await api.rpc("initialize", body(GROUP, (TOPIC, [init_entry(p, 1, 10) for p in partitions])))
    # A leader of epoch 4 takes over (a read moves the leader fence), then writes.
    reads = body(GROUP, (TOPIC, [read_entry(p, 4) for p in partitions]))
    assert set(await api.codes("read", reads)) == {0}
    writes = [
        write_entry(p, batch(10, 19, 2, 1), batch(20, 24, 1, 3), state_epoch=1, leader_epoch=4)
        for p in partitions
    ]
    assert set(await api.codes("write", body(GROUP, (TOPIC, writes)))) == {0}


async def states(api: Api, partitions: list[int]) -> list[Any]:
    return [await api.state(GROUP, TOPIC, p) for p in partitions]


async def stored_on_node0(
    spawn: Any, tmp_path: Path, ports: dict[int, int], keys: list[int]
) -> list[Any]:
    """Node 0, with the cluster file before the move, writes the keys' state and stops;
    returns the states it served."""
    before = await asyncio.to_thread(cluster_file, tmp_path / "before.toml", ports, BEFORE)
    async with aiohttp.ClientSession() as session:
        node0 = await start(spawn, tmp_path, 0, ports[0], before)
        api = Api(session, node0.url)
        await write_state(api, keys)
        served = await states(api, keys)
        await stop(node0)
    return served


async def cli(*args: str) -> Any:
    return await asyncio.to_thread(run_cli, *args)


@pytest.fixture
def ports() -> dict[int, int]:
    return dict(enumerate(free_ports(2)))


async def test_a_moved_partition_is_refused_until_its_state_is_imported(spawn, tmp_path, ports):
    moved = partitions_in(MOVED, N, group_id=GROUP, count=3)
    stays = partitions_in(STAYS, N, group_id=GROUP, count=2)
    before = await asyncio.to_thread(cluster_file, tmp_path / "before.toml", ports, BEFORE)
    after = tmp_path / "after.toml"
    async with aiohttp.ClientSession() as session:
        nodes = {n: await start(spawn, tmp_path, n, ports[n], before) for n in (0, 1)}
        await write_state(Api(session, nodes[0].url), moved)
        await write_state(Api(session, nodes[1].url), stays)
        expected = await states(Api(session, nodes[0].url), moved)
        expected_stays = await states(Api(session, nodes[1].url), stays)
        assert all(s is not None for s in expected + expected_stays)
        await stop(*nodes.values())

        # The cluster file moves partition 2; nobody moved its state.
        await asyncio.to_thread(cluster_file, after, ports, AFTER)
        nodes = {n: await start(spawn, tmp_path, n, ports[n], after) for n in (0, 1)}
        new_owner, old_owner = Api(session, nodes[1].url), Api(session, nodes[0].url)
        ready = await new_owner.readyz()
        assert ready.status == 200
        assert ready.body["failed_partitions"] == [MOVED]
        (failure,) = ready.body["failures"]
        assert failure["partition"] == MOVED
        assert "its state is on node 0" in failure["error"]
        listing = await new_owner.request("GET", "/v1/admin/partitions")
        (row,) = [p for p in listing.body["partitions"] if p["partition"] == MOVED]
        assert row["status"] == "failed"
        assert "moved to this node in the cluster file" in row["error"]
        codes = await new_owner.codes(
            "read", body(GROUP, (TOPIC, [read_entry(p, 5) for p in moved]))
        )
        assert codes == [15, 15, 15]  # not 42 "uninitialized": nobody re-initializes it
        assert await states(new_owner, stays) == expected_stays  # the others serve
        codes = await old_owner.codes(
            "read", body(GROUP, (TOPIC, [read_entry(p, 5) for p in moved]))
        )
        assert codes == [16, 16, 16]
        moved_dir = tmp_path / "node1" / "partitions" / str(MOVED)
        assert not await asyncio.to_thread(os.path.exists, moved_dir)
        await stop(*nodes.values())

        # Move it: export from node 0, import on node 1 (both stopped).
        out = tmp_path / "moved-2"
        done = await cli(
            "partition", "export", "--data-dir", str(tmp_path / "node0"),
            "--partition", str(MOVED), "--out", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"exported state partition {MOVED}" in done.stdout
        verify = await cli("log", "verify", "--data-dir", str(tmp_path / "node0"))
        assert verify.returncode == 0, verify.stdout
        done = await cli(
            "partition", "import", "--data-dir", str(tmp_path / "node1"), "--from", str(out)
        )
        assert done.returncode == 0, done.stderr
        assert f"imported state partition {MOVED}" in done.stdout
        assert "for node 1" in done.stdout
        verify = await cli("log", "verify", "--data-dir", str(tmp_path / "node1"))
        assert verify.returncode == 0, verify.stdout
        nodes = {n: await start(spawn, tmp_path, n, ports[n], after) for n in (0, 1)}
        new_owner = Api(session, nodes[1].url)
        ready = await new_owner.readyz()
        assert (ready.status, ready.body["failed_partitions"]) == (200, [])
        assert await states(new_owner, moved) == expected  # the same state, fences included
        assert await states(new_owner, stays) == expected_stays
        # And it goes on from there: a leader of an older epoch is still fenced.
        codes = await new_owner.codes("read", body(GROUP, (TOPIC, [read_entry(moved[0], 3)])))
        assert codes == [74]
        write = write_entry(moved[0], batch(25, 29, 2, 1), state_epoch=1, leader_epoch=4)
        assert await new_owner.codes("write", body(GROUP, (TOPIC, [write]))) == [0]
        await stop(*nodes.values())

        # Node 0 handed it over: given it back without an import, it refuses.
        alone = await asyncio.to_thread(cluster_file, tmp_path / "back.toml", ports, BEFORE)
        node0 = await start(spawn, tmp_path, 0, ports[0], alone)
        ready = await Api(session, node0.url).readyz()
        assert ready.body["failed_partitions"] == [MOVED]
        assert "was exported from this node" in ready.body["failures"][0]["error"]
        await stop(node0)


async def test_import_refuses_a_target_that_holds_the_partition(spawn, tmp_path, ports):
    moved = partitions_in(MOVED, N, group_id=GROUP, count=1)
    await stored_on_node0(spawn, tmp_path, ports, moved)
    out = tmp_path / "export"
    args = ["--data-dir", str(tmp_path / "node0")]
    done = await cli("partition", "export", *args, "--partition", str(MOVED), "--out", str(out))
    assert done.returncode == 0, done.stderr
    # Imported back where it came from: that directory still holds its records.
    before = await asyncio.to_thread(tree_listing, tmp_path / "node0")
    done = await cli("partition", "import", *args, "--from", str(out))
    assert done.returncode == 1
    assert "already holds records" in done.stderr
    assert await asyncio.to_thread(tree_listing, tmp_path / "node0") == before
    # A damaged export is refused before anything is touched.
    await asyncio.to_thread(flip_a_byte, out, 40)
    fresh = tmp_path / "fresh"
    done = await cli("partition", "import", "--data-dir", str(fresh), "--from", str(out),
                     "--node-id", "1")  # fmt: skip
    assert done.returncode == 1
    assert "is damaged" in done.stderr
    assert "CRC-32" in done.stderr
    assert not await asyncio.to_thread(fresh.exists)


async def failure_of(api: Api, partition: int) -> str:
    """Why /readyz and /v1/admin/partitions say `partition` failed (they must agree)."""
    ready = await api.readyz()
    assert ready.status == 200, ready.body  # the other partitions serve
    assert ready.body["failed_partitions"] == [partition]
    (failure,) = ready.body["failures"]
    listing = await api.request("GET", "/v1/admin/partitions")
    (row,) = [p for p in listing.body["partitions"] if p["partition"] == partition]
    assert row["status"] == "failed"
    assert row["error"] == failure["error"]
    return str(row["error"])


async def test_after_a_cluster_change_a_copied_or_missing_directory_is_refused(
    spawn, tmp_path, ports
):
    """A cluster file change, and on disk: the moved partition's directory copied by
    hand from its old node (OWNER names node 0), and a directory node 0 still owns gone
    (a lost disk, a wrong rm). Neither node serves them empty: each says why."""
    lost = 0
    moved = partitions_in(MOVED, N, group_id=GROUP, count=2)
    gone = partitions_in(lost, N, group_id=GROUP, count=2)
    stays = partitions_in(STAYS, N, group_id=GROUP, count=1)
    before = await asyncio.to_thread(cluster_file, tmp_path / "before.toml", ports, BEFORE)
    after = await asyncio.to_thread(cluster_file, tmp_path / "after.toml", ports, AFTER)
    async with aiohttp.ClientSession() as session:
        nodes = {n: await start(spawn, tmp_path, n, ports[n], before) for n in (0, 1)}
        await write_state(Api(session, nodes[0].url), moved + gone)
        await write_state(Api(session, nodes[1].url), stays)
        expected_stays = await states(Api(session, nodes[1].url), stays)
        await stop(*nodes.values())

        def rearrange() -> None:
            shutil.copytree(
                tmp_path / "node0" / "partitions" / str(MOVED),
                tmp_path / "node1" / "partitions" / str(MOVED),
            )
            shutil.rmtree(tmp_path / "node0" / "partitions" / str(lost))

        await asyncio.to_thread(rearrange)
        nodes = {n: await start(spawn, tmp_path, n, ports[n], after) for n in (0, 1)}
        node0, node1 = Api(session, nodes[0].url), Api(session, nodes[1].url)

        error = await failure_of(node1, MOVED)
        assert "was created by node 0, not by this node" in error
        assert "sharecoord partition export" in error
        error = await failure_of(node0, lost)
        assert "is missing" in error and "this node held it" in error
        # 15 (retry elsewhere / later), never 42: no leader re-initializes from nothing.
        reads = body(GROUP, (TOPIC, [read_entry(p, 5) for p in moved]))
        assert await node1.codes("read", reads) == [15, 15]
        reads = body(GROUP, (TOPIC, [read_entry(p, 5) for p in gone]))
        assert await node0.codes("read", reads) == [15, 15]
        assert await states(node1, stays) == expected_stays
        await stop(*nodes.values())
    # Refused, not recreated: the missing directory stays missing.
    assert not await asyncio.to_thread((tmp_path / "node0" / "partitions" / str(lost)).exists)


async def test_import_refuses_while_the_targets_journal_holds_records_of_the_partition(
    spawn, tmp_path, ports
):
    """Node 1 crashes while partition 5's newest records are only in its journal (no
    checkpoint yet), and its directory is moved aside to import a copy from elsewhere.
    The import would start partition 5's CHECKPOINT entry past those records: it refuses
    until a clean stop has written them; then the import's state is what node 1 serves."""
    keys = partitions_in(STAYS, N, group_id=GROUP, count=2)
    before = await asyncio.to_thread(cluster_file, tmp_path / "before.toml", ports, BEFORE)
    no_checkpoint = ("--journal-checkpoint-interval-ms", "3600000")
    target = tmp_path / "node1"
    directory, aside = target / "partitions" / str(STAYS), tmp_path / "aside"
    out = tmp_path / "export"
    async with aiohttp.ClientSession() as session:
        node1 = await start(spawn, tmp_path, 1, ports[1], before, *no_checkpoint)
        await write_state(Api(session, node1.url), keys)
        await asyncio.to_thread(node1.kill)

        # The copy to import: the same keys, one more write, on a standalone daemon.
        source = await spawn(tmp_path / "source", partitions=N)
        api = Api(session, source.url)
        await write_state(api, keys)
        write = write_entry(keys[0], batch(25, 29, 2, 1), state_epoch=1, leader_epoch=4)
        assert await api.codes("write", body(GROUP, (TOPIC, [write]))) == [0]
        expected = await states(api, keys)
        await stop(source)
        args = ["--data-dir", str(tmp_path / "source"), "--partition", str(STAYS)]
        done = await cli("partition", "export", *args, "--out", str(out))
        assert done.returncode == 0, done.stderr

        await asyncio.to_thread(os.rename, directory, aside)
        listing = await asyncio.to_thread(tree_listing, target)
        done = await cli("partition", "import", "--data-dir", str(target), "--from", str(out))
        assert done.returncode == 1, done.stdout
        (error,) = done.stderr.strip().splitlines()  # found before anything was opened
        assert f"still holds records of state partition {STAYS}" in error
        assert await asyncio.to_thread(tree_listing, target) == listing  # not a byte changed

        # A clean stop writes them (and its checkpoint lets the journal's copy go).
        await asyncio.to_thread(os.rename, aside, directory)
        node1 = await start(spawn, tmp_path, 1, ports[1], before)
        await stop(node1)
        await asyncio.to_thread(os.rename, directory, aside)
        done = await cli("partition", "import", "--data-dir", str(target), "--from", str(out))
        assert done.returncode == 0, done.stderr

        node1 = await start(spawn, tmp_path, 1, ports[1], before)
        api = Api(session, node1.url)
        ready = await api.readyz()
        assert (ready.status, ready.body["failed_partitions"]) == (200, [])
        assert await states(api, keys) == expected
        await stop(node1)


def flip_a_byte(export: Path, position: int) -> None:
    path = next(export.glob("*.log"))
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def forget_ownership(data: Path) -> None:
    """Make a data directory look as the version before OWNER files left it."""
    for p in range(N):
        (data / "partitions" / str(p) / "OWNER").unlink()
    (data / "ASSIGNMENT").unlink()


def owner_files(data: Path) -> list[str]:
    return [(data / "partitions" / str(p) / "OWNER").read_text() for p in range(N)]


async def test_a_data_directory_without_owner_files_is_upgraded_in_place(spawn, tmp_path):
    """A data directory as the version before ownership left it: every partition
    directory, no OWNER, no ASSIGNMENT. The daemon stamps its own partitions and serves
    their state as it was."""
    data = tmp_path / "data"
    keys = partitions_in(3, N, group_id=GROUP, count=2) + partitions_in(6, N, group_id=GROUP)
    async with aiohttp.ClientSession() as session:
        daemon = await spawn(data, partitions=N)
        api = Api(session, daemon.url)
        await write_state(api, keys)
        expected = await states(api, keys)
        await stop(daemon)
        await asyncio.to_thread(forget_ownership, data)
        daemon = await spawn(data, partitions=N)
        api = Api(session, daemon.url)
        ready = await api.readyz()
        assert (ready.status, ready.body["failed_partitions"]) == (200, [])
        assert await states(api, keys) == expected
        await stop(daemon)
    owners = await asyncio.to_thread(owner_files, data)
    assert all('"origin": "migrated"' in owner for owner in owners)
    assert await asyncio.to_thread((data / "ASSIGNMENT").exists)


async def test_a_partition_takes_its_history_along(spawn, tmp_path, ports):
    """What compaction folded on the old owner stays auditable on the new one: the
    export carries the partition's history files (and no other partition's), checked
    like its segments, and the import puts them where the target keeps its history."""
    moved = partitions_in(MOVED, N, group_id=GROUP, count=2)
    expected = await stored_on_node0(spawn, tmp_path, ports, moved)
    source = tmp_path / "node0"
    planted = await asyncio.to_thread(plant_history, source, [MOVED, 3])
    out = tmp_path / "export"
    args = ["--data-dir", str(source), "--partition", str(MOVED), "--out", str(out)]
    done = await cli("partition", "export", *args)
    assert done.returncode == 0, done.stderr
    assert "with its history: 2 files" in done.stdout
    assert await asyncio.to_thread(history_of, out / "history", MOVED) == planted[MOVED]
    assert not await asyncio.to_thread(os.path.exists, out / "history" / "state_partition=3")

    target = tmp_path / "node1"
    into = ["--data-dir", str(target), "--from", str(out), "--node-id", "1"]
    # A history file damaged in the export: refused before anything is written.
    (name, data) = sorted(planted[MOVED].items())[-1]
    damaged = out / "history" / name
    await asyncio.to_thread(damaged.write_bytes, data[:-1] + bytes([data[-1] ^ 1]))
    done = await cli("partition", "import", *into)
    assert done.returncode == 1
    assert f"history file {name} has" in done.stderr
    assert not await asyncio.to_thread(target.exists)
    await asyncio.to_thread(damaged.write_bytes, data)
    # A manifest naming a file outside the partition's history is no export.
    manifest_path = out / "EXPORT"
    manifest = json.loads(await asyncio.to_thread(manifest_path.read_text))
    honest = manifest["history"][0]["path"]
    manifest["history"][0]["path"] = "_exports/3/../../../meta"
    await asyncio.to_thread(manifest_path.write_text, json.dumps(manifest))
    done = await cli("partition", "import", *into)
    assert done.returncode == 2
    assert "expected a file of state partition 2's history" in done.stderr
    manifest["history"][0]["path"] = honest
    await asyncio.to_thread(manifest_path.write_text, json.dumps(manifest))

    done = await cli("partition", "import", *into)
    assert done.returncode == 0, done.stderr
    assert f"its history: 2 files, in {target / 'history'}" in done.stdout
    assert await asyncio.to_thread(history_of, target / "history", MOVED) == planted[MOVED]
    assert not await asyncio.to_thread(os.path.exists, target / "history" / "state_partition=3")
    # The new owner serves the state; its history's markers are read without trouble.
    after = await asyncio.to_thread(cluster_file, tmp_path / "after.toml", ports, AFTER)
    async with aiohttp.ClientSession() as session:
        node1 = await start(spawn, tmp_path, 1, ports[1], after)
        assert await states(Api(session, node1.url), moved) == expected
        await stop(node1)


async def test_an_import_keeps_another_copy_of_the_history_it_finds(spawn, tmp_path, ports):
    moved = partitions_in(MOVED, N, group_id=GROUP, count=1)
    await stored_on_node0(spawn, tmp_path, ports, moved)
    source = tmp_path / "node0"
    planted = await asyncio.to_thread(plant_history, source, [MOVED])
    out = tmp_path / "export"
    args = ["--data-dir", str(source), "--partition", str(MOVED), "--out", str(out)]
    assert (await cli("partition", "export", *args)).returncode == 0
    target = tmp_path / "node1"
    name = sorted(planted[MOVED])[0]
    theirs = target / "history" / name
    await asyncio.to_thread(theirs.parent.mkdir, parents=True)
    await asyncio.to_thread(theirs.write_bytes, b"another copy")
    done = await cli("partition", "import", "--data-dir", str(target), "--from", str(out),
                     "--node-id", "1")  # fmt: skip
    assert done.returncode == 1
    assert "already exists with other contents" in done.stderr
    assert await asyncio.to_thread(theirs.read_bytes) == b"another copy"
    assert not await asyncio.to_thread(os.path.exists, target / "partitions" / str(MOVED))
