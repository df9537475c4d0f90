"""Issue #7, item 1: the crash loop. Acknowledged writes are never lost, and nothing that
was never acknowledged appears, across any number of SIGKILLs at random moments.

A writer sends random valid RPCs (initialize, write, read, read-summary, delete; one to
five entries per request, both encodings) at full speed from several connections, and
the model (model.py) checks every answer. The daemon is SIGKILLed at a random moment —
after a random number of answers plus a random sub-millisecond-to-millisecond delay, and
in some cycles while it is still loading — and restarted on the same data directory with
small segments, frequent pruning, and a snapshot cadence and append linger that change
between restarts. After each kill, ``sharecoord log verify`` must find no damage in what
the crash left; after each restart, every key's admin state must be one the model allows, which is
exactly the acknowledged state where no answer was lost.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.harness import Api, run_cli
from tests.reliability.model import Model
from tests.reliability.traffic import Traffic, admin_states

NUM_PARTITIONS = 8
GROUPS = ["crash-a", "crash-b"]
PARTITIONS_PER_GROUP = 8
WORKERS = 4


def serve_flags(rng: random.Random) -> list[str]:
    return [
        "--segment-bytes",
        "1024",
        "--prune-interval-ms",
        "100",
        "--cold-partition-snapshot-interval-ms",
        str(rng.choice((200, 300000))),
        "--snapshot-update-records-per-snapshot",
        str(rng.choice((0, 1, 3, 500))),
        # Appends held a while before their commit widen every window a kill can hit.
        "--append-linger-ms",
        str(rng.choice((0, 0, 2, 20))),
    ]


async def crash_loop(spawn, data_dir: Path, cycles: int, seed: int, figures) -> None:
    rng = random.Random(seed)
    model = Model(GROUPS, PARTITIONS_PER_GROUP, NUM_PARTITIONS)
    traffic = Traffic(model, rng)
    lost: list[str] = []
    survived = 0
    async with aiohttp.ClientSession() as session:
        for cycle in range(cycles):
            if cycle > 0 and rng.random() < 0.1:
                # Killed while loading (or right after it): recovery itself is cut short.
                daemon = await spawn(
                    data_dir, *serve_flags(rng), partitions=NUM_PARTITIONS, ready=False
                )
                await asyncio.sleep(rng.random() * 0.05)  # the random moment of the kill
                os.kill(daemon.pid, signal.SIGKILL)
                assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
                figures.add("kills_while_loading")
            daemon = await spawn(data_dir, *serve_flags(rng), partitions=NUM_PARTITIONS)
            shown = await admin_states(session, daemon.url, model, rng)
            for key, state in shown.items():
                if not model.reconcile(key, state):
                    lost.append(f"cycle {cycle}, key {key}: {state} not in {model.possible[key]}")
            assert not lost, "\n".join(lost)
            survived = cycle
            traffic.release_all()

            # Kill after a random number of answers, a random moment later.
            threshold = traffic.acknowledged + rng.randrange(1, 80)
            reached = asyncio.Event()

            def count(threshold: int = threshold, reached: asyncio.Event = reached) -> None:
                if traffic.acknowledged >= threshold:
                    reached.set()

            traffic.on_acknowledged = count

            async def kill(pid: int = daemon.pid, reached: asyncio.Event = reached) -> None:
                await reached.wait()
                delay = rng.choice((0, 0, rng.random() * 0.002, rng.random() * 0.02))
                await asyncio.sleep(delay)  # the random moment of the kill, not a wait
                os.kill(pid, signal.SIGKILL)

            killer = asyncio.ensure_future(kill())
            await traffic.run(daemon.url, WORKERS)
            await killer
            assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
            verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
            assert verify.returncode == 0, (cycle, verify.stdout + verify.stderr)

        # The last restart, checked, and a clean stop.
        daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
        for key, state in (await admin_states(session, daemon.url, model, rng)).items():
            if not model.reconcile(key, state):
                lost.append(f"final, key {key}: {state} not in {model.possible[key]}")
        await Api(session, daemon.url).wait_ready()
        assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    figures.add("cycles_survived", survived + 1)
    figures.add("requests_acknowledged", traffic.acknowledged)
    figures.add("entries_acknowledged", traffic.entries_acknowledged)
    figures.add("requests_unanswered_at_kill", traffic.unanswered)
    figures.add("writes_lost", len(lost))
    assert not lost, "\n".join(lost)


async def test_crash_loop_loses_nothing_acknowledged(spawn, tmp_path, figures):
    await crash_loop(spawn, tmp_path / "data", cycles=5, seed=1, figures=figures)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_crash_loop_long(spawn, tmp_path, figures):
    await crash_loop(spawn, tmp_path / "data", cycles=250, seed=2, figures=figures)
