"""What a request waits for before it is answered, and what a failed commit turns into
15: the service's side of "nothing is acknowledged before it is durable".

Real runtimes over a real log; the group commit is a stand-in that records the offsets
each request waits for and answers as a test tells it (every partition durable, or one
that failed with its durable end somewhere in the request's records).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from persistence import DurabilityBarrier, StateLog
from persistence.errors import DurabilityError
from protocol import codec, errors
from protocol.codec import Format
from protocol.messages import Rpc
from protocol.routing import partition_for_prefix, prefix_hash
from protocol.shard import ShardConfig
from server.runtime import PartitionRuntime
from server.service import CoordinatorService
from tests.harness import TOPIC

NUM_PARTITIONS = 4
GROUP = "durability"


class RecordingCommitter:
    """Records each request's targets; ``durable_end`` (partition -> offset) makes that
    partition's commit fail with its durability at that offset."""

    refusing_writes = False
    journal_bytes = 0

    def __init__(self) -> None:
        self.targets: list[dict[int, int]] = []
        self.durable_end: dict[int, int] = {}

    def wait_durable_many(self, targets: dict[int, int]) -> DurabilityBarrier:
        self.targets.append(dict(targets))
        barrier = DurabilityBarrier(asyncio.get_running_loop().create_future())
        for partition, end in self.durable_end.items():
            if partition in targets:
                barrier.failed[partition] = DurabilityError(partition, OSError("test"), end)
        barrier.future.set_result(barrier.failed)
        return barrier


class _Cluster:
    num_partitions = NUM_PARTITIONS


@dataclass
class Node:
    service: CoordinatorService
    committer: RecordingCommitter
    runtimes: dict[int, PartitionRuntime]
    log: StateLog

    async def call(self, rpc: Rpc, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raw = msgpack.packb(
            {"group_id": GROUP, "topics": [{"topic_id": TOPIC, "partitions": entries}]}
        )
        response = await self.service.handle(rpc, codec.decode_request(rpc, raw, Format.MSGPACK))
        answer = msgpack.unpackb(codec.encode_response(response, Format.MSGPACK))
        results: list[dict[str, Any]] = answer["results"][0]["partitions"]
        return results


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    # Files are opened, synced and closed in a thread: the loop runs (tests/conftest.py).
    log = await asyncio.to_thread(StateLog.open, str(tmp_path), NUM_PARTITIONS)
    runtimes = {
        p: PartitionRuntime(p, log.partition(p), ShardConfig()) for p in range(NUM_PARTITIONS)
    }
    for runtime in runtimes.values():
        await runtime.load()
    committer = RecordingCommitter()
    service = CoordinatorService(
        runtimes=runtimes,
        committer=committer,
        cluster=_Cluster(),  # type: ignore[arg-type]
        node_id=0,
        catalog=None,  # type: ignore[arg-type]
        write_timeout_ms=30_000,
    )
    yield Node(service, committer, runtimes, log)
    for runtime in runtimes.values():
        await runtime.close()
    await asyncio.to_thread(log.close)


def _same_state_partition(count: int) -> tuple[int, list[int]]:
    """A state partition and ``count`` topic partitions whose keys it holds."""
    topic_id = (
        codec.decode_request(
            Rpc.READ_SUMMARY,
            msgpack.packb({"group_id": GROUP, "topics": [{"topic_id": TOPIC, "partitions": []}]}),
            Format.MSGPACK,
        )
        .topics[0]
        .key_topic_id
    )
    prefix = prefix_hash(GROUP, topic_id)
    by_state: dict[int, list[int]] = {}
    for partition in range(1000):
        there = by_state.setdefault(partition_for_prefix(prefix, partition, NUM_PARTITIONS), [])
        there.append(partition)
        if len(there) == count:
            return partition_for_prefix(prefix, partition, NUM_PARTITIONS), there
    raise AssertionError("no state partition holds enough keys")


def _write(partition: int, first: int) -> dict[str, Any]:
    return {
        "partition": partition,
        "state_epoch": 0,
        "leader_epoch": 0,
        "start_offset": 0,
        "state_batches": [
            {
                "first_offset": first,
                "last_offset": first + 9,
                "delivery_state": 2,
                "delivery_count": 1,
            }
        ],
    }


async def _initialize(node: Node, partitions: list[int]) -> None:
    init = [{"partition": p, "state_epoch": 0, "start_offset": 0} for p in partitions]
    assert all(r["error_code"] == 0 for r in await node.call(Rpc.INITIALIZE, init))


async def test_a_request_waits_for_the_last_record_it_appended_on_each_partition(
    node: Node,
) -> None:
    state_partition, partitions = _same_state_partition(4)
    await _initialize(node, partitions)
    log = node.runtimes[state_partition].log
    before = log.log_end_offset
    results = await node.call(Rpc.WRITE, [_write(p, 10 * i) for i, p in enumerate(partitions)])
    assert [r["error_code"] for r in results] == [0] * 4
    assert log.log_end_offset == before + 4
    assert node.committer.targets[-1] == {state_partition: log.log_end_offset - 1}


async def test_an_entry_whose_record_the_commit_lost_answers_15_and_so_does_every_later_one(
    node: Node,
) -> None:
    state_partition, partitions = _same_state_partition(4)
    await _initialize(node, partitions)
    first = node.runtimes[state_partition].log.log_end_offset
    # The commit made the first two of the four records durable, and failed.
    node.committer.durable_end[state_partition] = first + 2
    results = await node.call(Rpc.WRITE, [_write(p, 10 * i) for i, p in enumerate(partitions)])
    unavailable = errors.COORDINATOR_NOT_AVAILABLE
    assert [r["error_code"] for r in results] == [0, 0, unavailable, unavailable]


async def test_a_read_of_a_quiet_key_waits_for_nothing_and_one_after_a_write_waits_for_it(
    node: Node,
) -> None:
    state_partition, (quiet, busy) = _same_state_partition(2)
    await _initialize(node, [quiet, busy])
    log = node.runtimes[state_partition].log
    await asyncio.to_thread(
        node.log.partition(state_partition).commit
    )  # both keys durable, as a commit cycle leaves them
    node.committer.targets.clear()
    await node.call(Rpc.WRITE, [_write(busy, 0)])  # not durable: no cycle runs here
    written = log.log_end_offset - 1
    assert log.durable_end_offset == written
    await node.call(Rpc.READ_SUMMARY, [{"partition": quiet, "leader_epoch": -1}])
    await node.call(
        Rpc.READ_SUMMARY,
        [{"partition": quiet, "leader_epoch": -1}, {"partition": busy, "leader_epoch": -1}],
    )
    # The write waited for its record, the quiet read for nothing (no wait at all), the
    # read that shows the written key for that record.
    assert node.committer.targets == [{state_partition: written}, {state_partition: written}]
