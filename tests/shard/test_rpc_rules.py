"""docs/semantics.md §5 (the RPCs), §6 (snapshot or update) and §15
(delivery_complete_count), with the adaptations of §A / §A.1. One test per rule, named
after it."""

from __future__ import annotations

import pytest

from protocol import errors
from protocol.messages import ReadSummaryPartitionResult
from protocol.records import ShareKey, ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.shard import ShardConfig
from tests.shard.harness import KEY, Catalog, Harness, batch
from tests.shard.ops import DeleteOp, InitializeOp, ReadOp, ReadSummaryOp, WriteOp, handle

TOPIC = KEY.topic_id


def harness(n: int = 500, catalog: Catalog | None = None) -> Harness:
    return Harness(ShardConfig(records_per_snapshot=n), metadata=catalog)


def code(response) -> int:
    return response.error_code


# --- §5.1 InitializeShareGroupState -----------------------------------------------------


def test_5_1_initialize_fresh_key_writes_snapshot_epoch_zero():
    h = harness()
    records, response = h.initialize(state_epoch=1, start_offset=-1)
    assert response.error_code == 0 and response.error_message is None
    assert records == [ShareSnapshot(KEY, 0, 1, 0, -1, h.clock.now, h.clock.now, [], -1, 0, 1)]


def test_5_1_initialize_existing_key_bumps_snapshot_epoch_and_discards_batches():
    h = harness()
    h.initialize(state_epoch=1, start_offset=0)
    h.write(batches=[batch(0, 9)], state_epoch=1)
    records, _ = h.initialize(state_epoch=2, start_offset=5)
    (snap,) = records
    assert (snap.snapshot_epoch, snap.state_epoch, snap.leader_epoch) == (1, 2, 0)
    assert snap.start_offset == 5 and snap.state_batches == []


def test_5_1_initialize_older_state_epoch_is_fenced_with_124():
    h = harness()
    h.initialize(state_epoch=5)
    records, response = h.initialize(state_epoch=4)
    assert records == []
    assert code(response) == errors.FENCED_STATE_EPOCH
    assert response.error_message == errors.default_message(124)


def test_5_1_initialize_equal_state_epoch_reinitializes():
    h = harness()
    h.initialize(state_epoch=5)
    records, response = h.initialize(state_epoch=5)
    assert code(response) == 0 and len(records) == 1


def test_5_1_initialize_state_epoch_minus_one_skips_fencing():
    h = harness()
    h.initialize(state_epoch=5)
    _, response = h.initialize(state_epoch=-1)
    assert code(response) == 0


def test_5_1_initialize_checks_fencing_before_metadata():
    h = harness(catalog=Catalog({TOPIC: 1}))
    h.initialize(state_epoch=5)
    h.metadata.topics.clear()
    _, response = h.initialize(state_epoch=1)
    assert code(response) == errors.FENCED_STATE_EPOCH


@pytest.mark.parametrize("topics", [{}, {TOPIC: 0}])
def test_5_1_initialize_unknown_topic_or_partition_gives_3(topics):
    h = harness(catalog=Catalog(topics))
    records, response = h.initialize()
    assert records == [] and code(response) == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_5_1_after_initialize_leader_fence_keeps_its_max_and_state_fence_is_max():
    h = harness()
    h.initialize(state_epoch=3)
    h.read(leader_epoch=7)
    h.initialize(state_epoch=4)
    entry = h.shard.key_state(KEY)
    assert entry.leader_fence == 7
    assert entry.state.leader_epoch == 0
    assert entry.state_fence == 4


def test_5_1_initialize_leaves_the_update_counter_alone_below_the_limit():
    h = harness(n=5)
    h.initialize()
    h.write()
    h.write()
    h.initialize()
    assert h.shard.key_state(KEY).update_count == 1


# --- §5.2 ReadShareGroupState -----------------------------------------------------------


def test_5_2_read_uninitialized_key_is_42_with_kafkas_text():
    h = harness()
    records, response = h.read(leader_epoch=1)
    assert records == []
    assert code(response) == errors.INVALID_REQUEST
    assert response.error_message == "Read operation on uninitialized share partition not allowed."
    assert (response.state_epoch, response.start_offset, response.state_batches) == (0, 0, [])


