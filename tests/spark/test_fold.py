"""The fold (spark_jobs/fold.py), run directly: it replays to exactly the state the whole
log replays to, for logs the daemon writes and for any hand-made sequence of records."""

from __future__ import annotations

from collections import defaultdict

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.batches
from persistence import decode_frame
from protocol.batches import combine_state_batches
from protocol.messages import AdminState
from protocol.records import (
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    encode_record,
)
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, ShareStateMap
from protocol.state_batch import StateBatch
from spark_jobs.fold import encode_frames, fold_records
from spark_jobs.sealed import RawRecord
from tests.protocol.batch_shapes import SHAPES
from tests.spark.histories import (
    BASE_TIME_MS,
    KEYS,
    admin_states,
    decoded,
    hand_made_records,
    raw_records,
    replayed_shard,
    rpc_histories,
    run_rpcs,
)

NUM_PARTITIONS = 2
NO_CUTOFF = -(2**62)  # keep every tombstone
KEY = KEYS[0]


def replayed(records: list[RawRecord]) -> dict[ShareKey, AdminState | None]:
    return admin_states(replayed_shard(decoded(records)))


def last_record_per_key(records: list[RawRecord]) -> dict[bytes, RawRecord]:
    return {record[3]: record for record in records}


def raw(offset: int, record: object, timestamp: int = BASE_TIME_MS) -> RawRecord:
    record_type, key, value = encode_record(record)  # type: ignore[arg-type]
    return (offset, timestamp, record_type, key, value)


def snapshot(key: ShareKey = KEY, **fields: object) -> ShareSnapshot:
    values: dict[str, object] = dict(
        snapshot_epoch=0,
        state_epoch=1,
        leader_epoch=0,
        start_offset=0,
        create_timestamp=5,
        write_timestamp=5,
        state_batches=[StateBatch(0, 4, 0, 1)],
        delivery_complete_count=-1,
        fence_leader_epoch=0,
        fence_state_epoch=1,
    )
    values.update(fields)
    return ShareSnapshot(key, **values)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(rpc_histories, st.integers(0, 4))
def test_a_folded_rpc_history_replays_to_the_same_admin_state_with_one_record_per_key(
    ops: list[object], records_per_snapshot: int
) -> None:
    appended = run_rpcs(ops, NUM_PARTITIONS, records_per_snapshot)  # type: ignore[arg-type]
    for p in range(NUM_PARTITIONS):
        records = raw_records(a for a in appended if a.state_partition == p)
        folded = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF)
        assert replayed(folded.records) == replayed(records)
        last = last_record_per_key(records)
        live = sum(1 for r in last.values() if r[4] is not None)
        tombstoned = len(last) - live
        assert (folded.snapshots, folded.tombstones_kept) == (live, tombstoned)
        assert len(folded.records) == len(last)
        assert folded.verbatim_updates == 0
        # Each key's record sits at its last record's offset, in offset order.
        assert [r[0] for r in folded.records] == sorted(r[0] for r in last.values())


@settings(max_examples=300, deadline=None)
@given(hand_made_records(), st.integers(BASE_TIME_MS - 2500, BASE_TIME_MS + 2500))
def test_a_folded_hand_made_log_replays_to_the_same_admin_state(
    records: list[RawRecord], cutoff: int
) -> None:
    folded = fold_records(records, tombstone_cutoff_ms=cutoff)
    assert replayed(folded.records) == replayed(records)
    offsets = [r[0] for r in folded.records]
    assert offsets == sorted(set(offsets))
    last = last_record_per_key(records)
    for record in folded.records:
        # Kept as it was, or a folded snapshot at its key's last record.
        assert record in records or (record[2] == 0 and record[0] == last[record[3]][0])


def fences(records: list[RawRecord]) -> dict[ShareKey, tuple[int, int | None]]:
    """Each key's (leader fence, state fence) after the daemon's replay of `records`."""
    state = ShareStateMap(DEFAULT_RECORDS_PER_SNAPSHOT)
    for offset, record in decoded(records):
        state.replay(offset, record)
    return {key: (entry.leader_fence, entry.state_fence) for key, entry in state.keys.items()}


@settings(max_examples=500, deadline=None)
@given(hand_made_records())
def test_the_fold_and_the_replay_agree_on_every_keys_fences(records: list[RawRecord]) -> None:
    """One fence rule: compaction must not fence a leader the daemon lets in, nor let in
    one it fences. Every folded snapshot carries its key's fences as the whole log's
    replay has them, and the folded log replays to the same fences."""
    whole = fences(records)
    folded = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF).records
    assert fences(folded) == whole
    for _, record in decoded(folded):
        if type(record) is ShareSnapshot:
            assert (record.fence_leader_epoch, record.fence_state_epoch) == whole[record.key]


