"""docs/semantics.md §16, the edge-case checklist, as §A / §A.1 adapt it: one test per item.

Item 14 (request-level validation) is a property of the HTTP edge under §A; it is
tested with the codec and the daemon (tests/protocol/test_codec.py, tests/server)."""

from __future__ import annotations

import msgspec

from protocol import errors
from protocol.batches import combine_state_batches
from protocol.records import ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.shard import ShardConfig
from protocol.state_batch import StateBatch
from tests.shard.harness import KEY, Catalog, Harness, batch
from tests.shard.ops import DeleteOp, ReadSummaryOp


def test_16_1_overlap_is_resolved_by_priority_not_recency():
    older_but_higher = [batch(0, 9, 0, 3)]
    newer_but_lower = [batch(0, 9, 2, 1)]
    assert combine_state_batches(older_but_higher, newer_but_lower, -1) == older_but_higher


def test_16_2_set_order_is_count_before_state_and_identical_batches_dedupe():
    assert combine_state_batches([batch(0, 9, 4, 1)], [batch(0, 9, 0, 2)], -1) == [
        batch(0, 9, 0, 2)
    ]
    assert combine_state_batches([batch(0, 9)], [batch(0, 9)], -1) == [batch(0, 9)]


def test_16_3_contiguous_merge_needs_equal_info_and_partial_coalescing_stays():
    assert combine_state_batches([batch(0, 4)], [batch(5, 9)], -1) == [batch(0, 9)]
    assert combine_state_batches([batch(0, 4)], [batch(6, 9)], -1) == [batch(0, 4), batch(6, 9)]
    assert combine_state_batches(
        [batch(0, 9, 2, 3), batch(10, 19, 0, 1)], [batch(10, 19, 2, 3)], -1
    ) == [
        batch(0, 9, 2, 3),
        batch(10, 19, 2, 3),
    ]


def test_16_4_pruning_trims_straddlers_minus_one_disables_and_one_batch_skips_sorting():
    assert combine_state_batches([batch(0, 9)], [], 5) == [batch(5, 9)]
    assert combine_state_batches([batch(0, 9)], [], -1) == [batch(0, 9)]
    assert combine_state_batches([batch(9, 0)], [], -1) == [batch(9, 0)]


def test_16_5_first_update_sets_counter_zero_so_n_plus_one_updates_precede_a_snapshot():
    h = Harness(ShardConfig(records_per_snapshot=2))
    h.initialize()
    kinds = [type(h.write()[0][0]) for _ in range(5)]
    assert kinds == [ShareUpdate, ShareUpdate, ShareUpdate, ShareSnapshot, ShareUpdate]
    assert h.shard.key_state(KEY).update_count == 1
    # An initialize below the limit does not reset the counter: one more update reaches
    # the limit and the write after it is a snapshot.
    h.initialize()
    assert h.shard.key_state(KEY).update_count == 1
    assert [type(h.write()[0][0]) for _ in range(2)] == [ShareUpdate, ShareSnapshot]


def test_16_6_only_read_moves_leader_epoch_and_only_initialize_moves_state_epoch():
    h = Harness()
    h.initialize(state_epoch=1)
    h.write(leader_epoch=5, state_epoch=5)
    entry = h.shard.key_state(KEY)
    assert (entry.leader_fence, entry.state_fence) == (0, 1)
    h.read(leader_epoch=5)
    assert h.shard.key_state(KEY).leader_fence == 5
    h.initialize(state_epoch=6)
    assert h.shard.key_state(KEY).state_fence == 6


def test_16_7_read_fences_minus_one_write_and_initialize_exempt_it():
    h = Harness()
    h.initialize(state_epoch=3)
    assert h.read(leader_epoch=-1)[1].error_code == errors.FENCED_LEADER_EPOCH
    assert h.write(leader_epoch=-1, state_epoch=-1)[1].error_code == 0
    assert h.initialize(state_epoch=-1)[1].error_code == 0


