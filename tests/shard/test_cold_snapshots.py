"""docs/semantics.md §10: cold-partition snapshotting, one test per rule."""

from __future__ import annotations

from protocol.records import ShareSnapshot
from protocol.shard import ShardConfig
from tests.shard.harness import KEY, OTHER_KEY, Harness
from tests.shard.ops import ColdSnapshotOp

INTERVAL = 10_000


def harness() -> Harness:
    return Harness(ShardConfig(cold_partition_snapshot_interval_ms=INTERVAL))


def cold(h: Harness) -> list[ShareSnapshot]:
    records, count = h.apply(ColdSnapshotOp())
    assert count == len(records)
    return records  # type: ignore[return-value]


def test_10_1_no_states_means_no_snapshots():
    assert cold(harness()) == []


def test_10_2_states_untouched_for_the_interval_are_snapshotted():
    h = harness()
    h.initialize(KEY)
    h.clock.now += INTERVAL
    h.initialize(OTHER_KEY)
    records = cold(h)
    assert [r.key for r in records] == [KEY]


def test_10_2_cold_snapshot_copies_the_state_bumps_epoch_and_write_timestamp():
    h = harness()
    h.initialize(KEY, state_epoch=2, start_offset=5)
    created = h.clock.now
    h.read(leader_epoch=3)
    h.write(leader_epoch=3, state_epoch=2, delivery_complete_count=4)
    h.clock.now += INTERVAL
    (snap,) = cold(h)
    state = h.shard.key_state(KEY).state
    assert snap.snapshot_epoch == 1
    assert (snap.state_epoch, snap.leader_epoch, snap.start_offset) == (2, 3, 5)
    assert (snap.create_timestamp, snap.write_timestamp) == (created, h.clock.now)
    assert snap.delivery_complete_count == 4
    assert (snap.fence_leader_epoch, snap.fence_state_epoch) == (3, 2)
    assert state.write_timestamp == h.clock.now and state.create_timestamp == created


def test_10_2_future_write_timestamp_is_not_eligible():
    h = harness()
    h.clock.now = 50_000
    h.initialize(KEY)
    h.clock.now = 10_000
    assert cold(h) == []


def test_10_1_once_every_state_is_cold_snapshotted_the_job_stops():
    h = harness()
    h.initialize(KEY)
    h.clock.now += INTERVAL
    assert len(cold(h)) == 1
    h.clock.now += 10 * INTERVAL
    assert cold(h) == []


def test_10_2_already_cold_states_are_included_while_some_state_is_not():
    h = harness()
    h.initialize(KEY)
    h.clock.now += INTERVAL
    cold(h)  # KEY is now cold-snapshotted (create != write)
    h.initialize(OTHER_KEY)  # a fresh regular snapshot: create == write
    h.clock.now += INTERVAL
    assert sorted(r.key for r in cold(h)) == sorted([KEY, OTHER_KEY])


def test_10_a_new_regular_snapshot_restarts_the_job():
    h = harness()
    h.initialize(KEY)
    h.clock.now += INTERVAL
    cold(h)
    h.initialize(KEY)
    h.clock.now += INTERVAL
    assert len(cold(h)) == 1


def test_10_updates_do_not_refresh_the_write_timestamp():
    h = harness()
    h.initialize(KEY)
    h.clock.now += INTERVAL
    h.write(KEY)
    assert len(cold(h)) == 1


def test_10_cold_snapshots_move_the_prune_mark_past_update_only_keys():
    h = harness()
    h.initialize(KEY)
    h.initialize(OTHER_KEY)
    for _ in range(5):
        h.write(KEY)
    assert h.shard.last_redundant_offset() is None  # KEY's snapshot is at offset 0
    h.clock.now += INTERVAL
    cold(h)
    assert h.shard.last_redundant_offset() == len(h.log) - 2
