"""Pruning (docs/semantics.md §9, §A) never changes the state a log replays to.

Random RPC histories run through the shard into a real partition log with small
segments; the prune mark is the shard's last redundant offset; whole sealed segments
below it are deleted; replaying what is left gives the same admin state for every key,
fencing maxima included (docs/semantics.md §A.1 point 12).
"""

from __future__ import annotations

import random

import pytest

from persistence import StateLog
from protocol.records import (
    RecordDecoder,
    ShareKey,
    encode_key,
    encode_value,
    record_type,
)
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch
from tests.shard.ops import ColdSnapshotOp, DeleteOp, InitializeOp, ReadOp, WriteOp, handle

TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"
KEYS = [ShareKey(f"g{g}", TOPIC, p) for g in range(3) for p in range(3)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def random_op(rng: random.Random, leader_epochs: dict[ShareKey, int]):
    key = rng.choice(KEYS)
    roll = rng.random()
    if roll < 0.15:
        return InitializeOp(key, rng.randint(-1, 2), rng.choice([-1, 0, rng.randint(0, 50)]))
    if roll < 0.25:
        leader_epochs[key] = leader_epochs.get(key, 0) + rng.randint(0, 1)
        return ReadOp(key, leader_epochs[key])
    if roll < 0.30:
        return DeleteOp(key)
    first = rng.randint(0, 60)
    batches = [
        StateBatch(first, first + rng.randint(0, 9), rng.choice([0, 1, 2, 4]), rng.randint(0, 4))
        for _ in range(rng.randint(0, 3))
    ]
    return WriteOp(key, -1, -1, rng.choice([-1, rng.randint(0, 40)]), batches, rng.randint(-1, 5))


def replay(log_records, config: ShardConfig) -> ShareCoordinatorShard:
    shard = ShareCoordinatorShard(config)
    decoder = RecordDecoder()
    for frame in log_records:
        shard.replay(frame.offset, decoder.decode(frame.record_type, frame.key, frame.value))
    return shard


def admin_states(shard: ShareCoordinatorShard) -> dict:
    return {key: shard.admin_state(key) for key in shard}


@pytest.mark.parametrize("seed", range(12))
def test_9_state_replayed_after_pruning_equals_the_state_before(tmp_path, seed):
    rng = random.Random(seed)
    config = ShardConfig(records_per_snapshot=rng.choice([0, 2, 5]))
    clock = Clock()
    shard = ShareCoordinatorShard(config, now_ms=clock)
    leader_epochs: dict[ShareKey, int] = {}
    with StateLog.open(str(tmp_path / "data"), 1, segment_bytes=1024) as state_log:
        log = state_log.partition(0)
        log.open()
        for step in range(600):
            clock.now += rng.randint(0, 50)
            op = ColdSnapshotOp() if step % 97 == 96 else random_op(rng, leader_epochs)
            records, _ = handle(shard, op)
            for record in records:
                offset = log.append(
                    record_type(record), encode_key(record.key), encode_value(record), clock.now
                )
                shard.replay(offset, record)
        log.commit()
        before = admin_states(shard)
        assert before == admin_states(replay(log.read(), config))

        mark = shard.last_redundant_offset()
        segments_before = log.segments
        deleted = log.prune(mark) if mark is not None else []
        remaining = log.segments

        # Segments below the mark are gone, none at or above it.
        for segment in segments_before:
            successor = next(
                (s for s in segments_before if s.base_offset > segment.base_offset), None
            )
            below_mark = (
                successor is not None and mark is not None and successor.base_offset <= mark
            )
            assert (segment.path in deleted) == below_mark
        assert (
            remaining[-1] == segments_before[-1] or remaining[-1].path == segments_before[-1].path
        )
        # The state is unchanged, read back from what is left.
        assert admin_states(replay(log.read(), config)) == before


def test_9_history_long_enough_to_prune_really_prunes(tmp_path):
    """The parametrized test above must exercise deletion, not only the empty case."""
    rng = random.Random(7)
    config = ShardConfig(records_per_snapshot=0)
    clock = Clock()
    shard = ShareCoordinatorShard(config, now_ms=clock)
    with StateLog.open(str(tmp_path / "data"), 1, segment_bytes=1024) as state_log:
        log = state_log.partition(0)
        log.open()
        for key in KEYS:
            for record in handle(shard, InitializeOp(key, 0, 0))[0]:
                shard.replay(
                    log.append(
                        record_type(record), encode_key(record.key), encode_value(record), clock.now
                    ),
                    record,
                )
        for _ in range(400):
            op = WriteOp(rng.choice(KEYS), 0, 0, -1, [StateBatch(1, 2, 2, 1)], -1)
            for record in handle(shard, op)[0]:
                shard.replay(
                    log.append(
                        record_type(record), encode_key(record.key), encode_value(record), clock.now
                    ),
                    record,
                )
        log.commit()
        mark = shard.last_redundant_offset()
        assert mark is not None
        deleted = log.prune(mark)
        assert deleted
        assert admin_states(replay(log.read(), config)) == admin_states(shard)
