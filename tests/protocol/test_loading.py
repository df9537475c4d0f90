"""Loading from each key's last snapshot (protocol/loading.py) gives exactly the state a
replay of every record gives: every field of every key, the keys' order, the fences, the
snapshot-update counter and the redundant offset, for logs the daemon writes and for any
hand-made sequence of records."""

from __future__ import annotations

import random
import threading

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.key_state
import protocol.loading
from protocol import errors
from protocol.key_state import KeyState, ShareGroupOffset
from protocol.loading import LazyKeyState, LoadDecodeError, RawRecord, StateLoader
from protocol.messages import InitializePartition, ReadPartition, WritePartition
from protocol.records import (
    RecordDecoder,
    ShareKey,
    ShareUpdate,
    UpdateValue,
    encode_key,
    encode_value,
    record_type,
)
from protocol.replay import ShareStateMap
from protocol.shard import ShardConfig, ShareCoordinatorShard
from protocol.state_batch import StateBatch
from tests.spark.histories import hand_made_records, raw_records, rpc_histories, run_rpcs

NUM_PARTITIONS = 2


def replayed(records: list[RawRecord], records_per_snapshot: int) -> ShareStateMap:
    """Every record through the replay, as the daemon replayed them before."""
    decoder = RecordDecoder()
    state = ShareStateMap(records_per_snapshot)
    for offset, _, kind, key, value in records:
        state.replay(offset, decoder.decode(kind, key, value), key)
    return state


def loaded(
    records: list[RawRecord],
    records_per_snapshot: int,
    cuts: list[int] | None = None,
    lazy: bool = False,
) -> ShareStateMap:
    """The records through the loader, handed over in pieces cut at `cuts`."""
    loader = StateLoader(records_per_snapshot)
    start = 0
    for cut in sorted(cuts or []):
        loader.add(records[start:cut])
        start = max(start, cut)
    loader.add(records[start:])
    state = ShareStateMap(records_per_snapshot)
    state.loaded(*loader.finish(lazy=lazy))
    assert loader.record_count == len(records)
    return state


def folded(state: ShareStateMap, seed: int) -> ShareStateMap:
    """A lazily loaded map with every key folded, in a random order, some by reading
    ``state`` and some ``batches_clean``: all plain KeyStates after."""
    entries = list(state.keys.values())
    random.Random(seed).shuffle(entries)
    for i, entry in enumerate(entries):
        _ = entry.batches_clean if i % 2 else entry.state
    assert all(type(entry) is KeyState for entry in state.keys.values())
    return state


def assert_same_state(whole: ShareStateMap, fast: ShareStateMap) -> None:
    items: list[tuple[ShareKey, KeyState]] = list(fast.keys.items())
    assert items == list(whole.keys.items())  # every field, and the order
    assert fast.last_redundant_offset() == whole.last_redundant_offset()
    assert fast._tombstone_offset == whole._tombstone_offset


@settings(max_examples=400, deadline=None)
@given(hand_made_records(), st.integers(0, 4), st.lists(st.integers(0, 60), max_size=3))
def test_a_hand_made_log_loads_to_the_state_its_whole_replay_gives(
    records: list[RawRecord], records_per_snapshot: int, cuts: list[int]
) -> None:
    whole = replayed(records, records_per_snapshot)
    assert_same_state(whole, loaded(records, records_per_snapshot, cuts))
    lazy = loaded(records, records_per_snapshot, cuts, lazy=True)
    assert_same_state(whole, folded(lazy, len(records)))


@settings(max_examples=300, deadline=None)
@given(rpc_histories, st.integers(0, 4))
def test_a_log_the_shard_wrote_loads_to_the_state_its_whole_replay_gives(
    ops: list[object], records_per_snapshot: int
) -> None:
    appended = run_rpcs(ops, NUM_PARTITIONS, records_per_snapshot)  # type: ignore[arg-type]
    for p in range(NUM_PARTITIONS):
        records = raw_records(a for a in appended if a.state_partition == p)
        whole = replayed(records, records_per_snapshot)
        assert_same_state(whole, loaded(records, records_per_snapshot))
        lazy = loaded(records, records_per_snapshot, lazy=True)
        assert_same_state(whole, folded(lazy, p))


