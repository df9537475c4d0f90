"""docs/semantics.md §4 (replay rules) and §9 (offsets manager), one test per numbered rule."""

from __future__ import annotations

import gc

from protocol.key_state import ShareGroupOffset
from protocol.records import ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.shard import ShardConfig, ShareCoordinatorShard
from tests.shard.harness import KEY, OTHER_KEY, batch


def snapshot(
    key=KEY,
    *,
    snapshot_epoch=0,
    state_epoch=0,
    leader_epoch=0,
    start_offset=0,
    batches=(),
    create=0,
    write=0,
    dcc=-1,
    fence_leader=None,
    fence_state=None,
):
    return ShareSnapshot(
        key,
        snapshot_epoch,
        state_epoch,
        leader_epoch,
        start_offset,
        create,
        write,
        list(batches),
        dcc,
        fence_leader,
        fence_state,
    )


def update(key=KEY, *, snapshot_epoch=0, leader_epoch=0, start_offset=-1, batches=(), dcc=-1):
    return ShareUpdate(key, snapshot_epoch, leader_epoch, start_offset, list(batches), dcc)


def shard(records_per_snapshot=500) -> ShareCoordinatorShard:
    return ShareCoordinatorShard(ShardConfig(records_per_snapshot=records_per_snapshot))


# --- ShareSnapshot with a value -----------------------------------------------------------


def test_4_snapshot_1_leader_epoch_fence_is_the_max_seen():
    s = shard()
    s.replay(0, snapshot(leader_epoch=5))
    s.replay(1, snapshot(leader_epoch=3))
    assert s.key_state(KEY).leader_fence == 5
    s.replay(2, snapshot(leader_epoch=9))
    assert s.key_state(KEY).leader_fence == 9


def test_4_snapshot_2_state_epoch_fence_is_the_max_seen():
    s = shard()
    s.replay(0, snapshot(state_epoch=4))
    s.replay(1, snapshot(state_epoch=2))
    assert s.key_state(KEY).state_fence == 4


def test_4_snapshot_3_replaces_the_state_verbatim_without_merging_batches():
    s = shard()
    s.replay(0, snapshot(batches=[batch(0, 9)], create=5, write=6))
    s.replay(
        1,
        snapshot(
            snapshot_epoch=1,
            state_epoch=2,
            leader_epoch=3,
            start_offset=20,
            batches=[batch(20, 29, 2, 2)],
            create=7,
            write=8,
            dcc=4,
        ),
    )
    state = s.key_state(KEY).state
    assert state == ShareGroupOffset(1, 2, 3, 20, 7, 8, (batch(20, 29, 2, 2),), 4)


def test_4_snapshot_3_state_leader_epoch_can_be_below_the_fence():
    s = shard()
    s.replay(0, snapshot(leader_epoch=7))
    s.replay(1, snapshot(leader_epoch=0))
    assert s.key_state(KEY).state.leader_epoch == 0
    assert s.key_state(KEY).leader_fence == 7


def test_4_snapshot_4_resets_the_update_counter_only_at_the_limit():
    s = shard(records_per_snapshot=3)
    s.replay(0, snapshot())
    for offset in range(1, 4):  # counter 0, 1, 2
        s.replay(offset, update())
    s.replay(4, snapshot())
    assert s.key_state(KEY).update_count == 2  # below the limit: untouched
    s.replay(5, update())  # 3
    s.replay(6, snapshot())
    assert s.key_state(KEY).update_count == 0


def test_4_snapshot_4_leaves_an_absent_counter_absent():
    s = shard(records_per_snapshot=0)
    s.replay(0, snapshot())
    s.replay(1, snapshot())
    assert s.key_state(KEY).update_count is None


def test_4_snapshot_5_records_its_offset_in_the_offsets_manager():
    s = shard()
    s.replay(7, snapshot())
    assert s.key_state(KEY).snapshot_offset == 7
    assert s.last_redundant_offset() == 7


# --- ShareSnapshot tombstone ----------------------------------------------------------------


def test_4_tombstone_removes_the_state_and_every_per_key_map():
    s = shard()
    s.replay(0, snapshot(leader_epoch=5, state_epoch=5))
    s.replay(1, update())
    s.replay(2, ShareTombstone(KEY))
    assert s.key_state(KEY) is None
    # A fresh start: nothing of the old fences or counter survives.
    s.replay(3, snapshot(leader_epoch=1, state_epoch=1))
    entry = s.key_state(KEY)
    assert (entry.leader_fence, entry.state_fence, entry.update_count) == (1, 1, None)


def test_4_tombstone_of_an_unknown_key_is_harmless():
    s = shard()
    s.replay(0, ShareTombstone(KEY))
    assert len(s) == 0


# --- ShareUpdate ------------------------------------------------------------------------------


def test_4_update_1_leader_epoch_fence_is_the_max_seen():
    s = shard()
    s.replay(0, snapshot(leader_epoch=2))
    s.replay(1, update(leader_epoch=6))
    s.replay(2, update(leader_epoch=4))
    assert s.key_state(KEY).leader_fence == 6


def test_4_update_1_can_insert_minus_one_for_an_unknown_key():
    s = shard()
    s.replay(0, update(leader_epoch=-1))
    assert s.key_state(KEY).leader_fence == -1


def test_4_update_2_without_state_becomes_the_state_with_epoch_and_timestamps_zero():
    s = shard()
    s.replay(
        0, update(snapshot_epoch=3, leader_epoch=2, start_offset=5, batches=[batch(5, 9)], dcc=2)
    )
    entry = s.key_state(KEY)
    assert entry.state == ShareGroupOffset(3, 0, 2, 5, 0, 0, (batch(5, 9),), 2)
    assert entry.state_fence is None


