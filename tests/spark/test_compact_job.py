"""The compaction job through Spark (local[2]) on real data directories: the state
replayed after compaction is the state before, the log verifies, it shrinks to one
record per key plus the active segment, and the commit handshake follows
docs/design.md#compaction-and-its-swap."""

from __future__ import annotations

import os
import random
import re
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from persistence import StateLog, partition_dir, pending_staged, read_partition, verify
from protocol.records import ShareKey, encode_key
from protocol.state_batch import StateBatch
from spark_jobs import compact
from tests.shard.ops import DeleteOp, InitializeOp, Op, WriteOp
from tests.spark.histories import (
    KEYS,
    Appended,
    decoded,
    log_bytes,
    operations,
    raw_records,
    replayed_shard,
    run_rpcs,
    state_partition_of,
    states_on_disk,
    write_log,
)

NUM_PARTITIONS = 3
SEGMENT_BYTES = 700
KEEP_TOMBSTONES = 10**15
RECORDS_PER_SNAPSHOT = 4
long_rpc_histories = st.lists(operations, min_size=80, max_size=200)


def compact_dir(
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    data_dir: str,
    retention_ms: int = KEEP_TOMBSTONES,
) -> tuple[int, list[str]]:
    argv = ["--data-dir", data_dir, "--tombstone-retention-ms", str(retention_ms)]
    code = compact.main(argv, spark=spark)
    return code, capsys.readouterr().out.splitlines()


def busy_history(
    seed: int, writes: int = 150, *, snapshot_every_key: bool = False
) -> list[Appended]:
    """Every key initialized, then many writes and a few deletes; the first key ends
    deleted (then more writes to the others), unless every key ends with a fresh
    snapshot (so the prune mark moves)."""
    rnd = random.Random(seed)
    ops: list[Op] = [InitializeOp(key, 1, 0) for key in KEYS]
    for i in range(writes):
        key = rnd.choice(KEYS)
        if i % 40 == 39:
            ops.append(DeleteOp(key))
            ops.append(InitializeOp(key, 2, -1))
        else:
            ops.append(random_write(rnd, key))
    if snapshot_every_key:
        ops.extend(random_write(rnd, key) for key in KEYS for _ in range(RECORDS_PER_SNAPSHOT + 1))
    else:  # the first key deleted early enough that its tombstone gets sealed
        ops.append(DeleteOp(KEYS[0]))
        ops.extend(random_write(rnd, rnd.choice(KEYS[1:])) for _ in range(60))
    return run_rpcs(ops, NUM_PARTITIONS, RECORDS_PER_SNAPSHOT)


def random_write(rnd: random.Random, key: ShareKey) -> WriteOp:
    first = rnd.randint(0, 30)
    batch = StateBatch(first, first + rnd.randint(0, 5), rnd.choice([0, 2, 4]), rnd.randint(1, 4))
    return WriteOp(key, -1, -1, rnd.randint(-1, 10), [batch])


def segment_counts(data_dir: str) -> list[int]:
    return [len(log_bytes(data_dir, p)) for p in range(NUM_PARTITIONS)]


def active_segments(data_dir: str) -> list[bytes]:
    out = []
    for p in range(NUM_PARTITIONS):
        name = log_bytes(data_dir, p)[-1][0]
        with open(os.path.join(partition_dir(data_dir, p), name), "rb") as f:
            out.append(f.read())
    return out


def summary(lines: list[str]) -> str:
    (line,) = [line for line in lines if line.startswith("compaction: ")]
    return line


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(long_rpc_histories)
def test_after_compaction_the_log_replays_to_the_same_state_and_holds_one_record_per_key(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], ops: list[Op]
) -> None:
    ops = [InitializeOp(key, 0, 0) for key in KEYS] + ops
    appended = run_rpcs(ops, NUM_PARTITIONS, records_per_snapshot=2)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        write_log(data_dir, appended, NUM_PARTITIONS, SEGMENT_BYTES)
        before = states_on_disk(data_dir)
        actives = active_segments(data_dir)
        sealed_keys = [_keys_below_active(data_dir, p) for p in range(NUM_PARTITIONS)]

        code, lines = compact_dir(spark, capsys, data_dir)

        assert code == 0
        assert compact.COMMITTED_SELF in lines
        assert states_on_disk(data_dir) == before
        assert verify(data_dir).ok
        assert active_segments(data_dir) == actives  # never touched
        assert any(keys is not None for keys in sealed_keys)
        for p in range(NUM_PARTITIONS):
            files = log_bytes(data_dir, p)
            if sealed_keys[p] is None:  # nothing sealed: nothing to do
                continue
            assert len(files) == 2  # the compacted segment, then the active one
            compacted = list(read_partition(partition_dir(data_dir, p)))
            below_active = [r for r in compacted if r.offset < _active_base(data_dir, p)]
            keys = sealed_keys[p]
            assert keys is not None
            assert len(below_active) == len(keys)  # one record per key
            assert {r.key for r in below_active} == keys


