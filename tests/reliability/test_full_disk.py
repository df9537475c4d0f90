"""A full disk never stops reads: restarts on a really full disk under a writer.

The data directory is on a small tmpfs (tests/fullfs.py). In each round a writer runs
(random RPCs over the model's keys, tests/reliability/model.py), the disk is filled to
ENOSPC under it (what it acknowledged up to then, and after, as long as the journal
took it, must stay), and the daemon is killed (SIGKILL; every third round the writer
stops first, the running daemon must answer every read, and it gets a SIGTERM) and
started again on the still-full disk. Recovery then has work that needs space: frames
only the journal holds, torn tails, a new CHECKPOINT. The restarted daemon must answer
every read from what was acknowledged (the model reconciles each key: "writes lost"
counts those it cannot), answer every write 15, say so on /readyz and /metrics, make
no file (no temporary one either), and take writes again by itself once the filler is
deleted. `sharecoord log verify` is clean at the end.

Figures: restarts on a full disk (and how many had journal frames to lay into the
files), reads served and writes refused there, reads served by the running daemon,
the seconds from deleting the filler to the first write taken (max; the long run
asserts at most 5 s), requests acknowledged, writes lost.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

import aiohttp
import pytest

from server.runtime import READS_SERVED
from tests.fullfs import FullFilesystem, listing, no_temporary_files
from tests.harness import (
    WAIT_TIMEOUT_S,
    Api,
    Daemon,
    Daemons,
    metric_value,
    run_cli,
    wait_until,
)
from tests.reliability.model import Model, Request
from tests.reliability.traffic import Traffic, check_exact, resumed

NUM_PARTITIONS = 4
GROUPS = ["full-a", "full-b"]
PARTITIONS_PER_GROUP = 6
# Small segments, so that a few writes meet the full disk; a write timeout no busy
# machine reaches, so that every 15 is the disk's (a timed-out write may still land).
FLAGS = (
    "--journal-segment-bytes",
    "65536",
    "--segment-bytes",
    "4096",
    "--write-timeout-ms",
    "60000",
)
FIRST_WRITE_WITHIN_S = 5.0  # the long run's promise


async def one_request(traffic: Traffic, url: str, rpc: str, keys: list[Any]) -> list[int]:
    """One request of `rpc` over `keys` (one group), checked against the model; the
    entries' codes."""
    request: Request = traffic.model.plan(traffic.rng, rpc, keys)
    async with aiohttp.ClientSession() as session:
        status, answer = await traffic.send(session, url, request)
    assert status == 200, (status, answer)
    traffic.model.settle(request, answer, faults=True)
    return [r["error_code"] for topic in answer["results"] for r in topic["partitions"]]


async def served_on_a_full_disk(
    session: aiohttp.ClientSession, daemon: Daemon, traffic: Traffic, figures: Any
) -> None:
    """Every read answered from what was acknowledged, every write 15, and said so."""
    model = traffic.model
    await check_exact(session, daemon.url, model, traffic.rng)  # writes lost: none
    figures.add("reads_served", len(model.keys))
    for group in GROUPS:
        keys = [k for k in model.keys if k[0] == group]
        codes = await one_request(traffic, daemon.url, "read-summary", keys)
        assert set(codes) == {0}, codes
        figures.add("reads_served", len(codes))
        codes = await one_request(traffic, daemon.url, "write", keys)
        assert set(codes) == {15}, codes
        figures.add("writes_refused", len(codes))
    api = Api(session, daemon.url)
    ready = await api.readyz()
    assert ready.status == 200, ready.body
    assert ready.body["failed_partitions"] == list(range(NUM_PARTITIONS)), ready.body
    assert all(READS_SERVED in f["error"] for f in ready.body["failures"]), ready.body
    metrics = await api.metrics()
    for p in range(NUM_PARTITIONS):
        labels = {"partition": str(p), "status": "failed"}
        assert metric_value(metrics, "sharecoord_partition_status", **labels) == 1


async def reads_settled(api: Api) -> None:
    """Wait until no failed partition is still reading what is on disk for its reads
    (one whose write failed a moment ago may be)."""
    await wait_until(
        api.readyz,
        "every failed partition to serve reads",
        until=lambda ready: all(READS_SERVED in f["error"] for f in ready.body["failures"]),
    )


async def every_partition_back(api: Api) -> None:
    await wait_until(
        api.readyz,
        "every state partition to be back after the disk had room",
        until=lambda ready: ready.status == 200 and not ready.body["failed_partitions"],
    )


