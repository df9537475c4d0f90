"""The CPU cost of one write entry, without HTTP and without fsync.

    python -m bench.entry_cost [--requests N] [--per-request K]

Decode the bench's write bodies (msgpack), run every entry through the service's
path (route, shard rule, record, frame into the partition's buffer, replay), and encode
the answer: what a write costs the event loop but the HTTP framing, the group commit,
and the service's bookkeeping around each entry (its status checks, and placing its
result for the durability wait). After each request the pending frames of the
partitions it appended to are taken, as a commit cycle takes its dirty set, and
dropped. Reported in µs of CPU per share-partition entry. The measured requests run
with the daemon's young-collection threshold (``server.daemon``), as its event loop
does, not Python's default one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack

from bench.workload import GROUPS, PARTITIONS_PER_GROUP, TOPIC_ID, group_name, write_bodies
from persistence import StateLog
from protocol import codec
from protocol.codec import Format
from protocol.messages import Rpc, ShareGroupStateRequest, ShareGroupStateResponse, TopicResult
from protocol.records import ShareKey
from protocol.routing import partition_for_prefix, prefix_hash
from protocol.shard import ShardConfig
from server.daemon import YOUNG_COLLECTION_THRESHOLD
from server.runtime import PartitionRuntime

NUM_PARTITIONS = 50


@dataclass(frozen=True)
class EntryCost:
    entries: int
    per_request: int
    seconds_cpu: float

    @property
    def us_per_entry(self) -> float:
        return self.seconds_cpu / self.entries * 1e6


def _run(
    runtimes: dict[int, PartitionRuntime],
    rpc: Rpc,
    request: ShareGroupStateRequest,
    touched: set[PartitionRuntime],
) -> list:
    """The service's per-entry loop without the durability wait (which needs a loop);
    ``touched`` gets the runtimes the request appended to (the commit's dirty set)."""
    out = []
    group_id = request.group_id
    for topic in request.topics:
        prefix = prefix_hash(group_id, topic.key_topic_id)
        results = []
        for entry in topic.partitions:
            runtime = runtimes[partition_for_prefix(prefix, entry.partition, NUM_PARTITIONS)]
            key = ShareKey(group_id, topic.key_topic_id, entry.partition)
            done = runtime.execute_now(rpc, key, entry)
            if done is None:
                raise RuntimeError(f"a long entry: {entry!r}")  # none in this workload
            results.append(done[0])
            touched.add(runtime)
        out.append(results)
    return out


def measure(requests: int, per_request: int, seed: int = 932) -> EntryCost:
    with tempfile.TemporaryDirectory(prefix="sharecoord-entry-cost-") as data_dir:
        log = StateLog.open(data_dir, NUM_PARTITIONS)
        runtimes = {
            p: PartitionRuntime(p, log.partition(p), ShardConfig()) for p in range(NUM_PARTITIONS)
        }
        for runtime in runtimes.values():
            asyncio.run(runtime.load())

        touched: set[PartitionRuntime] = set()

        def drain() -> None:
            # What a commit cycle takes: the partitions appended to since the last one.
            for runtime in touched:
                runtime.log.take_pending()
            touched.clear()

        for g in range(GROUPS):
            body = {
                "group_id": group_name(g),
                "topics": [
                    {
                        "topic_id": TOPIC_ID,
                        "partitions": [
                            {"partition": p, "state_epoch": 0, "start_offset": 0}
                            for p in range(PARTITIONS_PER_GROUP)
                        ],
                    }
                ],
            }
            request = codec.decode_request(Rpc.INITIALIZE, msgpack.packb(body), Format.MSGPACK)
            _run(runtimes, Rpc.INITIALIZE, request, touched)
            drain()
        rng = random.Random(seed)
        # Warm the states up to the few batches the HTTP workload keeps them at.
        for body in write_bodies(rng, 2_000, 50):
            raw = msgpack.packb(body)
            _run(runtimes, Rpc.WRITE, codec.decode_request(Rpc.WRITE, raw, Format.MSGPACK), touched)
            drain()
        bodies = [msgpack.packb(b) for b in write_bodies(rng, requests, per_request)]
        with _the_daemons_collector():
            started = time.process_time()
            for raw in bodies:
                request = codec.decode_request(Rpc.WRITE, raw, Format.MSGPACK)
                results = _run(runtimes, Rpc.WRITE, request, touched)
                response = ShareGroupStateResponse(
                    [
                        TopicResult(topic.topic_id, topic_results)
                        for topic, topic_results in zip(request.topics, results, strict=True)
                    ]
                )
                codec.encode_response(response, Format.MSGPACK)
                drain()
            seconds = time.process_time() - started
        log.close()
    return EntryCost(requests * per_request, per_request, seconds)


@contextlib.contextmanager
def _the_daemons_collector() -> Iterator[None]:
    """The young-collection threshold the daemon sets once up, restored after."""
    thresholds = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.entry_cost", description=__doc__)
    parser.add_argument("--requests", type=int, default=4_000)
    parser.add_argument("--per-request", type=int, default=50)
    args = parser.parse_args(argv)
    cost = measure(args.requests, args.per_request)
    print(
        f"{cost.entries:,} entries, {cost.per_request} per request: "
        f"{cost.us_per_entry:.2f} µs of CPU per entry"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
