"""Durability over the Kafka listener (docs/api.md#durability holds there too): SIGKILL
right after an answer on the Kafka listener, restart on the same data directory, and
every write answered with 0 is there exactly; a write whose answer never came is there
or not, whole.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

import aiohttp
import pytest

from tests.harness import TOPIC, AcknowledgedGroup, Api, Daemon, body, next_write, run_cli
from tests.kafka_client import KafkaClient, kafka_address

GROUP = "kafka-crash"
KEYS = list(range(16))


async def write_until_killed(
    daemon: Daemon, rng: random.Random, model: AcknowledgedGroup, kill_after: int
) -> None:
    host, port = kafka_address(daemon.stdout_lines)
    answered = 0
    killed = False
    free = set(KEYS)

    async def worker() -> None:
        nonlocal answered, killed
        client = await KafkaClient.connect(host, port)
        try:
            while not killed:
                chosen = rng.sample(sorted(free), min(len(free), rng.randint(1, 4)))
                free.difference_update(chosen)
                writes = {key: next_write(rng, key, model.exact(key)) for key in chosen}
                for key, (_, expected) in writes.items():
                    model.unanswered(key, expected)
                entries = [entry for entry, _ in writes.values()]
                try:
                    answer = await client.rpc("write", body(GROUP, (TOPIC, entries)))
                except (ConnectionError, asyncio.IncompleteReadError):
                    return  # killed under it: these stay unknown
                codes = [p["error_code"] for p in answer["results"][0]["partitions"]]
                assert codes == [0] * len(entries), answer
                for key, (_, expected) in writes.items():
                    model.acknowledge(key, expected)
                free.update(chosen)
                answered += 1
                if answered == kill_after and not killed:
                    os.kill(daemon.pid, signal.SIGKILL)  # nothing awaited since the answer
                    killed = True
        finally:
            await client.close()

    await asyncio.gather(*(worker() for _ in range(3)))


async def kill_and_restart(spawn, data_dir, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    model = AcknowledgedGroup(GROUP, KEYS)
    flags = ("--kafka-listener", "127.0.0.1:0")
    async with aiohttp.ClientSession() as session:
        daemon = await spawn(data_dir, *flags)
        host, port = kafka_address(daemon.stdout_lines)
        client = await KafkaClient.connect(host, port)
        init = await client.rpc("initialize", model.init_body())
        assert {p["error_code"] for p in init["results"][0]["partitions"]} == {0}
        await client.close()
        for round_number in range(rounds):
            await write_until_killed(daemon, rng, model, rng.randint(2, 15))
            assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
            daemon = await spawn(data_dir, *flags)
            await model.check(Api(session, daemon.url))
            assert not model.uncertain(), round_number
        assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_sigkill_right_after_a_kafka_answer_loses_nothing_answered(spawn, tmp_path):
    await kill_and_restart(spawn, tmp_path / "data", rounds=3, seed=13)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
async def test_sigkill_right_after_a_kafka_answer_many_rounds(spawn, tmp_path, seed):
    await kill_and_restart(spawn, tmp_path / "data", rounds=20, seed=seed)


async def test_sigterm_drains_kafka_requests_in_flight_and_exits_0(spawn, tmp_path):
    from tests.kafka_client import share_request  # noqa: PLC0415

    daemon = await spawn(tmp_path / "data", "--kafka-listener", "127.0.0.1:0")
    host, port = kafka_address(daemon.stdout_lines)
    client = await KafkaClient.connect(host, port)
    model = AcknowledgedGroup(GROUP, KEYS)
    await client.rpc("initialize", model.init_body())
    rng = random.Random(3)
    requests = [
        share_request("write", body(GROUP, (TOPIC, [next_write(rng, k, model.exact(k))[0]])))
        for k in KEYS
    ]
    frames = b"".join(client.frame(r)[0] for r in requests)
    client.writer.write(frames)
    await client.writer.drain()
    daemon.signal(signal.SIGTERM)
    assert await asyncio.to_thread(daemon.wait) == 0
    await client.close()
    stderr = await asyncio.to_thread(daemon.stderr_text)
    assert "final_commit=done" in stderr and "Traceback" not in stderr, stderr