def _active_base(data_dir: str, partition: int) -> int:
    return int(log_bytes(data_dir, partition)[-1][0].split(".")[0])


def _keys_below_active(data_dir: str, partition: int) -> set[bytes] | None:
    if len(log_bytes(data_dir, partition)) < 2:
        return None
    base = _active_base(data_dir, partition)
    return {r.key for r in read_partition(partition_dir(data_dir, partition)) if r.offset < base}


def test_a_busy_log_compacts_and_reports_a_summary(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    appended = busy_history(seed=1)
    write_log(data_dir, appended, NUM_PARTITIONS, SEGMENT_BYTES)
    before = states_on_disk(data_dir)
    counts = segment_counts(data_dir)
    size = sum(b for p in range(NUM_PARTITIONS) for _, b in log_bytes(data_dir, p))

    code, lines = compact_dir(spark, capsys, data_dir)

    assert code == 0
    assert states_on_disk(data_dir) == before
    assert segment_counts(data_dir) == [min(c, 2) for c in counts]
    after = sum(b for p in range(NUM_PARTITIONS) for _, b in log_bytes(data_dir, p))
    match = re.fullmatch(
        r"compaction: (\d+) of 3 partitions compacted \(\d+ skipped, 0 failed\); "
        r"segments (\d+) -> (\d+); bytes (\d+) -> (\d+); records (\d+) -> (\d+); "
        r"keys (\d+); tombstones dropped 0; "
        r"history: (\d+) records of (\d+) segments exported to \S+; [\d.]+ s",
        summary(lines),
    )
    assert match is not None, summary(lines)
    compacted, seg_before, seg_after, bytes_before, bytes_after = map(int, match.groups()[:5])
    assert compacted == seg_after == sum(c > 1 for c in counts)
    assert seg_before == sum(c - 1 for c in counts if c > 1)
    assert bytes_before - bytes_after == size - after > 0
    records_before, exported, exported_segments = (int(match.group(i)) for i in (6, 9, 10))
    # Everything folded away went to the history first.
    assert (exported, exported_segments) == (records_before, seg_before)
    assert any("stage" in line and "fold the sealed segments" in line for line in lines)


def test_tombstones_older_than_the_retention_leave_no_record(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    appended = busy_history(seed=2)
    write_log(data_dir, appended, NUM_PARTITIONS, SEGMENT_BYTES)
    before = states_on_disk(data_dir)
    deleted = KEYS[0]
    p = state_partition_of(deleted, NUM_PARTITIONS)

    code, lines = compact_dir(spark, capsys, data_dir, retention_ms=0)

    assert code == 0
    assert states_on_disk(data_dir) == before
    dropped = int(re.search(r"tombstones dropped (\d+)", summary(lines)).group(1))  # type: ignore[union-attr]
    assert dropped >= 1
    key = encode_key(deleted)
    base = _active_base(data_dir, p)
    assert [
        r for r in read_partition(partition_dir(data_dir, p)) if r.key == key and r.offset < base
    ] == []


def test_a_second_run_finds_nothing_to_gain(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    write_log(data_dir, busy_history(seed=3), NUM_PARTITIONS, SEGMENT_BYTES)
    assert compact_dir(spark, capsys, data_dir)[0] == 0
    files = [log_bytes(data_dir, p) for p in range(NUM_PARTITIONS)]

    code, lines = compact_dir(spark, capsys, data_dir)

    assert code == 0
    assert summary(lines).startswith("compaction: 0 of 3 partitions compacted (3 skipped")
    assert [log_bytes(data_dir, p) for p in range(NUM_PARTITIONS)] == files


def test_while_the_daemon_holds_the_lock_the_output_is_staged_for_it_to_commit(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    write_log(data_dir, busy_history(seed=4), NUM_PARTITIONS, SEGMENT_BYTES)
    before = states_on_disk(data_dir)
    counts = segment_counts(data_dir)
    daemon = StateLog.open(data_dir, NUM_PARTITIONS, segment_bytes=SEGMENT_BYTES)
    try:
        for p in range(NUM_PARTITIONS):
            daemon.partition(p).open()

        code, lines = compact_dir(spark, capsys, data_dir)

        assert code == 0
        assert compact.STAGED_FOR_DAEMON in lines
        assert compact.COMMITTED_SELF not in lines
        assert segment_counts(data_dir) == counts  # nothing swapped yet
        staged = {p: pending_staged(partition_dir(data_dir, p)) for p in range(NUM_PARTITIONS)}
        assert staged == {p: [0] if counts[p] > 1 else [] for p in range(NUM_PARTITIONS)}

        # A second run while the output waits: those partitions are left alone.
        code, lines = compact_dir(spark, capsys, data_dir)
        assert code == 0
        assert any("already staged at base 0" in line for line in lines)

        # The daemon commits (its periodic scan, or POST /v1/admin/compaction/commit).
        for p, bases in staged.items():
            for base in bases:
                assert daemon.partition(p).commit_staged(base) == "committed"
    finally:
        daemon.close()
    assert segment_counts(data_dir) == [min(c, 2) for c in counts]
    assert states_on_disk(data_dir) == before
    assert verify(data_dir).ok


def test_output_made_stale_by_a_prune_is_deleted_by_the_next_commit(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    appended = busy_history(seed=5, writes=300, snapshot_every_key=True)
    write_log(data_dir, appended, NUM_PARTITIONS, SEGMENT_BYTES)
    before = states_on_disk(data_dir)
    daemon = StateLog.open(data_dir, NUM_PARTITIONS, segment_bytes=SEGMENT_BYTES)
    try:
        shards = {
            p: replayed_shard(decoded(raw_records(a for a in appended if a.state_partition == p)))
            for p in range(NUM_PARTITIONS)
        }
        for p in range(NUM_PARTITIONS):
            daemon.partition(p).open()
        assert compact_dir(spark, capsys, data_dir)[0] == 0
        # Before the daemon commits, its prune job deletes segments below its mark.
        pruned = []
        for p in range(NUM_PARTITIONS):
            mark = shards[p].last_redundant_offset()
            if mark is not None and daemon.partition(p).prune(mark):
                pruned.append(p)
        assert pruned
    finally:
        daemon.close()

    code, lines = compact_dir(spark, capsys, data_dir)

    assert code == 0
    for p in pruned:
        assert f"partition {p}: output staged at 0 was stale: deleted" in lines
    assert compact.COMMITTED_SELF in lines
    assert all(pending_staged(partition_dir(data_dir, q)) == [] for q in range(NUM_PARTITIONS))
    assert states_on_disk(data_dir) == before
    assert verify(data_dir).ok


def test_a_damaged_sealed_segment_fails_its_partition_alone(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    write_log(data_dir, busy_history(seed=6), NUM_PARTITIONS, SEGMENT_BYTES)
    damaged = max(range(NUM_PARTITIONS), key=lambda p: len(log_bytes(data_dir, p)))
    name, _ = log_bytes(data_dir, damaged)[0]
    path = os.path.join(partition_dir(data_dir, damaged), name)
    with open(path, "r+b") as f:
        f.seek(50)
        byte = f.read(1)
        f.seek(50)
        f.write(bytes([byte[0] ^ 0xFF]))
    files = log_bytes(data_dir, damaged)

    code, lines = compact_dir(spark, capsys, data_dir)

    assert code == compact.EXIT_FAILURE
    assert any(
        line.startswith(f"compact: partition {damaged}: failed: LogCorruptionError")
        and "checksum" in line
        for line in lines
    )
    assert log_bytes(data_dir, damaged) == files
    assert pending_staged(partition_dir(data_dir, damaged)) == []
    others = [p for p in range(NUM_PARTITIONS) if p != damaged and len(files) > 1]
    assert all(len(log_bytes(data_dir, p)) <= 2 for p in others)


def test_a_partition_with_only_its_active_segment_is_skipped(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    write_log(data_dir, busy_history(seed=7, writes=5), NUM_PARTITIONS, 10**6)
    code, lines = compact_dir(spark, capsys, data_dir)
    assert code == 0
    # Said at once, without a Spark job, and nothing claims to have staged or committed.
    assert lines == [f"{compact.NOTHING_SEALED} (segments roll at 104857600 bytes)"]
