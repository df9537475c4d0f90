"""A partition loads lazily (protocol/loading.py, server/runtime.py): it serves as soon as
its records are read and checked, and the merges of each key's updates follow in the
background, one slice per turn of the loop node-wide, once no partition is loading (and a
node's start loads every partition before the first). A key with a long
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
import server.node
import server.runtime
from persistence import StateLog
from protocol.key_state import KeyState
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
from protocol.replay import ShareStateMap
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch
from server.folds import BackgroundFolds
from server.runtime import PartitionRuntime
from server.turns import execute_in_turn

TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"
LONG = ShareKey("lazy", TOPIC, 0)  # more updates since its snapshot than a fold inline
SHORT = ShareKey("lazy", TOPIC, 1)
ONLY_SNAPSHOT = ShareKey("lazy", TOPIC, 2)
OTHER_LONG = ShareKey("lazy", TOPIC, 3)
WRITES = {LONG: INLINE_FOLD_RECORDS + 20, SHORT: 10, ONLY_SNAPSHOT: 0, OTHER_LONG: 80}


def build(data: Path, partitions: int = 1) -> ShareStateMap:
    """A log of the four keys, written as the shard writes them, the same in each of
    ``partitions``; returns the state a replay of every record of one gives."""
    with StateLog.open(str(data), partitions) as log:
        for p in range(partitions):
            replayed = _write_keys(log, p)
    return replayed


def _write_keys(log: StateLog, p: int) -> ShareStateMap:
    shard = ShareCoordinatorShard(ShardConfig())
    rng = random.Random(7)
    replayed = ShareStateMap(500)
    decoder = RecordDecoder()
    partition = log.partition(p)
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
    real_fold = protocol.loading.fold_values

    def fold(head, updates, leader_fence, *, snapshot):  # type: ignore[no-untyped-def]
        updates = list(updates)
        folded_on[len(updates) + 1] = threading.current_thread().name  # records folded
        return real_fold(head, updates, leader_fence, snapshot=snapshot)

    monkeypatch.setattr(protocol.loading, "fold_values", fold)

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


class _Service:
    """What ``_load_all`` tells once every partition has loaded."""

    async def after_load(self) -> None:
        pass


def _recording_folds(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Each key a background fold folds appends ``fold`` to ``events`` (from any
    thread: a long tail folds off the loop)."""
    real_fold = protocol.loading.fold

    def fold(entry):  # type: ignore[no-untyped-def]
        events.append("fold")
        return real_fold(entry)

    monkeypatch.setattr(server.runtime, "fold", fold)


def test_a_start_loads_every_partition_before_the_first_background_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between one partition's load and the next, the folds of those loaded before must
    not each take a slice: a 1M-record start took 3.7 s instead of 1.4 s that way."""
    partitions = 6  # more than LOAD_CONCURRENCY: some loads start after others ended
    assert partitions > server.node.LOAD_CONCURRENCY
    build(tmp_path / "data", partitions)
    events: list[str] = []
    _recording_folds(monkeypatch, events)
    real_open_and_replay = PartitionRuntime._open_and_replay

    def open_and_replay(self: PartitionRuntime) -> None:
        events.append("load")
        real_open_and_replay(self)

    monkeypatch.setattr(PartitionRuntime, "_open_and_replay", open_and_replay)

    async def run(log: StateLog) -> None:
        folds = BackgroundFolds()
        runtimes = {
            p: PartitionRuntime(p, log.partition(p), ShardConfig(), folds=folds)
            for p in range(partitions)
        }
        await server.node._load_all(runtimes, _Service(), folds)  # type: ignore[arg-type]
        for runtime in runtimes.values():
            await runtime.wait_folded()
            assert runtime.keys_unfolded == 0
            await runtime.close()

    with StateLog.open(str(tmp_path / "data"), partitions) as log:
        asyncio.run(run(log))
    assert events.count("load") == partitions
    assert events.count("fold") == 3 * partitions  # LONG, SHORT, OTHER_LONG of each
    assert events.index("fold") > len(events) - 1 - events[::-1].index("load")


def test_the_background_folds_take_one_slice_per_turn_of_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many partitions fold, anything else on the loop waits for one slice at
    most between two turns of its own (50 folding held an HTTP request ~0.4 s)."""
    partitions = 4
    build(tmp_path / "data", partitions)
    monkeypatch.setattr(server.runtime, "FOLD_SLICE_S", 0.0)  # one key a slice
    # Every tail inline: a fold waiting on the offload thread holds its turn, and the
    # others queue behind it whatever the loop does; inline slices are what can crowd.
    monkeypatch.setattr(server.runtime, "fold_is_long", lambda entry: False)
    events: list[str] = []
    _recording_folds(monkeypatch, events)

    async def run(log: StateLog) -> None:
        folds = BackgroundFolds()
        runtimes = [
            PartitionRuntime(p, log.partition(p), ShardConfig(), folds=folds)
            for p in range(partitions)
        ]
        with folds.loading():  # every fold starts together, once this ends
            for runtime in runtimes:
                await runtime.load()
        done = asyncio.Event()

        async def ticks() -> None:
            while not done.is_set():
                events.append("tick")
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticks())
        await asyncio.sleep(0)  # the first tick, before any fold
        for runtime in runtimes:
            await runtime.wait_folded()
        done.set()
        await ticking
        for runtime in runtimes:
            await runtime.close()

    with StateLog.open(str(tmp_path / "data"), partitions) as log:
        asyncio.run(run(log))
    assert events.count("fold") == 3 * partitions
    between = "".join("f" if event == "fold" else "t" for event in events).split("t")
    assert max(len(run) for run in between) == 1, between