async def first_write_after_space_returns(traffic: Traffic, url: str) -> float:
    """Seconds from now (the filler just deleted) to the first write entry taken."""
    started = time.monotonic()
    keys = traffic.model.keys

    async def write_one() -> list[int]:
        key = traffic.rng.choice([k for k in keys if traffic.model.exact(k) is not None])
        return await one_request(traffic, url, "write", [key])

    # Paused little between tries: the time to the first write taken is a figure.
    await wait_until(write_one, "writes to resume", until=lambda codes: 0 in codes, max_pause=0.02)
    return time.monotonic() - started


async def full_disk_rounds(
    spawn: Any,
    daemons: Daemons,
    disk: FullFilesystem,
    rounds: int,
    seed: int,
    figures: Any,
) -> list[float]:
    rng = random.Random(seed)
    data_dir = disk.path / "data"
    model = Model(GROUPS, PARTITIONS_PER_GROUP, NUM_PARTITIONS)
    traffic = Traffic(model, rng, faults=True)
    waits: list[float] = []
    back: list[float] = []  # seconds from space returning to every partition back
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        for round_number in range(rounds):
            # A writer; the disk fills under it.
            fired = asyncio.Event()
            unavailable = traffic.entries_unavailable

            def progress(unavailable: int = unavailable, fired: asyncio.Event = fired) -> None:
                if traffic.entries_unavailable > unavailable + 10:
                    fired.set()

            traffic.on_acknowledged, traffic.stopped = progress, False
            writer = asyncio.ensure_future(traffic.run(daemon.url, 3))
            figures.add("bytes_filled", await asyncio.to_thread(disk.fill))
            await asyncio.wait_for(fired.wait(), WAIT_TIMEOUT_S)
            if round_number % 3 == 2:
                # The writer stops; the daemon on the full disk answers every read.
                traffic.stopped = True
                await writer
                await reads_settled(Api(session, daemon.url))
                await check_exact(session, daemon.url, model, rng)
                figures.add("reads_served_while_running", len(model.keys))
                assert await asyncio.to_thread(daemon.terminate) == 0
            else:
                os.kill(daemon.pid, signal.SIGKILL)
                await writer
                assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
                figures.add("sigkills")
            await asyncio.to_thread(disk.fill)  # whatever the daemon gave back

            daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
            figures.add("restarts_on_a_full_disk")
            if "not caught up with the journal" in await asyncio.to_thread(daemon.stderr_text):
                figures.add("restarts_with_journal_frames_to_lay_into_the_files")
            await served_on_a_full_disk(session, daemon, traffic, figures)
            no_temporary_files(await asyncio.to_thread(listing, data_dir))

            await asyncio.to_thread(disk.free)
            freed = time.monotonic()
            waits.append(await first_write_after_space_returns(traffic, daemon.url))
            # The first write taken is one partition back; the others reload on their
            # own retry schedule (each wakes when the disk has room), so the burst that
            # must see no 15 waits for every partition to be back.
            await every_partition_back(Api(session, daemon.url))
            back.append(time.monotonic() - freed)
            traffic.release_all()
            await resumed(traffic, daemon.url)

        assert await asyncio.to_thread(daemon.terminate) == 0
        daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
        await check_exact(session, daemon.url, model, rng)
        assert await asyncio.to_thread(daemon.terminate) == 0
    for started in daemons:
        stderr = await asyncio.to_thread(started.stderr_text)
        assert "Traceback" not in stderr, stderr[stderr.index("Traceback") - 300 :][:3000]
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    figures.set("seconds_to_first_write_max", round(max(waits), 3))
    figures.set("seconds_to_every_partition_back_max", round(max(back), 3))
    figures.add("requests_acknowledged", traffic.acknowledged)
    figures.add("writes_lost", 0)  # check_exact asserted it after every restart
    return waits


async def test_restarts_on_a_full_disk_under_a_writer(
    spawn: Any, daemons: Daemons, full_disk: FullFilesystem, figures: Any
) -> None:
    await full_disk_rounds(spawn, daemons, full_disk, 3, seed=1, figures=figures)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_restarts_on_a_full_disk_under_a_writer_long(
    spawn: Any, daemons: Daemons, full_disk: FullFilesystem, figures: Any
) -> None:
    waits = await full_disk_rounds(spawn, daemons, full_disk, 40, seed=2, figures=figures)
    assert max(waits) <= FIRST_WRITE_WITHIN_S, waits
