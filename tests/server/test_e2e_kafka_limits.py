"""The Kafka listener's cap on connections (``--kafka-max-connections``,
docs/api.md#the-kafka-listener): one connection over it is accepted and cut off at once,
counted in sharecoord_kafka_connections_refused_total, and logged at most once a second
with how many were refused since the last line; the connections already open are served
as before, and a place that frees up is taken by the next one."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from itertools import pairwise

from tests.harness import Api, Daemon, wait_until
from tests.kafka_client import KafkaClient, kafka_address, message_class

API_VERSIONS = message_class("api_versions", 0, "request")
REFUSED = "sharecoord_kafka_connections_refused_total"
_REFUSAL_LINE = re.compile(r"^(\S+) WARNING .*connections refused.* refused=(\d+)", re.MULTILINE)


async def served(client: KafkaClient) -> bool:
    return bool((await client.send(API_VERSIONS())).api_keys)


async def refused(host: str, port: int) -> bool:
    client = await KafkaClient.connect(host, port)
    try:
        return await client.closed_by_peer()
    finally:
        await client.close()


async def refusal_lines(daemon: Daemon, total: int) -> list[tuple[datetime, int]]:
    """The daemon's lines about refused connections, once they count ``total``."""

    def lines(text: str) -> list[tuple[datetime, int]]:
        return [
            (datetime.fromisoformat(stamp.replace("Z", "+00:00")), int(count))
            for stamp, count in _REFUSAL_LINE.findall(text)
        ]

    text = await wait_until(
        lambda: asyncio.to_thread(daemon.stderr_text),
        f"lines about {total} refused connections",
        until=lambda text: sum(count for _, count in lines(text)) >= total,
    )
    return lines(text)


async def test_the_connection_cap_refuses_one_more_counts_and_logs_it(spawn, tmp_path, session):
    daemon = await spawn(
        tmp_path / "data", "--kafka-listener", "127.0.0.1:0", "--kafka-max-connections", "3"
    )
    host, port = kafka_address(daemon.stdout_lines)
    api = Api(session, daemon.url)
    admitted = [await KafkaClient.connect(host, port) for _ in range(3)]
    try:
        for client in admitted:
            assert await served(client)
        assert await refused(host, port)
        await wait_until(lambda: api.metric(REFUSED), f"{REFUSED} 1", until=lambda v: v == 1)
        # A flood of them: every one counted, the lines at least a second apart.
        for _ in range(30):
            assert await refused(host, port)
        await wait_until(lambda: api.metric(REFUSED), f"{REFUSED} 31", until=lambda v: v == 31)
        lines = await refusal_lines(daemon, 31)
        assert sum(count for _, count in lines) == 31
        assert all((b - a).total_seconds() >= 0.95 for (a, _), (b, _) in pairwise(lines)), lines
        # The connections already open are served as before.
        for client in admitted:
            assert await served(client)
        # A place that frees up is taken by the next connection.
        await admitted.pop().close()
        await wait_until(
            lambda: api.metric("sharecoord_kafka_connections"),
            "2 Kafka connections open",
            until=lambda v: v == 2,
        )
        admitted.append(await KafkaClient.connect(host, port))
        assert await served(admitted[-1])
    finally:
        for client in admitted:
            await client.close()
    assert "Traceback" not in await asyncio.to_thread(daemon.stderr_text)