@settings(max_examples=200, deadline=None)
@given(hand_made_records())
def test_only_keys_never_snapshotted_keep_more_than_one_record(records: list[RawRecord]) -> None:
    folded = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF)
    by_key: dict[bytes, list[RawRecord]] = defaultdict(list)
    for record in folded.records:
        by_key[record[3]].append(record)
    for key, kept in by_key.items():
        history = [r for r in records if r[3] == key]
        since_reset = history[
            max((i for i, r in enumerate(history) if r[2] == 0), default=-1) + 1 :
        ]
        if len(kept) > 1 or kept[0][2] == 1:
            # Updates after the key's last tombstone, or from its start: kept verbatim.
            last_reset = [r for r in history if r[2] == 0]
            assert not last_reset or last_reset[-1][4] is None
            assert kept == since_reset
        else:
            assert kept[0][0] == history[-1][0]


@settings(max_examples=100, deadline=None)
@given(hand_made_records(), st.integers(BASE_TIME_MS - 2500, BASE_TIME_MS + 2500))
def test_folding_a_folded_log_changes_nothing(records: list[RawRecord], cutoff: int) -> None:
    folded = fold_records(records, tombstone_cutoff_ms=cutoff)
    again = fold_records(folded.records, tombstone_cutoff_ms=cutoff)
    assert again.records == folded.records


def test_a_tombstone_older_than_the_retention_takes_its_key_along() -> None:
    records = [
        raw(0, snapshot()),
        raw(1, ShareTombstone(KEY), timestamp=1000),
        raw(2, snapshot(KEYS[1])),
        raw(3, ShareTombstone(KEYS[1]), timestamp=2000),
    ]
    folded = fold_records(records, tombstone_cutoff_ms=2000)
    # Older than the cutoff: dropped; at the cutoff (age == retention): kept.
    assert folded.records == [records[3]]
    assert (folded.tombstones_dropped, folded.tombstones_kept) == (1, 1)


def test_the_folded_snapshot_takes_the_last_records_offset_and_timestamp() -> None:
    update = ShareUpdate(KEY, 0, 3, 2, [StateBatch(2, 9, 2, 2)], 4)
    read = ShareUpdate(KEY, 0, -1, -1, [], -1)
    records = [raw(10, snapshot(), 100), raw(12, update, 200), raw(15, read, 300)]
    (folded,) = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF).records
    assert folded[:3] == (15, 300, 0)
    record = RecordDecoder().decode(folded[2], folded[3], folded[4])
    assert isinstance(record, ShareSnapshot)
    assert (record.leader_epoch, record.start_offset, record.delivery_complete_count) == (3, 2, 4)
    assert (record.fence_leader_epoch, record.fence_state_epoch) == (3, 1)


def test_fences_from_before_the_last_snapshot_are_carried_into_the_fold() -> None:
    records = [
        raw(0, snapshot(state_epoch=7, fence_state_epoch=None)),
        raw(1, ShareUpdate(KEY, 0, 9, -1, [], -1)),  # leader epoch 9, then a lower snapshot
        raw(2, snapshot(state_epoch=2, leader_epoch=1, fence_leader_epoch=None)),
    ]
    (folded,) = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF).records
    record = RecordDecoder().decode(folded[2], folded[3], folded[4])
    assert isinstance(record, ShareSnapshot)
    assert (record.state_epoch, record.leader_epoch) == (2, 1)  # the state, verbatim
    assert (record.fence_state_epoch, record.fence_leader_epoch) == (7, 9)  # never lowered


def test_a_snapshot_that_already_is_the_fold_keeps_its_bytes() -> None:
    records = [raw(0, snapshot(leader_epoch=2, fence_leader_epoch=2)), raw(3, snapshot())]
    # The first snapshot's leader epoch 2 is more than the second's fence says.
    folded = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF).records
    assert folded != [records[1]]
    assert fold_records(folded, tombstone_cutoff_ms=NO_CUTOFF).records == folded
    assert fold_records([records[1]], tombstone_cutoff_ms=NO_CUTOFF).records == [records[1]]