def test_5_2_read_older_leader_epoch_is_fenced_with_74():
    h = harness()
    h.initialize()
    h.read(leader_epoch=5)
    records, response = h.read(leader_epoch=4)
    assert records == [] and code(response) == errors.FENCED_LEADER_EPOCH
    assert response.error_message == errors.default_message(74)


def test_5_2_read_has_no_minus_one_exemption():
    h = harness()
    h.initialize()
    _, response = h.read(leader_epoch=-1)
    assert code(response) == errors.FENCED_LEADER_EPOCH


def test_5_2_read_checks_metadata_after_fencing():
    h = harness(catalog=Catalog({TOPIC: 1}))
    h.initialize()
    h.read(leader_epoch=3)
    h.metadata.topics.clear()
    assert code(h.read(leader_epoch=2)[1]) == errors.FENCED_LEADER_EPOCH
    assert code(h.read(leader_epoch=3)[1]) == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_5_2_read_returns_the_stored_state():
    h = harness()
    h.initialize(state_epoch=2, start_offset=10)
    h.write(state_epoch=2, batches=[batch(10, 12, 2, 1)])
    _, response = h.read(leader_epoch=0)
    assert (response.state_epoch, response.start_offset) == (2, 10)
    assert response.state_batches == [batch(10, 12, 2, 1)]


def test_5_2_read_with_equal_leader_epoch_writes_nothing():
    h = harness()
    h.initialize()
    assert h.read(leader_epoch=0)[0] == []


def test_5_2_read_with_higher_leader_epoch_writes_an_update_and_answers_the_old_state():
    h = harness()
    h.initialize(start_offset=4)
    records, response = h.read(leader_epoch=3)
    assert records == [ShareUpdate(KEY, 0, 3, 4, [], -1)]
    assert code(response) == 0 and response.start_offset == 4
    assert h.shard.key_state(KEY).leader_fence == 3
    assert h.shard.key_state(KEY).state.leader_epoch == 3


def test_5_2_read_bump_follows_the_snapshot_decision_of_a_write():
    h = harness(n=0)
    h.initialize(start_offset=4)
    records, _ = h.read(leader_epoch=3)
    (snap,) = records
    assert type(snap) is ShareSnapshot
    assert (snap.snapshot_epoch, snap.leader_epoch, snap.start_offset) == (1, 3, 4)


# --- §5.3 WriteShareGroupState ----------------------------------------------------------


def test_5_3_write_uninitialized_key_is_42_with_kafkas_text():
    h = harness()
    records, response = h.write()
    assert records == []
    assert code(response) == errors.INVALID_REQUEST
    assert response.error_message == "Write operation on uninitialized share partition not allowed."


def test_5_3_write_validation_order_is_uninitialized_leader_state_metadata():
    h = harness(catalog=Catalog({TOPIC: 1}))
    h.initialize(state_epoch=5)
    h.read(leader_epoch=5)
    h.metadata.topics.clear()
    assert code(h.write(leader_epoch=4, state_epoch=4)[1]) == errors.FENCED_LEADER_EPOCH
    assert code(h.write(leader_epoch=5, state_epoch=4)[1]) == errors.FENCED_STATE_EPOCH
    assert code(h.write(leader_epoch=5, state_epoch=5)[1]) == errors.UNKNOWN_TOPIC_OR_PARTITION
    other = ShareKey(KEY.group_id, KEY.topic_id, 0 + 7)
    assert code(h.write(other)[1]) == errors.INVALID_REQUEST


def test_5_3_write_exempts_minus_one_for_both_epochs():
    h = harness()
    h.initialize(state_epoch=5)
    h.read(leader_epoch=5)
    records, response = h.write(leader_epoch=-1, state_epoch=-1)
    assert code(response) == 0 and len(records) == 1


def test_5_3_write_never_advances_the_epochs():
    h = harness()
    h.initialize(state_epoch=1)
    h.read(leader_epoch=3)
    records, response = h.write(leader_epoch=9, state_epoch=7)
    assert code(response) == 0
    assert records[0].leader_epoch == 3
    entry = h.shard.key_state(KEY)
    assert (entry.leader_fence, entry.state_fence, entry.state.state_epoch) == (3, 1, 1)


