"""A shard driven the way the runtime drives it, with a list standing in for the log."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.records import Record, ShareKey
from protocol.shard import ShardConfig, ShareCoordinatorShard, TopicMetadata
from protocol.state_batch import StateBatch
from tests.shard.ops import InitializeOp, Op, ReadOp, Response, WriteOp, handle

KEY = ShareKey("group1", "AAAAAAAAAAAAAAAAAAAAAQ", 0)
OTHER_KEY = ShareKey("group1", "AAAAAAAAAAAAAAAAAAAAAQ", 1)


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Catalog:
    """A topic catalog stand-in: topic id -> partition count."""

    def __init__(self, topics: dict[str, int] | None = None) -> None:
        self.topics = dict(topics or {})

    def partition_count(self, topic_id: str) -> int | None:
        return self.topics.get(topic_id)


@dataclass
class Harness:
    config: ShardConfig = field(default_factory=ShardConfig)
    metadata: TopicMetadata | None = None
    clock: Clock = field(default_factory=Clock)
    log: list[tuple[int, Record]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shard = ShareCoordinatorShard(self.config, metadata=self.metadata, now_ms=self.clock)

    def apply(self, op: Op) -> tuple[list[Record], Response]:
        """handle -> append -> replay, as the runtime does."""
        records, response = handle(self.shard, op)
        for record in records:
            self.append(record)
        return records, response

    def append(self, record: Record) -> int:
        offset = self.log[-1][0] + 1 if self.log else 0
        self.log.append((offset, record))
        self.shard.replay(offset, record)
        return offset

    def reloaded(self) -> ShareCoordinatorShard:
        """A fresh shard that replayed this harness's log: the load path."""
        shard = ShareCoordinatorShard(self.config, metadata=self.metadata, now_ms=self.clock)
        for offset, record in self.log:
            shard.replay(offset, record)
        return shard

    # Shorthands for the common RPCs.
    def initialize(self, key: ShareKey = KEY, state_epoch: int = 0, start_offset: int = -1):
        return self.apply(InitializeOp(key, state_epoch, start_offset))

    def read(self, key: ShareKey = KEY, leader_epoch: int = 0):
        return self.apply(ReadOp(key, leader_epoch))

    def write(
        self,
        key: ShareKey = KEY,
        *,
        state_epoch: int = 0,
        leader_epoch: int = 0,
        start_offset: int = -1,
        batches: list[StateBatch] | None = None,
        delivery_complete_count: int = -1,
    ):
        return self.apply(
            WriteOp(
                key, state_epoch, leader_epoch, start_offset, batches or [], delivery_complete_count
            )
        )


def batch(first: int, last: int, state: int = 0, count: int = 1) -> StateBatch:
    return StateBatch(first, last, state, count)
