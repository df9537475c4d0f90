"""A partition loads lazily (protocol/loading.py, server/runtime.py): it serves as soon as
its records are read and checked, and the merges of each key's updates follow in the
background, a slice of the loop at a time, once no partition is loading. A key with a long
tail is folded off the loop, whether the background fold or a request gets to it first.
The background fold here waits behind a load the test holds open, so what is asserted is
who folded what, never how long anything took."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest

import protocol.loading
from persistence import StateLog
from protocol.batches import StateBatch
from protocol.loading import INLINE_FOLD_RECORDS, LazyKeyState
from protocol.messages import (
    InitializePartition,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    Rpc,
    WritePartition,
)
from protocol.records import RecordDecoder, ShareKey, encode_key, encode_value, record_type
from protocol.replay import KeyState, ShareStateMap
from protocol.shard import ShardConfig, ShareCoordinatorShard
from server.runtime import BackgroundFolds, PartitionRuntime
from server.turns import execute_in_turn

TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"
LONG = ShareKey("lazy", TOPIC, 0)  # more updates since its snapshot than a fold inline
SHORT = ShareKey("lazy", TOPIC, 1)
ONLY_SNAPSHOT = ShareKey("lazy", TOPIC, 2)
OTHER_LONG = ShareKey("lazy", TOPIC, 3)
WRITES = {LONG: INLINE_FOLD_RECORDS + 20, SHORT: 10, ONLY_SNAPSHOT: 0, OTHER_LONG: 80}


def build(data: Path) -> ShareStateMap:
    """A one-partition log of the three keys, written as the shard writes them; returns
    the state a replay of every record gives."""
    shard = ShareCoordinatorShard(ShardConfig())
    rng = random.Random(7)
    replayed = ShareStateMap(500)
    decoder = RecordDecoder()
    with StateLog.open(str(data), 1) as log:
        partition = log.partition(0)
        partition.open()

        def append(record: object) -> None:
            key = encode_key(record.key)  # type: ignore[attr-defined]
            value = encode_value(record)  # type: ignore[arg-type]
            kind = record_type(record)  # type: ignore[arg-type]
            offset = partition.append(kind, key, value, 1_795_000_000_000)
            shard.replay(offset, record)  # type: ignore[arg-type]
            replayed.replay(offset, decoder.decode(kind, key, value), key)

        for key in WRITES:
            append(shard.initialize(key, InitializePartition(key.partition, 0, 0))[0])
        for n in range(max(WRITES.values())):
            for key, writes in WRITES.items():
                if n < writes:
                    first = rng.randrange(300) + n * 3
                    batch = StateBatch(first, first + 4, rng.choice((0, 2, 4)), rng.randint(1, 3))
                    entry = WritePartition(key.partition, 0, n % 4, -1, [batch])
                    append(shard.write(key, entry)[0])
        partition.commit()
    return replayed


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, ShareStateMap]:
    return tmp_path / "data", build(tmp_path / "data")


def test_a_loaded_partition_serves_before_its_merges_and_folds_them_all_behind(
    data: tuple[Path, ShareStateMap],
) -> None:
    path, replayed = data

    async def run(log: StateLog) -> None:
        folds = BackgroundFolds()
        runtime = PartitionRuntime(0, log.partition(0), ShardConfig(), folds=folds)
        another_load = folds.loading()
        another_load.__enter__()  # another partition loading: the folds wait for it
        await runtime.load()
        shard = runtime.shard
        assert runtime.keys_unfolded == 3
        assert type(shard.key_state(LONG)) is LazyKeyState
        assert type(shard.key_state(SHORT)) is LazyKeyState
        assert type(shard.key_state(ONLY_SNAPSHOT)) is KeyState  # nothing to merge
        # A long tail is long work for any RPC; a short one folds inline.
        assert runtime.is_long(Rpc.READ_SUMMARY, LONG, ReadSummaryPartition(0))
        assert not runtime.is_long(Rpc.READ_SUMMARY, SHORT, ReadSummaryPartition(0))
        with pytest.raises(TimeoutError):  # a negative: no deadline can make it flaky
            await asyncio.wait_for(runtime.wait_folded(), 0.05)
        another_load.__exit__(None, None, None)
        await runtime.wait_folded()
        assert runtime.keys_unfolded == 0
        assert all(type(state) is KeyState for state in shard._keys.values())
        assert list(shard._keys.items()) == list(replayed.keys.items())
        assert not runtime.is_long(Rpc.READ_SUMMARY, LONG, ReadSummaryPartition(0))
        await runtime.close()

    with StateLog.open(str(path), 1) as log:
        asyncio.run(run(log))


def test_a_request_that_first_touches_a_long_tail_folds_it_off_the_loop(
    data: tuple[Path, ShareStateMap], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, replayed = data
    folded_on: dict[int, str] = {}
    real_fold = protocol.loading._fold

    def fold(tail, head, leader_fence):  # type: ignore[no-untyped-def]
        folded_on[len(tail)] = threading.current_thread().name
        return real_fold(tail, head, leader_fence)

    monkeypatch.setattr(protocol.loading, "_fold", fold)

    async def run(log: StateLog) -> None:
        folds = BackgroundFolds()
        runtime = PartitionRuntime(0, log.partition(0), ShardConfig(), folds=folds)
        with folds.loading():  # another partition loading: no background fold
            await runtime.load()
            long_read = await execute_in_turn(runtime, Rpc.READ, LONG, ReadPartition(0, 0))
            short_read = await execute_in_turn(runtime, Rpc.READ, SHORT, ReadPartition(0, 0))
            # What the admin state endpoint does first, for a key the requests never read.
            await runtime.fold_key(ONLY_SNAPSHOT)
            await runtime.fold_key(OTHER_LONG)
            assert type(runtime.shard.key_state(OTHER_LONG)) is KeyState
        for key, read in ((LONG, long_read), (SHORT, short_read)):
            state = replayed.keys[key].state
            assert isinstance(read, ReadPartitionResult) and read.error_code == 0
            assert (read.start_offset, read.state_batches) == (
                state.start_offset,
                list(state.state_batches),
            )
        await runtime.close()

    with StateLog.open(str(path), 1) as log:
        asyncio.run(run(log))
    loop_thread = threading.main_thread().name
    assert folded_on[WRITES[LONG] + 1] != loop_thread
    assert folded_on[WRITES[SHORT] + 1] == loop_thread
    assert folded_on[WRITES[OTHER_LONG] + 1] != loop_thread