def test_5_3_write_produces_exactly_one_record():
    h = harness()
    h.initialize()
    records, _ = h.write(batches=[batch(0, 1), batch(5, 6, 2, 1)])
    assert len(records) == 1


def test_5_3_write_does_not_validate_start_offset_moving_backwards():
    h = harness()
    h.initialize(start_offset=100)
    h.write(start_offset=50)
    assert h.shard.key_state(KEY).state.start_offset == 50


# --- §5.4 DeleteShareGroupState ---------------------------------------------------------


def test_5_4_delete_absent_key_succeeds_without_a_record():
    h = harness()
    records, response = h.apply(DeleteOp(KEY))
    assert records == [] and code(response) == 0


def test_5_4_delete_present_key_writes_a_tombstone():
    h = harness()
    h.initialize()
    records, response = h.apply(DeleteOp(KEY))
    assert records == [ShareTombstone(KEY)] and code(response) == 0
    assert h.shard.key_state(KEY) is None


def test_5_4_delete_checks_metadata_before_existence():
    h = harness(catalog=Catalog({}))
    records, response = h.apply(DeleteOp(KEY))
    assert records == [] and code(response) == errors.UNKNOWN_TOPIC_OR_PARTITION


def test_5_4_delete_does_no_fencing():
    h = harness()
    h.initialize(state_epoch=9)
    h.read(leader_epoch=9)
    assert code(h.apply(DeleteOp(KEY))[1]) == 0


# --- §5.5 ReadShareGroupStateSummary ----------------------------------------------------


def test_5_5_summary_of_absent_key_succeeds_with_defaults():
    h = harness()
    records, response = h.apply(ReadSummaryOp(KEY))
    assert records == []
    assert response == ReadSummaryPartitionResult(KEY.partition, 0, None, 0, 0, -1, -1)


def test_5_5_summary_reads_the_stored_state_not_the_fences():
    h = harness()
    h.initialize(state_epoch=2, start_offset=7)
    h.read(leader_epoch=4)
    h.initialize(state_epoch=2, start_offset=9)
    _, response = h.apply(ReadSummaryOp(KEY))
    assert (response.state_epoch, response.leader_epoch, response.start_offset) == (2, 0, 9)
    assert h.shard.key_state(KEY).leader_fence == 4


def test_5_5_summary_unknown_topic_gives_3_and_writes_nothing():
    h = harness(catalog=Catalog({TOPIC: 1}))
    h.initialize()
    h.metadata.topics[TOPIC] = 0
    records, response = h.apply(ReadSummaryOp(KEY))
    assert records == [] and code(response) == errors.UNKNOWN_TOPIC_OR_PARTITION
    assert response.delivery_complete_count == -1


# --- §6 snapshot or update --------------------------------------------------------------


def record_kinds(h: Harness, writes: int) -> list[str]:
    kinds = []
    for _ in range(writes):
        (record,), _ = h.write()
        kinds.append("S" if type(record) is ShareSnapshot else "U")
    return kinds


def test_6_first_snapshot_comes_after_n_plus_one_updates_then_every_n():
    h = harness(n=3)
    h.initialize()
    assert record_kinds(h, 14) == list("UUUUS" + "UUUS" + "UUUS" + "U")


def test_6_with_n_zero_every_write_is_a_snapshot():
    h = harness(n=0)
    h.initialize()
    assert record_kinds(h, 3) == list("SSS")


def test_a1_14_cadence_with_the_default_n_of_500():
    h = harness()
    h.initialize()
    kinds = record_kinds(h, 1003)
    assert kinds.index("S") == 501  # the 502nd write
    assert [i for i, k in enumerate(kinds) if k == "S"] == [501, 1002]


def test_6_snapshot_epoch_increments_by_one_per_snapshot_and_updates_carry_it():
    h = harness(n=1)
    h.initialize()
    epochs = [(type(r).__name__, r.snapshot_epoch) for _ in range(5) for r in h.write()[0]]
    assert epochs == [
        ("ShareUpdate", 0),
        ("ShareUpdate", 0),
        ("ShareSnapshot", 1),
        ("ShareUpdate", 1),
        ("ShareSnapshot", 2),
    ]


