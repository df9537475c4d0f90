"""The two coordinators under comparison, each reached as a share-partition leader would
reach it: FindCoordinator (v6, key type 2) names the node of every share-partition, and
each RPC goes to that node, split per node when its entries live on several.

``start_kafka`` and ``start_sharecoord`` set the two up alike: the same number of state
partitions, the same snapshot cadence, and the same topics (created in the broker,
registered in sharecoord's topic catalog, so both check topics the same way).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_peer import Broker, BrokerSettings, fetch
from kafka_peer.admin import Connection, create_topic, wait_until_loaded
from tests.harness import Daemon, DaemonConfig
from tests.kafka_client import KafkaClient, as_http, kafka_address, message_class, share_request
from tests.kafka_peer.sequences import Topics

STATE_PARTITIONS = 10
# Small, so that sequences reach the snapshot path (docs/semantics.md §6) often.
RECORDS_PER_SNAPSHOT = 3
TOPIC_PARTITIONS = 8
# A topic id neither side knows: both answer 3 for it.
UNKNOWN_TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"


def start_kafka(workdir: Path) -> tuple[Broker, Topics]:
    """A broker with two topics, every state partition loaded (blocking)."""
    settings = BrokerSettings(
        state_partitions=STATE_PARTITIONS,
        records_per_snapshot=RECORDS_PER_SNAPSHOT,
        extra={"share.coordinator.append.linger.ms": "0"},
    )
    broker = Broker(fetch(), workdir, settings)
    broker.start()
    try:
        with Connection(broker.host, broker.port) as connection:
            known = tuple(
                (create_topic(connection, name, TOPIC_PARTITIONS), TOPIC_PARTITIONS)
                for name in ("differential-1", "differential-2")
            )
            wait_until_loaded(connection, known[0][0], STATE_PARTITIONS)
    except BaseException:
        broker.stop()
        raise
    return broker, Topics(known, UNKNOWN_TOPIC)


def start_sharecoord(workdir: Path, topics: Topics) -> tuple[Daemon, tuple[str, int]]:
    """sharecoord with a Kafka listener and the same topics in its catalog (blocking):
    the daemon and its Kafka listener's address."""
    import json  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    config = DaemonConfig(
        workdir / "data",
        flags=(
            "--topic-catalog",
            "--snapshot-update-records-per-snapshot",
            str(RECORDS_PER_SNAPSHOT),
        ),
        partitions=STATE_PARTITIONS,
        kafka_listener="127.0.0.1:0",
    )
    daemon = Daemon(config).start()  # returns once /readyz answers 200
    for topic_id, count in topics.known:
        request = urllib.request.Request(
            daemon.url + "/v1/admin/topics",
            data=json.dumps({"topic_id": topic_id, "partition_count": count}).encode(),
            headers={"Content-Type": "application/json"},
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert reply.status == 200, reply.read()
    return daemon, kafka_address(daemon.stdout_lines)


@dataclass
class Side:
    """One coordinator, reached through FindCoordinator as a leader reaches it."""

    name: str
    bootstrap: tuple[str, int]
    clients: dict[tuple[str, int], KafkaClient] = field(default_factory=dict)
    coordinators: dict[str, tuple[str, int]] = field(default_factory=dict)
    rpcs: int = 0

    async def client(self, address: tuple[str, int]) -> KafkaClient:
        if address not in self.clients:
            self.clients[address] = await KafkaClient.connect(*address)
        return self.clients[address]

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        self.clients.clear()

    async def locate(self, keys: list[str]) -> dict[str, tuple[str, int]]:
        """The node of each coordinator key (``group:topic_id:partition``), cached."""
        missing = [key for key in dict.fromkeys(keys) if key not in self.coordinators]
        if missing:
            find = message_class("find_coordinator", 6, "request")
            client = await self.client(self.bootstrap)
            answer = await client.send(find(key_type=2, coordinator_keys=tuple(missing)))
            for found in answer.coordinators:
                assert int(found.error_code) == 0, (self.name, found)
                self.coordinators[found.key] = (found.host, found.port)
        return {key: self.coordinators[key] for key in keys}

    async def rpc(self, rpc: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (the HTTP API's JSON shape) sent to the node(s) of its entries; the
        answer in the same shape, the results of every node together."""
        group = body["group_id"]
        per_node: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
        for topic in body["topics"]:
            keys = [f"{group}:{topic['topic_id']}:{e['partition']}" for e in topic["partitions"]]
            nodes = await self.locate(keys)
            for key, entry in zip(keys, topic["partitions"], strict=True):
                topics = per_node.setdefault(nodes[key], {})
                topics.setdefault(topic["topic_id"], []).append(entry)
        results: list[dict[str, Any]] = []
        for address, topics in per_node.items():
            part = {
                "group_id": group,
                "topics": [{"topic_id": t, "partitions": e} for t, e in topics.items()],
            }
            client = await self.client(address)
            answer = as_http(await client.send(share_request(rpc, part, version)))
            self.rpcs += 1
            results += answer["results"]
        return {"results": results}


async def both(
    kafka: Side, sharecoord: Side, rpc: str, version: int, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same request to both sides at once: (Kafka's answer, sharecoord's)."""
    answers = await asyncio.gather(
        kafka.rpc(rpc, version, body), sharecoord.rpc(rpc, version, body)
    )
    return answers[0], answers[1]
