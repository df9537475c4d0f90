"""Stateful hypothesis test of the shard.

Random sequences of RPCs (and the periodic jobs) run against the shard and against a
model that restates docs/semantics.md §4-§6, §10 and §A directly as state transitions (no records).
After every step:

* every response equals the model's;
* the shard's admin state (stored state plus fencing maxima) equals the model's;
* replaying the records emitted so far into a fresh shard gives the identical state,
  update counters and prune mark: the load path equals the live path.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol import errors
from protocol.batches import combine_state_batches
from protocol.messages import (
    AdminState,
    Fencing,
    PartitionResult,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
)
from protocol.records import ShareKey
from protocol.shard import ShardConfig
from protocol.state_batch import StateBatch
from tests.shard.harness import Catalog, Harness
from tests.shard.ops import (
    ColdSnapshotOp,
    DeleteOp,
    DeleteTopicsOp,
    ExpireGroupsOp,
    InitializeOp,
    ReadOp,
    ReadSummaryOp,
    WriteOp,
)

TOPICS = ["AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg"]
KEYS = [ShareKey(g, t, p) for g in ("g1", "g2") for t in TOPICS for p in (0, 1)]
COLD_INTERVAL = 1_000

epochs = st.integers(-1, 4)
offsets = st.integers(-1, 30)
batch_lists = st.lists(
    st.builds(
        lambda first, length, state, count: StateBatch(first, first + length, state, count),
        st.integers(0, 30),
        st.integers(0, 8),
        st.sampled_from([0, 1, 2, 4]),
        st.integers(0, 3),
    ),
    max_size=4,
)


@dataclass
class ModelKey:
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create: int
    write: int
    batches: list[StateBatch]
    dcc: int
    leader_fence: int
    state_fence: int
    counter: int | None = None

    def admin(self, key: ShareKey) -> AdminState:
        return AdminState(
            key.group_id,
            key.topic_id,
            key.partition,
            self.snapshot_epoch,
            self.state_epoch,
            self.leader_epoch,
            self.start_offset,
            self.dcc,
            self.batches,
            Fencing(self.state_fence, self.leader_fence),
        )


class ShardMachine(RuleBasedStateMachine):
    @initialize(
        n=st.sampled_from([0, 1, 3, 500]),
        with_catalog=st.booleans(),
    )
    def setup(self, n: int, with_catalog: bool) -> None:
        self.n = n
        self.catalog = Catalog({TOPICS[0]: 2, TOPICS[1]: 1}) if with_catalog else None
        self.h = Harness(
            ShardConfig(records_per_snapshot=n, cold_partition_snapshot_interval_ms=COLD_INTERVAL),
            metadata=self.catalog,
        )
        self.model: dict[ShareKey, ModelKey] = {}

    # --- model helpers ----------------------------------------------------------------

    def unknown(self, key: ShareKey) -> bool:
        if self.catalog is None:
            return False
        count = self.catalog.partition_count(key.topic_id)
        return count is None or count <= key.partition

    def now(self) -> int:
        return self.h.clock.now

    def model_write(self, m: ModelKey, leader: int, start: int, batches, dcc: int) -> None:
        """§6 decided, then §4 replayed, as one state transition."""
        if (m.counter or 0) >= self.n:
            new_start = m.start_offset if start == -1 else start
            m.snapshot_epoch += 1
            m.leader_epoch = leader
            m.start_offset = new_start
            m.batches = combine_state_batches(m.batches, batches, new_start)
            m.create = m.write = self.now()
            if dcc != -1:
                m.dcc = dcc
            m.leader_fence = max(m.leader_fence, leader)
            if m.counter is not None and m.counter >= self.n:
                m.counter = 0
        else:
            normalised = combine_state_batches([], batches, start)
            new_start = m.start_offset if start == -1 else start
            m.batches = combine_state_batches(m.batches, normalised, new_start)
            m.start_offset = new_start
            if leader != -1:
                m.leader_epoch = leader
            m.leader_fence = max(m.leader_fence, leader)
            if dcc != -1:
                m.dcc = dcc
            m.counter = 0 if m.counter is None else m.counter + 1

    # --- rules ------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), state_epoch=epochs, start_offset=offsets)
    def initialize(self, key, state_epoch, start_offset):
        _, got = self.h.apply(InitializeOp(key, state_epoch, start_offset))
        m = self.model.get(key)
        if state_epoch != -1 and m is not None and m.state_fence > state_epoch:
            expected = PartitionResult(key.partition, 124, errors.default_message(124))
        elif self.unknown(key):
            expected = PartitionResult(key.partition, 3, errors.default_message(3))
        else:
            expected = PartitionResult(key.partition, 0, None)
            now = self.now()
            dcc = -1 if start_offset == -1 else 0
            if m is None:
                self.model[key] = ModelKey(
                    0, state_epoch, 0, start_offset, now, now, [], dcc, 0, state_epoch
                )
            else:
                m.snapshot_epoch += 1
                m.state_epoch, m.leader_epoch, m.start_offset = state_epoch, 0, start_offset
                m.create = m.write = now
                m.batches, m.dcc = [], dcc
                m.state_fence = max(m.state_fence, state_epoch)
                if m.counter is not None and m.counter >= self.n:
                    m.counter = 0
        assert got == expected

    @rule(key=st.sampled_from(KEYS), leader_epoch=epochs)
    def read(self, key, leader_epoch):
        _, got = self.h.apply(ReadOp(key, leader_epoch))
        m = self.model.get(key)
        if m is None:
            expected = ReadPartitionResult(
                key.partition, 42, errors.MSG_READ_UNINITIALIZED, 0, 0, []
            )
        elif m.leader_fence > leader_epoch:
            expected = ReadPartitionResult(key.partition, 74, errors.default_message(74), 0, 0, [])
        elif self.unknown(key):
            expected = ReadPartitionResult(key.partition, 3, errors.default_message(3), 0, 0, [])
        else:
            expected = ReadPartitionResult(
                key.partition, 0, None, m.state_epoch, m.start_offset, list(m.batches)
            )
            if leader_epoch not in (-1, m.leader_fence):
                self.model_write(m, leader_epoch, m.start_offset, [], -1)
        assert got == expected

    @rule(
        key=st.sampled_from(KEYS),
        state_epoch=epochs,
        leader_epoch=epochs,
        start_offset=offsets,
        batches=batch_lists,
        dcc=st.integers(-1, 5),
    )
    def write(self, key, state_epoch, leader_epoch, start_offset, batches, dcc):
        _, got = self.h.apply(WriteOp(key, state_epoch, leader_epoch, start_offset, batches, dcc))
        m = self.model.get(key)
        if m is None:
            expected = PartitionResult(key.partition, 42, errors.MSG_WRITE_UNINITIALIZED)
        elif leader_epoch != -1 and m.leader_fence > leader_epoch:
            expected = PartitionResult(key.partition, 74, errors.default_message(74))
        elif state_epoch != -1 and m.state_fence > state_epoch:
            expected = PartitionResult(key.partition, 124, errors.default_message(124))
        elif self.unknown(key):
            expected = PartitionResult(key.partition, 3, errors.default_message(3))
        else:
            expected = PartitionResult(key.partition, 0, None)
            self.model_write(m, m.leader_epoch, start_offset, batches, dcc)
        assert got == expected

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key):
        _, got = self.h.apply(DeleteOp(key))
        if self.unknown(key):
            expected = PartitionResult(key.partition, 3, errors.default_message(3))
        else:
            expected = PartitionResult(key.partition, 0, None)
            self.model.pop(key, None)
        assert got == expected

    @rule(key=st.sampled_from(KEYS))
    def read_summary(self, key):
        records, got = self.h.apply(ReadSummaryOp(key))
        assert records == []
        m = self.model.get(key)
        if self.unknown(key):
            expected = ReadSummaryPartitionResult(
                key.partition, 3, errors.default_message(3), 0, 0, 0, -1
            )
        elif m is None:
            expected = ReadSummaryPartitionResult(key.partition, 0, None, 0, 0, -1, -1)
        else:
            expected = ReadSummaryPartitionResult(
                key.partition, 0, None, m.state_epoch, m.leader_epoch, m.start_offset, m.dcc
            )
        assert got == expected

    @rule(elapsed=st.integers(0, 2 * COLD_INTERVAL))
    def cold_snapshot_job(self, elapsed):
        self.h.clock.now += elapsed
        _, count = self.h.apply(ColdSnapshotOp())
        states = list(self.model.values())
        if all(m.create != m.write for m in states):
            assert count == 0
            return
        eligible = [m for m in states if self.now() - m.write >= COLD_INTERVAL]
        assert count == len(eligible)
        for m in eligible:
            m.snapshot_epoch += 1
            m.write = self.now()
            if m.counter is not None and m.counter >= self.n:
                m.counter = 0

    @rule(topic=st.sampled_from(TOPICS))
    def topic_deleted(self, topic):
        _, count = self.h.apply(DeleteTopicsOp(frozenset({topic})))
        doomed = [k for k in self.model if k.topic_id == topic]
        assert count == len(doomed)
        for k in doomed:
            del self.model[k]

    @rule(group=st.sampled_from(["g1", "g2"]))
    def group_expired(self, group):
        _, count = self.h.apply(ExpireGroupsOp(frozenset({group})))
        doomed = [k for k in self.model if k.group_id == group]
        assert count == len(doomed)
        for k in doomed:
            del self.model[k]

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def shard_state_equals_model(self):
        shard = self.h.shard
        assert sorted(shard) == sorted(self.model)
        for key, m in self.model.items():
            assert shard.admin_state(key) == m.admin(key)
            assert shard.key_state(key).update_count == m.counter

    @invariant()
    def load_path_equals_live_path(self):
        live = self.h.shard
        loaded = self.h.reloaded()
        assert sorted(loaded) == sorted(live)
        for key in live:
            assert loaded.admin_state(key) == live.admin_state(key)
            assert loaded.key_state(key).update_count == live.key_state(key).update_count
            assert loaded.key_state(key).snapshot_offset == live.key_state(key).snapshot_offset
        assert loaded.last_redundant_offset() == live.last_redundant_offset()


ShardMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_shard_state_machine = ShardMachine.TestCase