def test_6_snapshot_keeps_the_stored_state_epoch_not_the_requests():
    h = harness(n=0)
    h.initialize(state_epoch=2)
    (snap,), _ = h.write(state_epoch=9)
    assert snap.state_epoch == 2


def test_6_snapshot_merges_with_the_stored_batches_and_keeps_start_offset_on_minus_one():
    h = harness(n=0)
    h.initialize(start_offset=0)
    h.write(batches=[batch(0, 9)])
    (snap,), _ = h.write(start_offset=-1, batches=[batch(5, 6, 2, 1)])
    assert snap.start_offset == 0
    assert snap.state_batches == [batch(0, 4), batch(5, 6, 2, 1), batch(7, 9)]


def test_6_update_carries_the_raw_start_offset_and_normalised_request_batches():
    h = harness()
    h.initialize(start_offset=0)
    (upd,), _ = h.write(start_offset=-1, batches=[batch(5, 9), batch(0, 4)])
    assert upd.start_offset == -1
    assert upd.state_batches == [batch(0, 9)]
    (upd,), _ = h.write(start_offset=6, batches=[batch(0, 9)])
    assert upd.state_batches == [batch(6, 9)]


def test_6_empty_write_still_produces_a_record():
    h = harness()
    h.initialize()
    records, _ = h.write(start_offset=-1, batches=[])
    assert records == [ShareUpdate(KEY, 0, 0, -1, [], -1)]


# --- §15 delivery_complete_count --------------------------------------------------------


def test_15_initialize_sets_minus_one_without_start_offset_else_zero():
    h = harness()
    h.initialize(start_offset=-1)
    assert h.shard.key_state(KEY).state.delivery_complete_count == -1
    h.initialize(start_offset=3)
    assert h.shard.key_state(KEY).state.delivery_complete_count == 0


def test_15_write_update_carries_the_value_and_minus_one_keeps_it():
    h = harness()
    h.initialize(start_offset=0)
    (upd,), _ = h.write(delivery_complete_count=7)
    assert upd.delivery_complete_count == 7
    h.write(delivery_complete_count=-1)
    assert h.shard.key_state(KEY).state.delivery_complete_count == 7


def test_a1_7_limit_triggered_snapshot_of_a_minus_one_write_keeps_the_stored_value():
    h = harness(n=0)
    h.initialize(start_offset=0)
    h.write(delivery_complete_count=7)
    (snap,), _ = h.write(delivery_complete_count=-1)
    assert type(snap) is ShareSnapshot and snap.delivery_complete_count == 7


def test_15_read_bump_update_carries_minus_one():
    h = harness()
    h.initialize(start_offset=0)
    h.write(delivery_complete_count=4)
    (upd,), _ = h.read(leader_epoch=2)
    assert upd.delivery_complete_count == -1
    assert h.shard.key_state(KEY).state.delivery_complete_count == 4


def test_15_summary_returns_it():
    h = harness()
    h.initialize(start_offset=0)
    h.write(delivery_complete_count=12)
    assert h.apply(ReadSummaryOp(KEY))[1].delivery_complete_count == 12


# --- §A: fences carried in snapshots ----------------------------------------------------


def test_a_snapshots_carry_the_fencing_maxima():
    h = harness(n=0)
    h.initialize(state_epoch=3)
    h.read(leader_epoch=6)
    h.initialize(state_epoch=-1)
    (snap,), _ = h.write(leader_epoch=6, state_epoch=-1)
    assert (snap.fence_leader_epoch, snap.fence_state_epoch) == (6, 3)


def test_a_dropping_old_records_never_lowers_a_fence():
    h = harness(n=0)
    h.initialize(state_epoch=3)
    h.read(leader_epoch=6)
    h.initialize(state_epoch=-1)
    # Keep only the latest snapshot, as pruning or compaction could.
    last_offset, last = h.log[-1]
    fresh = Harness(h.config)
    fresh.shard.replay(last_offset, last)
    assert fresh.shard.admin_state(KEY) == h.shard.admin_state(KEY)
    assert fresh.shard.key_state(KEY).state_fence == 3
    assert fresh.shard.key_state(KEY).leader_fence == 6


