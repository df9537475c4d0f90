"""State retention (docs/semantics.md §A, KIP-211 style): with ``--state-retention-ms``,
all state of a group on a node is tombstoned once no RPC touched any of the group's share-partitions
there for that long; a group's clock starts at its last RPC or at the node's start, so a
restart can only delay expiry.

Pruning and cold snapshots are pushed far out so that only retention writes records.
The one duration checked is a lower bound that correct code meets however slow the
machine: state cannot expire sooner than the retention after a moment taken *before*
the event that starts its clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp

from tests.harness import TOPIC, Api, body, init_entry, partitions_in, read_entry, wait_until

NUM_PARTITIONS = 4
QUIET = ("--prune-interval-ms", "600000", "--cold-partition-snapshot-interval-ms", "600000")


def keys(group: str) -> list[int]:
    # One key per state partition, so the group spans all of them.
    return [partitions_in(p, NUM_PARTITIONS, group_id=group)[0] for p in range(NUM_PARTITIONS)]


async def present(api: Api, group: str) -> list[bool]:
    return [await api.state(group, TOPIC, k) is not None for k in keys(group)]


async def wait_expired(api: Api, group: str) -> float:
    """Poll until every key of ``group`` is gone; the moment that was first seen."""
    await wait_until(
        lambda: present(api, group), f"group {group} to expire", until=lambda shown: not any(shown)
    )
    return time.monotonic()


async def test_an_idle_group_expires_and_a_touched_one_does_not(spawn, tmp_path):
    retention_s = 3.0
    flags = ("--state-retention-ms", str(int(retention_s * 1000)), *QUIET)
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, *flags, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        before_touch = time.monotonic()
        for group in ("idle", "busy"):
            entries = [init_entry(k, 1, 10) for k in keys(group)]
            assert set(await api.codes("initialize", body(group, (TOPIC, entries)))) == {0}

        async def keep_busy() -> None:
            # Any RPC on any one of the group's share-partitions keeps all of them.
            one = keys("busy")[0]
            while True:
                await api.codes("read-summary", body("busy", (TOPIC, [read_entry(one)])))
                await asyncio.sleep(0.1)  # pacing the RPCs, not waiting for anything

        toucher = asyncio.get_running_loop().create_task(keep_busy())
        try:
            expired_at = await wait_expired(api, "idle")
            assert await present(api, "busy") == [True] * NUM_PARTITIONS
        finally:
            toucher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await toucher
        assert expired_at - before_touch >= retention_s
        # Expiry wrote tombstones: another RPC on the idle group finds nothing.
        reply = await api.results("read", body("idle", (TOPIC, [read_entry(keys("idle")[0])])))
        assert reply[0]["error_code"] == 42
    # And they are durable: a restart (retention off) does not bring the state back.
    assert await asyncio.to_thread(daemon.terminate) == 0
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert await present(api, "idle") == [False] * NUM_PARTITIONS
        assert await present(api, "busy") == [True] * NUM_PARTITIONS


async def test_a_restart_does_not_hasten_expiry(spawn, tmp_path):
    """State last touched long ago, by a daemon without retention: a daemon started with
    retention gives it the full retention from its own start."""
    retention_s = 2.0
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, *QUIET, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        entries = [init_entry(k, 1, 10) for k in keys("old")]
        assert set(await api.codes("initialize", body("old", (TOPIC, entries)))) == {0}
    assert await asyncio.to_thread(daemon.terminate) == 0
    # Let the state get older than the retention while no daemon runs (time passing is
    # the point: there is no condition to wait for).
    await asyncio.sleep(retention_s * 1.5)

    started = time.monotonic()  # before the new daemon's clock starts
    daemon = await spawn(
        data_dir,
        "--state-retention-ms",
        str(int(retention_s * 1000)),
        *QUIET,
        partitions=NUM_PARTITIONS,
    )
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert await present(api, "old") == [True] * NUM_PARTITIONS
        expired_at = await wait_expired(api, "old")
    assert expired_at - started >= retention_s


async def test_groups_without_state_leave_no_clock_behind(serve):
    """RPCs naming ever new groups cannot grow the retention clocks for good: with
    retention off none is kept; with it on, a pass forgets the groups without state and
    keeps the clock of a group with state."""
    off = await serve(partitions=NUM_PARTITIONS)
    on = await serve(partitions=NUM_PARTITIONS, state_retention_ms=3_600_000)
    for served in (off, on):
        api = served.api()
        for i in range(20):
            codes = await api.codes("read", body(f"passer-by-{i}", (TOPIC, [read_entry(0)])))
            assert codes == [42]  # never initialized
        entries = [init_entry(k, 1, 10) for k in keys("kept")]
        assert set(await api.codes("initialize", body("kept", (TOPIC, entries)))) == {0}
    # White-box: the map is what would grow; nothing outside shows its size.
    assert off.node.service.group_touched == {}
    service = on.node.service
    assert len(service.group_touched) == 21
    assert await on.node.jobs.expire_groups_once() == 0  # nothing is old enough to expire
    assert set(service.group_touched) == {"kept"}
