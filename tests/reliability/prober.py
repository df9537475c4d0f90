"""A bystander, in a process of its own: read-summaries of one key, one after the other,
each timed, until its stdin closes; then one JSON line with, for each, the wait and the
part of it when the daemon's event loop thread or the prober itself was ready to run
but the machine ran others (seconds).

Its own process, so that the test's work (building 10,000-batch bodies, checking the
answers) cannot delay its clock: what it measures is the daemon alone. On a busy machine
(CI's is shared) a wait also holds time when nobody held the event loop and the OS ran
other processes: the kernel counts it per thread (the run-queue delay of
/proc/PID/task/TID/schedstat), so the test can tell the two apart.

    python -m tests.reliability.prober URL GROUP TOPIC PARTITION DAEMON_PID
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading

import aiohttp


def run_delay_s(pid: int, tid: int | None = None) -> float:
    """Seconds a thread (the main one by default) was ready to run but waited for a CPU."""
    with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


async def probe(
    url: str, group_id: str, topic_id: str, partition: int, daemon_pid: int
) -> list[tuple[float, float]]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def until_eof() -> None:
        await reader.read()
        stop.set()

    watcher = asyncio.create_task(until_eof())
    payload = {
        "group_id": group_id,
        "topics": [{"topic_id": topic_id, "partitions": [{"partition": partition}]}],
    }
    waits: list[tuple[float, float]] = []
    me, my_thread = os.getpid(), threading.get_native_id()

    def not_run() -> float:
        return run_delay_s(daemon_pid) + run_delay_s(me, my_thread)

    async with aiohttp.ClientSession() as session:
        print("probing", flush=True)
        while not stop.is_set():
            started, starved = loop.time(), not_run()
            async with session.post(
                f"{url}/v1/share-group-state/read-summary", json=payload
            ) as reply:
                answer = await reply.json()
            assert answer["results"][0]["partitions"][0]["error_code"] == 0, answer
            waits.append((loop.time() - started, not_run() - starved))
    await watcher
    return waits


def main() -> None:
    url, group_id, topic_id, partition, daemon_pid = sys.argv[1:6]
    waits = asyncio.run(probe(url, group_id, topic_id, int(partition), int(daemon_pid)))
    print(json.dumps(waits), flush=True)


if __name__ == "__main__":
    main()