def test_a1_8_initialize_with_minus_one_stores_minus_one_and_keeps_the_fence():
    h = harness()
    h.initialize(state_epoch=4)
    h.initialize(state_epoch=-1)
    entry = h.shard.key_state(KEY)
    assert entry.state.state_epoch == -1
    assert entry.state_fence == 4


def test_a1_10_admin_state_shows_state_and_fencing_without_side_effects():
    h = harness()
    h.initialize(state_epoch=2, start_offset=5)
    h.read(leader_epoch=3)
    before = list(h.log)
    admin = h.shard.admin_state(KEY)
    assert h.log == before
    assert ShareKey(admin.group_id, admin.topic_id, admin.partition) == KEY
    assert (admin.snapshot_epoch, admin.state_epoch, admin.leader_epoch) == (0, 2, 3)
    assert (admin.start_offset, admin.delivery_complete_count) == (5, 0)
    assert (admin.fencing.state_epoch, admin.fencing.leader_epoch) == (2, 3)
    assert h.shard.admin_state(ShareKey("nobody", TOPIC, 0)) is None


def test_handle_dispatches_every_rpc_operation():
    h = harness()
    assert code(h.apply(InitializeOp(KEY, 0, 0))[1]) == 0
    assert code(h.apply(ReadOp(KEY, 0))[1]) == 0
    assert code(h.apply(WriteOp(KEY, 0, 0, -1, []))[1]) == 0
    assert code(h.apply(ReadSummaryOp(KEY))[1]) == 0
    assert code(h.apply(DeleteOp(KEY))[1]) == 0
    with pytest.raises(TypeError):
        handle(h.shard, "not an op")  # type: ignore[arg-type]


# --- sharecoord's bound on a share-partition's stored batches (ShardConfig) ------------


def limited(max_state_batches: int, n: int = 500) -> Harness:
    return Harness(ShardConfig(records_per_snapshot=n, max_state_batches=max_state_batches))


def held(h: Harness) -> int:
    state = h.shard.key_state(KEY)
    assert state is not None
    return len(state.state.state_batches)


@pytest.mark.parametrize("records_per_snapshot", [500, 0])
def test_a_write_that_would_pass_the_batch_limit_is_refused_and_writes_nothing(
    records_per_snapshot,
):
    h = limited(10, records_per_snapshot)
    h.initialize()
    assert code(h.write(batches=[batch(2 * i, 2 * i) for i in range(10)])[1]) == 0
    assert held(h) == 10
    records, response = h.write(batches=[batch(100, 100)])
    assert records == []
    assert code(response) == errors.INVALID_REQUEST
    assert response.error_message == (
        "the share-partition's state would hold 11 state batches, over the limit of 10 "
        "(max_state_batches_per_share_partition)"
    )
    assert held(h) == 10


def test_the_limit_counts_what_the_merge_leaves_not_what_was_sent():
    h = limited(10)
    h.initialize()
    assert code(h.write(batches=[batch(2 * i, 2 * i, 2, 3) for i in range(5)])[1]) == 0
    # One low batch under five high ones fills the four gaps and the end: 5 + 5 = 10 ...
    assert code(h.write(batches=[batch(0, 9, 0, 1)])[1]) == 0
    assert held(h) == 10
    # ... and a batch over what is stored, or a start offset past some of it, adds none.
    assert code(h.write(batches=[batch(0, 9, 2, 5)])[1]) == 0
    assert held(h) == 1
    assert code(h.write(batches=[batch(20 + 2 * i, 20 + 2 * i) for i in range(9)])[1]) == 0
    assert held(h) == 10
    assert code(h.write(start_offset=30, batches=[batch(40, 40)])[1]) == 0
    assert held(h) == 5  # 30, 32, 34, 36 and 40


def test_a_few_batches_that_split_many_are_counted_after_the_merge():
    h = limited(9)
    h.initialize()
    assert code(h.write(batches=[batch(2 * i, 2 * i, 2, 3) for i in range(5)])[1]) == 0
    # Six batches sent and stored, yet the merge would leave ten.
    records, response = h.write(batches=[batch(0, 9, 0, 1)])
    assert records == [] and code(response) == errors.INVALID_REQUEST
    assert "would hold 10 state batches, over the limit of 9" in response.error_message
    assert held(h) == 5
