"""A bystander, in a process of its own: read-summaries of one key, one after the other,
each timed, until its stdin closes; then one JSON line with the waits (seconds).

Its own process, so that the test's work (building 10,000-batch bodies, checking the
answers) cannot delay its clock: what it measures is the daemon alone.

    python -m tests.reliability.prober URL GROUP TOPIC PARTITION
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp


async def probe(url: str, group_id: str, topic_id: str, partition: int) -> list[float]:
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
    waits: list[float] = []
    async with aiohttp.ClientSession() as session:
        print("probing", flush=True)
        while not stop.is_set():
            started = loop.time()
            async with session.post(
                f"{url}/v1/share-group-state/read-summary", json=payload
            ) as reply:
                answer = await reply.json()
            assert answer["results"][0]["partitions"][0]["error_code"] == 0, answer
            waits.append(loop.time() - started)
    await watcher
    return waits


def main() -> None:
    url, group_id, topic_id, partition = sys.argv[1:5]
    waits = asyncio.run(probe(url, group_id, topic_id, int(partition)))
    print(json.dumps(waits), flush=True)


if __name__ == "__main__":
    main()