def test_a_bad_value_before_the_last_snapshot_still_fails_the_load() -> None:
    """The replay decoded every record; the loader skips the fold of the older ones, not
    their checks."""
    key = encode_key(ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0))
    good_snapshot = bytes.fromhex("9a00000000000090ff0000")
    records: list[RawRecord] = [
        (0, 0, 0, key, good_snapshot),
        (1, 0, 1, key, b"\x95\x00\x00\x00\xc1"),  # 0xc1: never valid msgpack
        (2, 0, 0, key, good_snapshot),
    ]
    with pytest.raises(LoadDecodeError, match="offset 1"):
        loaded(records, 500)


def test_a_bad_value_in_the_tail_fails_even_a_lazy_load() -> None:
    """The lazy load leaves the merges for later, not the checks."""
    key = encode_key(ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 0))
    records: list[RawRecord] = [
        (0, 0, 0, key, bytes.fromhex("9a00000000000090ff0000")),
        (1, 0, 1, key, b"\x95\x00\x00\x00\xc1"),
    ]
    with pytest.raises(LoadDecodeError, match="offset 1"):
        loaded(records, 500, lazy=True)


def _three_field_batches() -> bytes:
    """A ShareUpdate value that decodes, with a state batch cut to three fields."""
    _, records = _written_log(1)
    encoded = records[1][4]
    assert encoded is not None
    value = msgspec.msgpack.decode(encoded, type=UpdateValue)
    return msgspec.msgpack.encode(msgspec.structs.replace(value, state_batches=[1, 2, 3]))


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("retired", [False, True], ids=["tail", "retired"])
@pytest.mark.parametrize("kind", ["undecodable", "three fields"])
def test_the_first_refused_update_among_good_ones_is_named(
    kind: str, retired: bool, lazy: bool
) -> None:
    """A tail's updates are decoded in one call; where one is refused, the load still
    names the first refused record, in the tail as in a stretch a snapshot retired."""
    bad = b"\x95\x00\x00\x00\xc1" if kind == "undecodable" else _three_field_batches()
    _, records = _written_log(12)
    for at in (5, 8):
        assert records[at][2] == 1  # an update
        records[at] = (*records[at][:4], bad)
    if retired:
        records.append((len(records), *records[0][1:]))  # a snapshot after them
    with pytest.raises(LoadDecodeError, match=r"^offset 5: "):
        loaded(records, 500, lazy=lazy)


def _written_log(writes: int) -> tuple[ShareKey, list[RawRecord]]:
    """One key's log as the shard writes it: its initialize, then `writes` writes."""
    key = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 3)
    shard = ShareCoordinatorShard(ShardConfig())
    rng = random.Random(writes)
    records: list[RawRecord] = []

    def append(record: object) -> None:
        if record is not None:
            shard.replay(len(records), record)  # type: ignore[arg-type]
            records.append(
                (len(records), 0, record_type(record), encode_key(key), encode_value(record))  # type: ignore[arg-type]
            )

    append(shard.initialize(key, InitializePartition(key.partition, 0, 0))[0])
    for n in range(writes):
        first = rng.randrange(200) + n * 5
        batch = StateBatch(first, first + 9, rng.choice((0, 2, 4)), rng.randint(1, 3))
        append(shard.write(key, WritePartition(key.partition, 0, n % 3, -1, [batch]))[0])
    return key, records


