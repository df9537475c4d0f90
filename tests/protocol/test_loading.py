"""Loading from each key's last snapshot (protocol/loading.py) gives exactly the state a
replay of every record gives: every field of every key, the keys' order, the fences, the
snapshot-update counter and the redundant offset, for logs the daemon writes and for any
hand-made sequence of records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.loading import LoadDecodeError, RawRecord, StateLoader
from protocol.records import RecordDecoder, ShareKey, encode_key
from protocol.replay import KeyState, ShareStateMap
from tests.spark.histories import hand_made_records, raw_records, rpc_histories, run_rpcs

NUM_PARTITIONS = 2


def replayed(records: list[RawRecord], records_per_snapshot: int) -> ShareStateMap:
    """Every record through the replay, as the daemon replayed them before."""
    decoder = RecordDecoder()
    state = ShareStateMap(records_per_snapshot)
    for offset, _, record_type, key, value in records:
        state.replay(offset, decoder.decode(record_type, key, value), key)
    return state


def loaded(
    records: list[RawRecord], records_per_snapshot: int, cuts: list[int] | None = None
) -> ShareStateMap:
    """The records through the loader, handed over in pieces cut at `cuts`."""
    loader = StateLoader(records_per_snapshot)
    start = 0
    for cut in sorted(cuts or []):
        loader.add(records[start:cut])
        start = max(start, cut)
    loader.add(records[start:])
    state = ShareStateMap(records_per_snapshot)
    state.loaded(*loader.finish())
    assert loader.record_count == len(records)
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
    assert_same_state(
        replayed(records, records_per_snapshot), loaded(records, records_per_snapshot, cuts)
    )


@settings(max_examples=300, deadline=None)
@given(rpc_histories, st.integers(0, 4))
def test_a_log_the_shard_wrote_loads_to_the_state_its_whole_replay_gives(
    ops: list[object], records_per_snapshot: int
) -> None:
    appended = run_rpcs(ops, NUM_PARTITIONS, records_per_snapshot)  # type: ignore[arg-type]
    for p in range(NUM_PARTITIONS):
        records = raw_records(a for a in appended if a.state_partition == p)
        assert_same_state(
            replayed(records, records_per_snapshot), loaded(records, records_per_snapshot)
        )


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
