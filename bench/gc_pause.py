"""How long a full garbage collection stops the daemon, with a state loaded.

    python -m bench.gc_pause DATA_DIR [--partitions N] [--rounds K]

Loads every state partition of DATA_DIR into its shard the way the daemon does at
start-up (PartitionRuntime.load, then its background fold), then times a full collection
(gc.collect()) K times. CPython's full collection walks every object its collector
tracks, with the event loop stopped meanwhile: whatever the daemon keeps per
share-partition and the collector tracks makes that pause grow with the state. The
daemon freezes what it holds before the state loads (server.daemon), so the state is
what such a pause walks in a daemon that has run a while. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from typing import Any

from persistence import StateLog
from protocol.shard import ShardConfig
from server.runtime import PartitionRuntime


def measure(data_dir: str, partitions: int = 50, rounds: int = 5) -> dict[str, Any]:
    log = StateLog.open(data_dir, partitions)
    try:
        runtimes = [PartitionRuntime(p, log.partition(p), ShardConfig()) for p in range(partitions)]

        async def load(runtime: PartitionRuntime) -> None:
            await runtime.load()
            await runtime.wait_folded()  # the tails a lazy load keeps until folded

        for runtime in runtimes:
            asyncio.run(load(runtime))
        share_partitions = sum(len(runtime.shard) for runtime in runtimes)
        gc.collect()  # the load's own garbage
        pauses = []
        for _ in range(rounds):
            started = time.perf_counter()
            gc.collect()
            pauses.append((time.perf_counter() - started) * 1000)
        return {
            "share_partitions": share_partitions,
            "tracked_objects": len(gc.get_objects()),
            "full_collection_ms": statistics.median(pauses),
        }
    finally:
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_pause", description=__doc__)
    parser.add_argument("data_dir")
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.data_dir, args.partitions, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