def test_a_lazy_load_leaves_the_merges_to_the_first_reader() -> None:
    key, records = _written_log(40)
    whole = replayed(records, 500)
    state = loaded(records, 500, lazy=True)
    entry = state.keys[key]
    assert type(entry) is LazyKeyState
    assert protocol.loading.unfolded_records(entry) == len(records)
    # What the load worked out at once: fences, counter, snapshot offset, key bytes.
    expected = whole.keys[key]
    assert (entry.leader_fence, entry.state_fence, entry.update_count) == (
        expected.leader_fence,
        expected.state_fence,
        expected.update_count,
    )
    assert entry.snapshot_offset == expected.snapshot_offset == 0
    # Until then it keeps its first record and the updates' values, nothing more of
    # them: a node holds every key's tail until the background fold gets to it.
    tail = protocol.loading._unfolded_tail(entry)
    assert tail is not None and tail[0] == records[0]
    assert tail[1:] == [record[4] for record in records[1:]]
    assert isinstance(entry.state, ShareGroupOffset)
    assert type(entry) is KeyState and protocol.loading.unfolded_records(entry) == 0
    assert entry == expected


def test_a_snapshot_replayed_over_an_unfolded_key_replaces_its_tail_unread() -> None:
    key, records = _written_log(10)
    state = loaded(records, 500, lazy=True)
    again = (len(records), *records[0][1:])  # the initialize's snapshot, once more
    later = replayed([*records, again], 500)
    decoder = RecordDecoder()
    _, _, kind, key_bytes, value = again
    state.replay(len(records), decoder.decode(kind, key_bytes, value), key_bytes)
    assert type(state.keys[key]) is KeyState
    assert state.keys[key].state == later.keys[key].state
    assert state.keys[key].batches_clean is None


def test_a_fold_that_finishes_after_the_state_moved_on_is_dropped() -> None:
    """Two threads fold one key (a request on the offload thread, a read on the loop):
    the first fold in place is kept, and a write after it is not undone by the second."""
    key, records = _written_log(12)
    state = loaded(records, 500, lazy=True)
    entry = state.keys[key]
    real_fold = protocol.loading.fold_values
    moved_on = ShareGroupOffset(9, 9, 9, 9, 9, 9, (), -1)

    def fold_while_another_folds_and_writes(*args, **kwargs):  # type: ignore[no-untyped-def]
        protocol.loading.fold_values = real_fold
        _ = entry.state  # the other thread's fold, finished first
        entry.state = moved_on  # and its write
        return real_fold(*args, **kwargs)

    protocol.loading.fold_values = fold_while_another_folds_and_writes
    try:
        assert entry.state is moved_on
    finally:
        protocol.loading.fold_values = real_fold
    assert type(entry) is KeyState and entry.state is moved_on


def test_keys_folded_on_many_threads_at_once_fold_to_the_replayed_state() -> None:
    key, records = _written_log(200)
    whole = replayed(records, 500)
    for _ in range(5):
        state = loaded(records, 500, lazy=True)
        entry = state.keys[key]
        seen: list[ShareGroupOffset] = []

        def read(entry: KeyState = entry, seen: list[ShareGroupOffset] = seen) -> None:
            seen.append(entry.state)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert seen == [whole.keys[key].state] * 4
        assert entry == whole.keys[key]


def test_an_update_replayed_onto_an_unfolded_key_merges_into_its_folded_state() -> None:
    key, records = _written_log(30)
    extra_key, extra = _written_log(31)
    assert extra_key == key
    update = extra[-1]
    assert update[2] == 1
    decoder = RecordDecoder()
    whole = replayed([*records, (len(records), *update[1:])], 500)
    state = loaded(records, 500, lazy=True)
    record = decoder.decode(update[2], update[3], update[4])
    assert isinstance(record, ShareUpdate)
    state.replay(len(records), record, update[3])
    assert state.keys[key] == whole.keys[key]


