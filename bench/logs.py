"""Building large state logs for the recovery and Spark scenarios.

The records come from the shard itself (initialize, then writes like the HTTP
workload's), appended through persistence exactly as the daemon appends them, so
loading and compacting them exercises the real formats and the real replay.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.workload import TOPIC_ID, WINDOW
from persistence import StateLog
from protocol.messages import InitializePartition, WritePartition
from protocol.records import Record, ShareKey, encode_key, encode_value, record_type
from protocol.routing import partition_for
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch

NUM_PARTITIONS = 50
WRITES_PER_KEY = 50  # with 500 updates per snapshot, every record replays in full


@dataclass
class BuiltLog:
    data_dir: Path
    records: int
    keys: int
    bytes: int
    seconds: float


def build_log(
    data_dir: Path,
    records: int,
    *,
    seed: int = 1,
    segment_bytes: int = 100 * 1024 * 1024,
    writes_per_key: int = WRITES_PER_KEY,
    progress: bool = True,
    pause_at: int | None = None,
    on_pause: Callable[[], None] | None = None,
) -> BuiltLog:
    """A data directory of about `records` records over `records / writes_per_key`
    share-partitions. Small `segment_bytes` seal most of the log, for compaction to work
    on. With `pause_at`, once that many records are written and committed `on_pause`
    runs (an audit that leaves a checkpoint, say) and the rest are written a day later:
    their timestamps are one day on."""
    started = time.monotonic()
    rng = random.Random(seed)
    keys_wanted = max(1, records // writes_per_key)
    keys = [ShareKey(f"log-group-{i % 1000}", TOPIC_ID, i // 1000) for i in range(keys_wanted)]
    shards = [ShareCoordinatorShard(ShardConfig()) for _ in range(NUM_PARTITIONS)]
    owner = {k: partition_for(k.group_id, k.topic_id, k.partition, NUM_PARTITIONS) for k in keys}
    now = 1_795_000_000_000
    written = 0
    with StateLog.open(str(data_dir), NUM_PARTITIONS, segment_bytes=segment_bytes) as log:
        logs = [log.partition(p) for p in range(NUM_PARTITIONS)]
        for partition_log in logs:
            partition_log.open()

        def append(p: int, record: Record | None) -> None:
            nonlocal written
            if record is not None:
                offset = logs[p].append(
                    record_type(record), encode_key(record.key), encode_value(record), now
                )
                shards[p].replay(offset, record)
                written += 1

        for key in keys:
            p = owner[key]
            append(p, shards[p].initialize(key, InitializePartition(key.partition, 0, 0))[0])
        round_ = 0
        while written < records:
            for key in keys:
                if written >= records:
                    break
                if pause_at is not None and written == pause_at:
                    for partition_log in logs:
                        partition_log.commit()
                    if on_pause is not None:
                        on_pause()
                    pause_at = None
                    now += 86_400_000
                first = rng.randrange(WINDOW) + round_ * 10
                entry = WritePartition(
                    key.partition,
                    0,
                    0,
                    round_ * 10 if rng.random() < 0.1 else -1,
                    [StateBatch(first, first + 9, rng.choice((0, 2, 2, 4)), rng.randint(1, 3))],
                )
                p = owner[key]
                append(p, shards[p].write(key, entry)[0])
            round_ += 1
            for partition_log in logs:
                partition_log.commit()
            if progress:
                print(f"  built {written:,} of {records:,} records", flush=True)
        for partition_log in logs:
            partition_log.commit()
        size = sum(partition_log.size_bytes for partition_log in logs)
    return BuiltLog(data_dir, written, len(keys), size, time.monotonic() - started)
