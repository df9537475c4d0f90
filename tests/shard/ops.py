"""The shard's operations as the tests write them: one small tuple per RPC or job.

The daemon hands the shard the decoded request entry itself (``protocol.messages``);
these tuples say the same thing in fewer words, and ``handle`` turns one into the
shard call the runtime would make, returning ``(records, response)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from protocol.batches import is_clean
from protocol.messages import (
    AdminState,
    InitializePartition,
    PartitionResult,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
    WritePartition,
)
from protocol.records import Record, ShareKey
from protocol.shard import ShareCoordinatorShard
from protocol.state_batch import StateBatch


class InitializeOp(NamedTuple):
    key: ShareKey
    state_epoch: int
    start_offset: int


class ReadOp(NamedTuple):
    key: ShareKey
    leader_epoch: int


class WriteOp(NamedTuple):
    key: ShareKey
    state_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: list[StateBatch]
    delivery_complete_count: int = -1


class DeleteOp(NamedTuple):
    key: ShareKey


class ReadSummaryOp(NamedTuple):
    key: ShareKey


class AdminReadOp(NamedTuple):
    key: ShareKey


class DeleteTopicsOp(NamedTuple):
    topic_ids: frozenset[str]


class ExpireGroupsOp(NamedTuple):
    group_ids: frozenset[str]


class ColdSnapshotOp(NamedTuple):
    pass


Op = (
    InitializeOp
    | ReadOp
    | WriteOp
    | DeleteOp
    | ReadSummaryOp
    | AdminReadOp
    | DeleteTopicsOp
    | ExpireGroupsOp
    | ColdSnapshotOp
)
Response = (
    PartitionResult | ReadPartitionResult | ReadSummaryPartitionResult | AdminState | None | int
)


def write_entry(op: WriteOp) -> WritePartition:
    """The entry the daemon would decode, marked as its decode pass marks it."""
    entry = WritePartition(
        op.key.partition,
        op.state_epoch,
        op.leader_epoch,
        op.start_offset,
        op.state_batches,
        op.delivery_complete_count,
    )
    if len(op.state_batches) > 1 and is_clean(op.state_batches):
        entry.batches_combined = True
    return entry


def handle(shard: ShareCoordinatorShard, op: Op) -> tuple[list[Record], Response]:
    """Run ``op`` on ``shard`` as the runtime would: the records to append and the
    response. Changes nothing (the caller replays the records)."""
    record: Record | None
    result: Any
    if isinstance(op, WriteOp):
        record, result = shard.write(op.key, write_entry(op))
    elif isinstance(op, ReadOp):
        record, result = shard.read(op.key, ReadPartition(op.key.partition, op.leader_epoch))
    elif isinstance(op, InitializeOp):
        entry = InitializePartition(op.key.partition, op.state_epoch, op.start_offset)
        record, result = shard.initialize(op.key, entry)
    elif isinstance(op, DeleteOp):
        record, result = shard.delete(op.key)
    elif isinstance(op, ReadSummaryOp):
        record, result = shard.read_summary(op.key)
    elif isinstance(op, AdminReadOp):
        return [], shard.admin_state(op.key)
    else:
        if isinstance(op, DeleteTopicsOp):
            records = shard.delete_topics(op.topic_ids)
        elif isinstance(op, ExpireGroupsOp):
            records = shard.expire_groups(op.group_ids)
        elif isinstance(op, ColdSnapshotOp):
            records = shard.cold_snapshots()
        else:
            raise TypeError(f"not a shard operation: {op!r}")
        return records, len(records)
    return ([] if record is None else [record]), result
