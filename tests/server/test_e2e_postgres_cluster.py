"""Cluster mode on PostgreSQL (docs/design.md#cluster-mode), with real daemons (the
harness) on real PostgreSQL servers (tests/postgres.py): a node lost, a zombie fenced,
the database away. Each short version asserts what happens; the slow ones (make
reliability) also how fast. Figures: tests/figures.py.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.figures import Figures
from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    DaemonExited,
    Expected,
    Spawn,
    body,
    next_write,
    run_cli,
    wait_until,
)
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer
from tests.server.postgres_cluster import (
    GROUP,
    PARTITIONS,
    SHARE_PARTITIONS,
    own_server,
    start_cluster,
    state_partition_of,
    writing,
)

# --- (1) a node lost ------------------------------------------------------------------------


async def node_loss(
    spawn: Spawn, tmp_path: Path, postgres: PostgresServer, figures: Figures
) -> float:
    """Three nodes under load from the client; SIGKILL the one leading the most state
    partitions; every share-partition it led is written again through its new leader.
    Returns the seconds from the kill to the last of them."""
    cluster = await start_cluster(spawn, tmp_path, postgres, 3, "--lease-ms", "3000")
    async with writing(cluster) as writers:
        await wait_until(
            lambda: len(writers.written_at) == SHARE_PARTITIONS, "every share-partition written"
        )
        # Every partition with a live lease: on a busy machine a renewal may be late,
        # and a partition whose lease lapsed a moment has no leader in the table.
        leaders = await cluster.wait_led()
        counts = {n: list(leaders.values()).count(n) for n in set(leaders.values())}
        victim = max(counts, key=lambda n: counts[n])
        orphans = {p for p in writers.model.keys if leaders[state_partition_of(p)] == victim}
        await asyncio.to_thread(cluster.nodes[victim].kill)
        killed_at = time.monotonic()  # once it is dead: nothing sent later reached it
        again = await writers.wait_written_again(killed_at, orphans)
        await writers.stop()
        assert writers.failed == 0
        survivors = {i for i in range(3) if i != victim}
        after = await cluster.wait_led(by=survivors)
        assert set(after.values()) <= survivors
        await writers.check()
    figures.set("partitions_of_the_killed_node", counts[victim])
    figures.set("share_partitions_moved", len(orphans))
    figures.set("first_rewrite_s", round(min(again.values()), 2))
    figures.set("last_rewrite_s", round(max(again.values()), 2))
    figures.set("acknowledged_writes", sum(len(t) for t in writers.written_at.values()))
    return max(again.values())


async def test_a_lost_node_s_share_partitions_are_written_again_through_their_new_leaders(
    spawn, tmp_path, postgres, figures
):
    await node_loss(spawn, tmp_path, postgres, figures)


@pytest.mark.slow
async def test_a_lost_node_s_share_partitions_are_written_again_within_5_s(
    spawn, tmp_path, postgres, figures
):
    slowest = 0.0
    for run in range(3):
        slowest = max(slowest, await node_loss(spawn, tmp_path / f"run{run}", postgres, figures))
    figures.set("slowest_last_rewrite_s", round(slowest, 2))
    assert slowest <= 5.0


# --- (2) a zombie ---------------------------------------------------------------------------


async def test_a_paused_leader_is_fenced_and_answers_16_once_it_wakes(
    spawn, tmp_path, postgres, figures
):
    """SIGSTOP a leader past its lease; the other node takes its state partitions over
    and writes; SIGCONT the old one: none of its answers after the takeover is a
    success, it drops the partitions and answers 16; the acknowledged state holds."""
    cluster = await start_cluster(spawn, tmp_path, postgres, 2, "--lease-ms", "2000")
    zombie_id = 0
    leaders = await asyncio.to_thread(cluster.leaders)
    led = sorted(p for p, n in leaders.items() if n == zombie_id)
    partition = next(p for p in range(1000) if state_partition_of(p) in led)
    zombie, other = cluster.nodes[zombie_id], cluster.nodes[1]
    model = AcknowledgedGroup(GROUP, [partition])
    rng = random.Random(5)
    async with aiohttp.ClientSession() as session:
        to_zombie, to_other = Api(session, zombie.url), Api(session, other.url)
        assert await to_zombie.codes("initialize", model.init_body()) == [0]
        entry, expected = next_write(rng, partition, model.exact(partition))
        assert await to_zombie.codes("write", body(GROUP, (TOPIC, [entry]))) == [0]
        model.acknowledge(partition, expected)
        epochs_before = await asyncio.to_thread(cluster.epochs)

        zombie.signal(signal.SIGSTOP)
        try:
            # A write sent to it while it is paused waits in its socket.
            late_entry, late = next_write(rng, partition, model.exact(partition))
            late_answer = asyncio.create_task(
                to_zombie.codes("write", body(GROUP, (TOPIC, [late_entry])))
            )
            # And a read, which needs no commit: only the node's own clock can stop it
            # answering from what it holds.
            summary = body(GROUP, (TOPIC, [{"partition": partition, "leader_epoch": -1}]))
            late_read = asyncio.create_task(to_zombie.codes("read-summary", summary))
            await cluster.wait_led(by={1})
            taken_at = time.monotonic()
            # The other node leads it now, with a higher epoch, and writes.
            epochs_after = await asyncio.to_thread(cluster.epochs)
            assert all(epochs_after[p] > epochs_before[p] for p in led)
            entry, expected = next_write(rng, partition, model.exact(partition))
            codes = await wait_until(
                lambda: to_other.codes("write", body(GROUP, (TOPIC, [entry]))),
                "the new leader to take the write",
                until=lambda c: c == [0],
            )
            assert codes == [0]
            model.acknowledge(partition, expected)
        finally:
            zombie.signal(signal.SIGCONT)
        # Nothing it answers after the takeover is a success: the write and the read it
        # held...
        assert (await late_answer) != [0]
        assert (await late_read) != [0]
        # ... and whatever it is asked now, until and after it dropped the partitions.
        read = body(GROUP, (TOPIC, [{"partition": partition, "leader_epoch": -1}]))
        first = await to_zombie.codes("read-summary", read)
        assert first != [0]
        assert await to_zombie.codes("write", body(GROUP, (TOPIC, [late_entry]))) == [16]
        await wait_until(
            lambda: to_zombie.metric("sharecoord_partitions_led"),
            "the zombie to count no partition led",
            until=lambda v: v == 0,
        )
        assert "dropped" in await asyncio.to_thread(zombie.stderr_text)
        await model.check(to_other)
        figures.set("partitions_taken_over", len(led))
        figures.set("seconds_paused", round(time.monotonic() - taken_at, 2))
        del late  # never acknowledged: the model never held it


# --- (4) the database away ------------------------------------------------------------------


async def database_away(spawn: Spawn, tmp_path: Path, figures: Figures) -> float:
    """SIGSTOP PostgreSQL for 5 s while writes come: every answer is retriable (15, 14
    or 16), the daemon stays up, and writes go through again once it is back. Returns
    the slowest answer meanwhile, in seconds."""
    async with own_server("away") as server:
        cluster = await start_cluster(spawn, tmp_path, server, 1, "--write-timeout-ms", "3000")
        node = cluster.nodes[0]
        model = AcknowledgedGroup(GROUP, range(4))
        rng = random.Random(7)
        async with aiohttp.ClientSession() as session:
            api = Api(session, node.url)
            assert await api.codes("initialize", model.init_body()) == [0] * 4
            await asyncio.to_thread(server.freeze)
            frozen_at = time.monotonic()
            answers: list[tuple[float, list[int]]] = []
            try:
                while time.monotonic() - frozen_at < 5.0:
                    entries = []
                    for p in model.keys:
                        entry, expected = next_write(rng, p, _furthest(model, p))
                        entries.append(entry)
                        model.unanswered(p, expected)
                    sent = time.monotonic()
                    codes = await api.codes("write", body(GROUP, (TOPIC, entries)))
                    answers.append((time.monotonic() - sent, codes))
                    assert node.running()
            finally:
                await asyncio.to_thread(server.thaw)
            assert answers
            assert all(code in (14, 15, 16) for _, codes in answers for code in codes), answers
            for p in model.keys:
                entry, expected = next_write(rng, p, _furthest(model, p))
                await wait_until(
                    lambda entry=entry: api.codes("write", body(GROUP, (TOPIC, [entry]))),
                    "writes to go through again",
                    until=lambda c: c == [0],
                )
                model.acknowledge(p, expected)
            await model.check(api)
            assert node.running()
        slowest = max(seconds for seconds, _ in answers)
        figures.set("answers_while_frozen", len(answers))
        figures.set("slowest_answer_s", round(slowest, 2))
        return slowest


def _furthest(model: AcknowledgedGroup, partition: int) -> Expected:
    """Of the states a share-partition may be in, the one whose batches end last: a
    write past it leaves exactly its own batch, whichever state it met."""
    states = [s for s in model.possible[partition] if s is not None]
    return max(states, key=lambda s: s.state_batches[-1][1] if s.state_batches else s.start_offset)


async def test_postgres_frozen_5_s_under_load_answers_retriably_and_writes_resume(
    spawn, tmp_path, figures
):
    await database_away(spawn, tmp_path, figures)


@pytest.mark.slow
async def test_postgres_frozen_5_s_answers_within_write_timeout(spawn, tmp_path, figures):
    slowest = await database_away(spawn, tmp_path, figures)
    assert slowest < 3.0 + 1.0  # write_timeout_ms, and the deadline sweep's quarter of it


# --- the URI's password -----------------------------------------------------------------------

SECRET = "pw-Zq81-never-shown"


async def test_the_state_store_password_shows_nowhere(spawn, daemons, tmp_path, postgres):
    """Not in the log of a node that runs (nor its /metrics, its find-coordinator), nor in
    the one line of a node whose PostgreSQL cannot be reached, nor in a settings error."""
    uri = postgres.uri(password=SECRET)  # the test server trusts: any password will do
    node = await spawn(
        tmp_path / "node", "--state-store", uri, "--state-store-schema", fresh_schema(),
        partitions=PARTITIONS,
    )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        api = Api(session, node.url)
        metrics = await api.metrics()
        found = await api.post("/v1/find-coordinator", {"keys": [f"{GROUP}:{TOPIC}:0"]})
    assert found.body["coordinators"][0]["error_code"] == 0
    await asyncio.to_thread(node.terminate)
    unreachable = f"postgresql://someone:{SECRET}@127.0.0.1:1/db"
    dead = daemons.make(tmp_path / "dead", "--state-store", unreachable, partitions=PARTITIONS)
    with pytest.raises(DaemonExited) as exited:
        await asyncio.to_thread(dead.start)
    assert exited.value.code == 1
    bad = await asyncio.to_thread(
        run_cli, "serve", "--state-store", f"mysql://root:{SECRET}@db/x", "--listen", "127.0.0.1:0"
    )
    assert bad.returncode == 2 and "not a PostgreSQL URI" in bad.stderr
    for text in (
        metrics,
        await asyncio.to_thread(node.stderr_text),
        exited.value.stderr,
        bad.stderr,
    ):
        assert SECRET not in text
    assert "***" in exited.value.stderr