def test_16_8_uninitialized_read_write_fail_summary_and_delete_succeed():
    h = Harness()
    assert h.read()[1].error_message == errors.MSG_READ_UNINITIALIZED
    assert h.write()[1].error_message == errors.MSG_WRITE_UNINITIALIZED
    assert h.apply(ReadSummaryOp(KEY))[1].start_offset == -1
    assert h.apply(DeleteOp(KEY)) == ([], h.apply(DeleteOp(KEY))[1])
    assert h.log == []


def test_16_9_metadata_after_fencing_for_read_write_init_and_before_existence_for_delete():
    catalog = Catalog({KEY.topic_id: 1})
    h = Harness(metadata=catalog)
    h.initialize(state_epoch=4)
    h.read(leader_epoch=4)
    catalog.topics.clear()
    assert h.read(leader_epoch=3)[1].error_code == errors.FENCED_LEADER_EPOCH
    assert h.write(leader_epoch=3)[1].error_code == errors.FENCED_LEADER_EPOCH
    assert h.initialize(state_epoch=3)[1].error_code == errors.FENCED_STATE_EPOCH
    absent = msgspec.structs.replace(KEY, partition=5)
    assert h.apply(DeleteOp(absent))[1].error_code == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_16_10_update_minus_ones_mean_unchanged_and_it_never_touches_epochs_or_timestamps():
    h = Harness()
    h.initialize(state_epoch=2, start_offset=3)
    before = h.shard.key_state(KEY).state
    h.append(ShareUpdate(KEY, 77, -1, -1, [], -1))
    after = h.shard.key_state(KEY).state
    assert after == before


def test_16_11_tombstone_uses_the_snapshot_key_and_clears_every_map():
    h = Harness()
    h.initialize()
    h.write()
    records, _ = h.apply(DeleteOp(KEY))
    assert records == [ShareTombstone(KEY)]
    assert h.shard.key_state(KEY) is None
    assert h.shard.last_redundant_offset() == 2


def test_16_12_prune_mark_is_the_min_latest_snapshot_offset_and_updates_never_move_it():
    h = Harness()
    h.append(ShareUpdate(KEY, 0, 0, -1, [], -1))
    assert h.shard.last_redundant_offset() is None
    h.initialize()  # offset 1
    h.write()
    h.write()
    assert h.shard.last_redundant_offset() == 1


def test_16_13_cold_snapshotting_stops_once_every_state_is_cold():
    h = Harness(ShardConfig(cold_partition_snapshot_interval_ms=1))
    h.initialize()
    h.clock.now += 5
    assert len(h.shard.cold_snapshots()) == 1
    for record in h.shard.cold_snapshots():
        h.append(record)
    h.clock.now += 5
    assert h.shard.cold_snapshots() == []


def test_16_15_summary_leader_epoch_comes_from_the_state_not_the_fence():
    h = Harness()
    h.initialize()
    h.read(leader_epoch=8)
    h.initialize()
    summary = h.apply(ReadSummaryOp(KEY))[1]
    assert summary.leader_epoch == 0
    assert h.shard.key_state(KEY).leader_fence == 8


def test_a1_5_error_message_is_null_on_success():
    h = Harness()
    assert h.initialize()[1].error_message is None
    assert h.read()[1].error_message is None
    assert h.write()[1].error_message is None


def test_a1_9_state_batch_validates_nothing():
    odd = StateBatch(10, 2, 99, -5)
    assert odd.first_offset == 10 and odd.delivery_state == 99


def test_a1_12_reload_gives_the_same_admin_state_for_every_key():
    h = Harness(ShardConfig(records_per_snapshot=2))
    h.initialize(state_epoch=1, start_offset=0)
    h.read(leader_epoch=2)
    for i in range(7):
        h.write(leader_epoch=2, state_epoch=1, batches=[batch(i, i + 3, i % 3, i)])
    reloaded = h.reloaded()
    assert reloaded.admin_state(KEY) == h.shard.admin_state(KEY)
