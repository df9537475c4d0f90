"""Compaction throughput (not a test: a measurement).

    /work/devvenv/bin/python -m tests.spark.bench_compact RECORDS [--workload W]
        [--partitions N] [--keys K] [--cache DIR]

Writes a log of RECORDS records through the shard (as the daemon writes them: K keys
per state partition, Kafka's default 500 updates between snapshots),
once per shape into --cache (segments of --segment-bytes, so most of the log is
sealed), then times on a copy of it:

* `sharecoord compact --master local[2]`, end to end (JVM start, the job, the commit
  under DATA/LOCK, as no daemon runs): wall clock, and the job's own summary;
* the same fold in one Python process, without Spark (spark_jobs/fold.py);
* the plain single-process fold: replay every record through ShareStateMap and
  encode one snapshot per key.

Workloads: `acks` (each write acknowledges a new range past the last one, the start
offset following: the state stays one or two batches) and `overlap` (each write
re-states 1-3 ranges overlapping the in-flight window: the merge of SPEC §7 works
hard).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from persistence import PartitionLog, StateLog, list_segments, partition_dir, read_partition
from protocol.batches import StateBatch
from protocol.records import (
    Record,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    encode_record,
    encode_value,
)
from protocol.replay import ShareStateMap
from server.shard import ShardConfig, ShareCoordinatorShard
from spark_jobs.fold import fold_records
from spark_jobs.sealed import read_sealed_segment

REPO_ROOT = Path(__file__).resolve().parents[2]
TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"


def generate(
    data_dir: Path, records: int, partitions: int, keys: int, workload: str, segment_bytes: int
) -> None:
    log = StateLog.open(str(data_dir), partitions, segment_bytes=segment_bytes)
    try:
        for p in range(partitions):
            part = log.partition(p)
            part.open()
            fill_partition(part, p, records // partitions, keys, workload)
    finally:
        log.close()


def fill_partition(part: PartitionLog, p: int, records: int, keys: int, workload: str) -> None:
    rnd = random.Random(p)
    shard = ShareCoordinatorShard(ShardConfig())
    share_keys = [ShareKey(f"group-{p}-{i % 10}", TOPIC, i) for i in range(keys)]
    next_offset = dict.fromkeys(share_keys, 0)

    def emit(new: list[Record]) -> None:
        for record in new:
            record_type, key, value = encode_record(record)
            shard.replay(part.append(record_type, key, value, 1_700_000_000_000), record)

    for key in share_keys:
        emit(shard.initialize(key, 1, 0)[0])
    while part.log_end_offset < records:
        key = rnd.choice(share_keys)
        start = next_offset[key]
        if workload == "acks":
            length = rnd.randint(1, 20)
            next_offset[key] = start + length + 1
            emit(shard.write(key, 1, 0, start, [StateBatch(start, start + length, 2, 1)])[0])
        else:
            batches, first = [], start
            for _ in range(rnd.randint(1, 3)):
                length = rnd.randint(1, 20)
                state, count = rnd.choice([0, 2, 4]), rnd.randint(1, 4)
                batches.append(StateBatch(first, first + length, state, count))
                first += length + 1
            next_offset[key] = start + rnd.randint(0, 10)
            emit(shard.write(key, 1, 0, next_offset[key], batches)[0])
        if part.log_end_offset % 50_000 == 0:
            part.commit()
    part.commit()


def sharecoord_compact(data_dir: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "compact", "--data-dir", str(data_dir),
         "--master", "local[2]"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    (summary,) = [line for line in done.stdout.splitlines() if line.startswith("compaction: ")]
    return seconds, summary


def sealed_records(
    data_dir: Path, partition: int
) -> list[tuple[int, int, int, bytes, bytes | None]]:
    segments = list_segments(partition_dir(str(data_dir), partition))
    records, last = [], -1
    for index, segment in enumerate(segments[:-1]):
        read = read_sealed_segment(
            segment.path, segment.base_offset, after_offset=last,
            below_offset=segments[index + 1].base_offset,
        )  # fmt: skip
        records.extend(read.records)
        last = read.last_offset if read.last_offset is not None else last
    return records


def two_phase_fold(data_dir: Path, partitions: int) -> tuple[float, int]:
    started, count = time.perf_counter(), 0
    for p in range(partitions):
        records = sealed_records(data_dir, p)
        count += len(records)
        fold_records(records, tombstone_cutoff_ms=0)
    return time.perf_counter() - started, count


def plain_fold(data_dir: Path, partitions: int) -> tuple[float, int]:
    """Replay everything, then one snapshot per key: the obvious fold."""
    started, count = time.perf_counter(), 0
    for p in range(partitions):
        state, decoder = ShareStateMap(500), RecordDecoder()
        for frame in read_partition(partition_dir(str(data_dir), p)):
            state.replay(frame.offset, decoder.decode(frame.record_type, frame.key, frame.value))
            count += 1
        for key, entry in state.keys.items():
            s = entry.state
            encode_value(
                ShareSnapshot(
                    key, *s[:7], s.delivery_complete_count, entry.leader_fence, entry.state_fence
                )
            )
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=int)
    parser.add_argument("--workload", choices=["acks", "overlap"], default="acks")
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--keys", type=int, default=100, help="keys per state partition")
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/sharecoord-bench"))
    args = parser.parse_args()
    name = f"{args.workload}-{args.records}-{args.partitions}x{args.keys}-{args.segment_bytes}"
    pristine = args.cache / name
    args.cache.mkdir(parents=True, exist_ok=True)
    if not pristine.exists():
        started = time.perf_counter()
        partial = args.cache / f"{name}.tmp"
        shutil.rmtree(partial, ignore_errors=True)
        generate(
            partial, args.records, args.partitions, args.keys, args.workload, args.segment_bytes
        )
        partial.rename(pristine)
        print(f"generated {name} in {time.perf_counter() - started:.0f} s")
    work = args.cache / f"{name}.work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    try:
        seconds, summary = sharecoord_compact(work)
        records = int(re.search(r"records (\d+) ->", summary).group(1))  # type: ignore[union-attr]
        print(f"{name}: sharecoord compact (local[2], end to end): {seconds:.1f} s, "
              f"{records / seconds:,.0f} records/s")  # fmt: skip
        print(f"  {summary}")
    finally:
        shutil.rmtree(work)
    seconds, count = two_phase_fold(pristine, args.partitions)
    print(f"  two-phase fold, one process: {seconds:.1f} s, {count / seconds:,.0f} records/s")
    seconds, count = plain_fold(pristine, args.partitions)
    print(f"  plain replay fold, one process: {seconds:.1f} s, {count / seconds:,.0f} records/s")


if __name__ == "__main__":
    main()