def test_4_update_2_merges_start_offset_leader_epoch_and_batches():
    s = shard()
    s.replay(0, snapshot(leader_epoch=1, start_offset=0, batches=[batch(0, 9)], create=5, write=6))
    s.replay(1, update(leader_epoch=3, start_offset=4, batches=[batch(8, 12, 2, 1)]))
    state = s.key_state(KEY).state
    assert state.start_offset == 4
    assert state.leader_epoch == 3
    assert state.state_batches == (batch(4, 7), batch(8, 12, 2, 1))
    assert (state.create_timestamp, state.write_timestamp) == (5, 6)


def test_4_update_2_minus_one_means_unchanged():
    s = shard()
    s.replay(0, snapshot(leader_epoch=4, start_offset=10, dcc=3))
    s.replay(1, update(leader_epoch=-1, start_offset=-1, dcc=-1))
    state = s.key_state(KEY).state
    assert (state.leader_epoch, state.start_offset, state.delivery_complete_count) == (4, 10, 3)


def test_4_update_2_minus_one_start_offset_disables_pruning_of_old_batches():
    s = shard()
    s.replay(0, snapshot(start_offset=-1, batches=[batch(0, 4)]))
    s.replay(1, update(start_offset=-1, batches=[batch(5, 9, 2, 1)]))
    assert s.key_state(KEY).state.state_batches == (batch(0, 4), batch(5, 9, 2, 1))


def test_4_update_2_keeps_snapshot_epoch_state_epoch_and_timestamps():
    s = shard()
    s.replay(0, snapshot(snapshot_epoch=2, state_epoch=3, create=11, write=12))
    s.replay(1, update(snapshot_epoch=99))
    state = s.key_state(KEY).state
    assert (
        state.snapshot_epoch,
        state.state_epoch,
        state.create_timestamp,
        state.write_timestamp,
    ) == (
        2,
        3,
        11,
        12,
    )


def test_4_update_3_first_update_sets_the_counter_to_zero_then_counts():
    s = shard()
    s.replay(0, snapshot())
    s.replay(1, update())
    assert s.key_state(KEY).update_count == 0
    s.replay(2, update())
    assert s.key_state(KEY).update_count == 1


def test_4_update_4_does_not_touch_the_offsets_manager():
    s = shard()
    s.replay(3, snapshot())
    s.replay(4, update())
    s.replay(5, update())
    assert s.key_state(KEY).snapshot_offset == 3
    assert s.last_redundant_offset() == 3


# --- §9 offsets manager ------------------------------------------------------------------------


def test_9_nothing_is_redundant_before_any_snapshot():
    s = shard()
    assert s.last_redundant_offset() is None
    s.replay(0, update())
    assert s.last_redundant_offset() is None


def test_9_mark_is_the_minimum_latest_snapshot_offset_over_keys():
    s = shard()
    s.replay(1, snapshot(KEY))
    s.replay(2, snapshot(OTHER_KEY))
    s.replay(3, snapshot(KEY))
    assert s.last_redundant_offset() == 2
    s.replay(4, snapshot(OTHER_KEY))
    assert s.last_redundant_offset() == 3


def test_9_mark_at_or_below_zero_means_nothing_to_prune():
    s = shard()
    s.replay(0, snapshot())
    assert s.last_redundant_offset() is None


def test_9_tombstone_counts_in_the_minimum_until_the_next_snapshot():
    s = shard()
    s.replay(1, snapshot(KEY))
    s.replay(5, snapshot(OTHER_KEY))
    s.replay(6, snapshot(OTHER_KEY))
    s.replay(7, ShareTombstone(KEY))
    # offsets {KEY: 7, OTHER: 6} -> 6, then KEY is dropped after the computation.
    assert s.last_redundant_offset() == 6
    s.replay(8, ShareTombstone(OTHER_KEY))
    # offsets {OTHER: 8} -> 8; the map is now empty but the mark stays.
    assert s.last_redundant_offset() == 8
    s.replay(9, snapshot(KEY))
    assert s.last_redundant_offset() == 9


def test_9_key_written_only_by_updates_pins_the_mark_at_its_last_snapshot():
    s = shard()
    s.replay(1, snapshot(KEY))
    s.replay(2, snapshot(OTHER_KEY))
    for offset in range(3, 50):
        s.replay(offset, update(KEY))
    s.replay(50, snapshot(OTHER_KEY))
    assert s.last_redundant_offset() == 1


def test_the_state_of_a_key_is_not_tracked_by_the_garbage_collector():
    # A full collection walks every tracked object: one per share-partition would make
    # it grow with the state (10,000 keys: tens of ms, the daemon's worst tail).
    s = shard()
    s.replay(0, snapshot())
    s.replay(1, update(batches=[batch(5, 9, 2, 1)]))
    s.replay(2, snapshot(key=OTHER_KEY, batches=[batch(0, 4)]))
    entries = [s.key_state(KEY), s.key_state(OTHER_KEY)]
    assert all(e is not None for e in entries)
    assert not any(gc.is_tracked(e) for e in entries)
    assert not any(gc.is_tracked(e.state) for e in entries if e is not None)
    # Nor is its key, which lives as long: a NamedTuple key stays tracked for good.
    assert sorted(s) == sorted([KEY, OTHER_KEY])
    assert not any(gc.is_tracked(key) for key in s)
    # Its batches are a tuple of untracked batches, which the first collection to see
    # it stops tracking (a list would stay tracked, one per share-partition).
    gc.collect()
    assert all(e.state.state_batches for e in entries if e is not None)
    assert not any(gc.is_tracked(e.state.state_batches) for e in entries if e is not None)