def test_updates_of_a_key_never_snapshotted_are_kept_as_they_are() -> None:
    # Only a hand-made log holds them: such a key has no state-epoch fence (null in the
    # admin state), which no snapshot can express.
    records = [
        raw(0, ShareTombstone(KEY)),
        raw(1, ShareUpdate(KEY, 0, 3, 0, [StateBatch(0, 3, 0, 1)], -1)),
        raw(2, ShareUpdate(KEY, 0, -1, 2, [], -1)),
    ]
    folded = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF)
    assert folded.records == records[1:]
    assert folded.verbatim_updates == 2
    state = replayed(folded.records)[KEY]
    assert state is not None and state.fencing.state_epoch is None


def garbage_values() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=12),
        st.builds(
            msgpack.packb,
            st.lists(
                st.one_of(st.integers(-2, 9), st.none(), st.lists(st.integers(0, 3))), max_size=12
            ),
        ),
    )


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0, 1, 2, 7]), garbage_values(), st.booleans())
def test_a_record_is_refused_exactly_when_the_daemon_refuses_to_load_it(
    record_type: int, value: bytes, superseded: bool
) -> None:
    """The light phase does not build every record, but it checks each as the decoder
    does, and the tail after a key's last snapshot is folded as loading folds it:
    compaction never turns a log the daemon cannot load into one it can."""
    key = encode_record(snapshot())[1]
    made = (0 if superseded else 1, BASE_TIME_MS, record_type, key, value)
    records = [made, raw(1, snapshot())] if superseded else [raw(0, snapshot()), made]
    try:
        replayed(records)  # the daemon's load: decode and replay every record
        loads = True
    except Exception:  # whatever stops the load
        loads = False
    try:
        fold_records(records, tombstone_cutoff_ms=NO_CUTOFF)
        folds = True
    except (RecordDecodeError, TypeError, ValueError):
        folds = False
    assert folds == loads


@pytest.mark.parametrize("snapshotted", [True, False])
def test_a_tail_whose_merge_would_loop_is_refused_as_the_daemon_refuses_it(
    snapshotted: bool,
) -> None:
    """Inverted batches that make the merge cycle stop the daemon's load; they stop the
    fold too, whether the key's tail starts with a snapshot (folded into one) or with an
    update (kept as it is)."""
    created = [StateBatch(5, 10, 0, 1)]
    head: object = snapshot(state_batches=created)
    if not snapshotted:
        head = ShareUpdate(KEY, 0, 0, 0, created, -1)
    records = [raw(0, head), raw(1, ShareUpdate(KEY, 0, 0, -1, [StateBatch(8, 3, 0, 2)], -1))]
    with pytest.raises(ValueError, match="inverted"):
        replayed(records)
    with pytest.raises(ValueError, match="inverted"):
        fold_records(records, tombstone_cutoff_ms=NO_CUTOFF)


def test_an_update_with_a_null_value_is_refused_even_when_a_snapshot_follows() -> None:
    key = encode_record(snapshot())[1]
    with pytest.raises(RecordDecodeError, match="null value"):
        fold_records(
            [(0, BASE_TIME_MS, 1, key, None), raw(1, snapshot())], tombstone_cutoff_ms=NO_CUTOFF
        )


def test_encode_frames_writes_the_records_as_log_frames() -> None:
    records = [raw(4, snapshot()), raw(9, ShareTombstone(KEYS[1]))]
    frames = encode_frames(records)
    read = [decode_frame(frame)[0] for frame in frames]
    assert [(r.offset, r.timestamp, r.record_type, r.key, r.value) for r in read] == records


def test_folding_updates_of_adversarial_shapes_costs_linear_work(monkeypatch) -> None:
    """A hand-made log may hold a raw staircase in an update (the daemon writes combined
    batches): the fold merges it with the daemon's replay, through the sweep, in linear
    work, and gives Kafka's state."""
    work: list[int] = []
    real = protocol.batches.sweep

    def counted(entries):  # type: ignore[no-untyped-def]
        out, done = real(entries)
        work.append(done)
        return out, done

    monkeypatch.setattr(protocol.batches, "sweep", counted)
    for name, shape in sorted(SHAPES.items()):
        batches = shape(3_000)
        work.clear()
        records = [
            raw(0, snapshot(state_batches=[])),
            raw(1, ShareUpdate(KEY, 0, 0, -1, batches, -1)),
        ]
        (folded,) = fold_records(records, tombstone_cutoff_ms=NO_CUTOFF).records
        record = RecordDecoder().decode(folded[2], folded[3], folded[4])
        assert isinstance(record, ShareSnapshot)
        assert record.state_batches == combine_state_batches(batches, [], -1), name
        assert work and max(work) <= 8 * len(batches) + 64, (name, work)