def test_a_short_tail_over_a_large_state_is_long_work_to_fold() -> None:
    """Each merge copies the stored batches: a few updates over thousands of batches
    are folded off the loop, as a long tail is."""
    key = ShareKey("g", "AAAAAAAAAAAAAAAAAAAAAQ", 5)
    shard = ShareCoordinatorShard(ShardConfig())
    records: list[RawRecord] = []

    def append(record: object) -> None:
        shard.replay(len(records), record)  # type: ignore[arg-type]
        records.append(
            (len(records), 0, record_type(record), encode_key(key), encode_value(record))  # type: ignore[arg-type]
        )

    append(shard.initialize(key, InitializePartition(key.partition, 0, 0))[0])
    many = [StateBatch(2 * i, 2 * i, 4, 1) for i in range(3000)]  # disjoint: they all stay
    append(shard.write(key, WritePartition(key.partition, 0, 0, -1, many))[0])
    assert loaded(records[:1], 500, lazy=True).keys[key].__class__ is KeyState  # a snapshot
    for n in range(3):
        batch = StateBatch(10 * n + 1, 10 * n + 1, 2, 1)
        append(shard.write(key, WritePartition(key.partition, 0, 0, -1, [batch]))[0])
    large = loaded(records, 500, lazy=True)
    entry = large.keys[key]
    assert protocol.loading.unfolded_records(entry) == 5 <= protocol.loading.INLINE_FOLD_RECORDS
    assert protocol.loading.fold_is_long(entry)
    short = loaded(records[:1] + records[2:], 500, lazy=True)  # the same without the big write
    assert not protocol.loading.fold_is_long(short.keys[key])
    assert entry.state == replayed(records, 500).keys[key].state
    assert not protocol.loading.fold_is_long(entry)


def test_key_fields_hands_out_each_field_of_a_key_state_where_its_readers_take_it() -> None:
    """The shard's write and the replay read a KeyState's fields by position
    (protocol/key_state.py's key_fields), a lazily loaded one once it is folded."""
    key, records = _written_log(6)
    entry = loaded(records, 500, lazy=True).keys[key]
    assert type(entry) is LazyKeyState
    _ = entry.state
    fields = protocol.key_state.key_fields(entry)
    assert fields == tuple(getattr(entry, name) for name in KeyState.__struct_fields__)
    assert KeyState.__struct_fields__ == protocol.key_state.KEY_STATE_FIELDS
    assert isinstance(fields[0], ShareGroupOffset) and fields[3] == encode_key(key)


def test_a_key_state_whose_fields_moved_is_refused() -> None:
    class Moved(msgspec.Struct):
        leader_fence: int
        state: ShareGroupOffset

    with pytest.raises(TypeError, match="key_fields' readers take"):
        protocol.key_state.check_key_fields(Moved)
    protocol.key_state.check_key_fields(KeyState)


def test_a_write_onto_an_unfolded_key_is_judged_on_its_folded_state() -> None:
    """The shard's write reads the key's fields at once: a lazily loaded key folds
    first, so the fences and the record are those of the replayed state."""
    key, records = _written_log(25)
    # A read by leader epoch 2 raises the key's leader fence, in an update record.
    reader = ShareCoordinatorShard(ShardConfig())
    reader.loaded(*_loader(records).finish())
    bump, _ = reader.read(key, ReadPartition(key.partition, 2))
    assert isinstance(bump, ShareUpdate)
    records.append((len(records), 0, record_type(bump), encode_key(key), encode_value(bump)))
    for leader_epoch in (1, 2, 3):
        shards = []
        for lazy in (False, True):
            shard = ShareCoordinatorShard(ShardConfig())
            shard.loaded(*_loader(records).finish(lazy=lazy))
            shards.append(shard)
        assert type(shards[1].key_state(key)) is LazyKeyState
        entry = WritePartition(key.partition, 0, leader_epoch, -1, [StateBatch(40, 49, 2, 1)])
        eager, lazy_written = (shard.write(key, entry) for shard in shards)
        assert lazy_written == eager
        assert eager[1].error_code == (0 if leader_epoch >= 2 else errors.FENCED_LEADER_EPOCH)
        assert (eager[0] is None) == (leader_epoch < 2)


def _loader(records: list[RawRecord]) -> StateLoader:
    loader = StateLoader(500)
    loader.add(records)
    return loader
