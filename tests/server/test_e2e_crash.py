"""Durability across process deaths (docs/api.md#durability: a 200 means fsynced).

* SIGKILL right after a 200, restart on the same data directory: every acknowledged
  write is there exactly; a write whose answer never came is there or not, whole.
  Several rounds of random concurrent writes; a short slice by default, a long one under
  ``-m slow``.
* SIGTERM with requests in flight: they complete with 200 or are refused cleanly, the
  process exits 0, and everything acknowledged is there after a restart.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    Daemon,
    body,
    init_entry,
    next_write,
    run_cli,
)

GROUP = "crash"
KEYS = list(range(24))


async def write_until_killed(
    api: Api, daemon: Daemon, rng: random.Random, model: AcknowledgedGroup
) -> int:
    """Concurrent random writes of disjoint keys; SIGKILL right after the ``n``th 200."""
    kill_after = rng.randint(2, 20)
    acked = 0
    killed = False
    free = set(KEYS)

    async def worker() -> None:
        nonlocal acked, killed
        while not killed:
            chosen = rng.sample(sorted(free), min(len(free), rng.randint(1, 6)))
            free.difference_update(chosen)
            writes = {key: next_write(rng, key, model.exact(key)) for key in chosen}
            for key, (_, expected) in writes.items():
                model.unanswered(key, expected)
            entries = [entry for entry, _ in writes.values()]
            try:
                reply = await api.rpc_reply("write", body(GROUP, (TOPIC, entries)))
            except aiohttp.ClientError:
                return  # killed under it: these stay unknown
            assert reply.status == 200, reply.body
            codes = [r["error_code"] for r in reply.body["results"][0]["partitions"]]
            assert codes == [0] * len(entries), reply.body
            for key, (_, expected) in writes.items():
                model.acknowledge(key, expected)
            free.update(chosen)
            acked += 1
            if acked == kill_after and not killed:
                os.kill(daemon.pid, signal.SIGKILL)  # nothing awaited since the 200
                killed = True

    await asyncio.gather(*(worker() for _ in range(4)))
    return acked


async def kill_and_restart_rounds(
    spawn, data_dir: Path, rounds: int, seed: int, *flags: str
) -> None:
    rng = random.Random(seed)
    model = AcknowledgedGroup(GROUP, KEYS)
    async with aiohttp.ClientSession() as session:
        daemon = await spawn(data_dir, *flags)
        api = Api(session, daemon.url, "msgpack")
        assert set(await api.codes("initialize", model.init_body())) == {0}
        for round_number in range(rounds):
            await write_until_killed(api, daemon, rng, model)
            assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
            daemon = await spawn(data_dir, *flags)
            api = Api(session, daemon.url, rng.choice(("json", "msgpack")))
            await api.wait_ready()
            await model.check(api)
            assert not model.uncertain(), round_number
        assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_sigkill_right_after_a_200_loses_nothing_acknowledged(spawn, tmp_path):
    await kill_and_restart_rounds(spawn, tmp_path / "data", rounds=3, seed=1)


async def test_sigkill_right_after_a_200_loses_nothing_with_the_commit_thread_flushing(
    spawn, tmp_path
):
    """journal_flush = thread: the journal's fdatasync in the commit thread, as where
    Linux AIO is missing (the default, the kernel's flush, is the test above)."""
    await kill_and_restart_rounds(
        spawn, tmp_path / "data", 3, 2, "--journal-flush", "thread", "--log-level", "info"
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
async def test_sigkill_right_after_a_200_many_rounds(spawn, tmp_path, seed):
    await kill_and_restart_rounds(spawn, tmp_path / "data", rounds=20, seed=seed)


# --- graceful shutdown ----------------------------------------------------------------------


async def test_sigterm_with_requests_in_flight_exits_0_and_keeps_what_was_acknowledged(
    spawn, tmp_path
):
    data_dir = tmp_path / "data"
    rng = random.Random(7)
    model = AcknowledgedGroup(GROUP, KEYS)
    async with aiohttp.ClientSession() as session:
        daemon = await spawn(data_dir)
        api = Api(session, daemon.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
        answered = 0
        refused = 0
        terminated = asyncio.Event()

        async def worker(key: int) -> None:
            """One key per worker, written again and again until the daemon is gone."""
            nonlocal answered, refused
            # Each worker on its own connection, so several requests are in flight at once.
            async with aiohttp.ClientSession() as own:
                mine = Api(own, daemon.url, "msgpack")
                while True:
                    entry, expected = next_write(rng, key, model.exact(key))
                    model.unanswered(key, expected)
                    try:
                        reply = await mine.rpc_reply("write", body(GROUP, (TOPIC, [entry])))
                    except aiohttp.ClientConnectionError:
                        assert terminated.is_set()
                        refused += 1
                        return
                    assert reply.status == 200, reply.body
                    assert reply.body["results"][0]["partitions"][0]["error_code"] == 0, reply.body
                    model.acknowledge(key, expected)
                    answered += 1
                    if answered == 100:
                        daemon.signal(signal.SIGTERM)
                        terminated.set()

        await asyncio.gather(*(worker(key) for key in KEYS))
        assert refused == len(KEYS)
        assert await asyncio.to_thread(daemon.wait) == 0
        stderr = await asyncio.to_thread(daemon.stderr_text)
        assert "Traceback" not in stderr, stderr
        assert "state log closed" in stderr
        daemon = await spawn(data_dir)
        api = Api(session, daemon.url)
        await api.wait_ready()
        await model.check(api)


async def test_sigterm_right_after_listening_exits_0(spawn, tmp_path):
    """The daemon says it listens only once SIGTERM means a clean stop."""
    for attempt in range(12):
        daemon = await spawn(tmp_path / "data", ready=False, signal_when_listening=signal.SIGTERM)
        code = await asyncio.to_thread(daemon.wait)
        assert code == 0, (attempt, code, await asyncio.to_thread(daemon.stderr_text))


async def test_sigint_stops_like_sigterm(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data")
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        await api.rpc("initialize", body(GROUP, (TOPIC, [init_entry(0, 1, 5)])))
    daemon.signal(signal.SIGINT)
    assert await asyncio.to_thread(daemon.wait) == 0
    stderr = await asyncio.to_thread(daemon.stderr_text)
    assert "Traceback" not in stderr, stderr
