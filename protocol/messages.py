"""Typed messages of the share-group state RPCs and find-coordinator (API.md).

Field names are the snake_case forms of Kafka's RPC schema fields (apiKeys 83-87).
These are plain data: ``protocol.codec`` turns bodies into them and back.

A request partition whose values are well-formed but fail an edge check (SPEC §A:
negative partition, ``first_offset > last_offset``, unknown delivery state, ...) is
decoded with ``invalid`` set to the message; it fails alone with INVALID_REQUEST (42)
and never reaches the state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from protocol.batches import StateBatch


class Rpc(enum.Enum):
    """The five share-group state RPCs, valued by their path segment."""

    INITIALIZE = "initialize"
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    READ_SUMMARY = "read-summary"

    @property
    def api_key(self) -> int:
        return _API_KEYS[self]


_API_KEYS = {
    Rpc.INITIALIZE: 83,
    Rpc.READ: 84,
    Rpc.WRITE: 85,
    Rpc.DELETE: 86,
    Rpc.READ_SUMMARY: 87,
}


# --- requests -------------------------------------------------------------------------


@dataclass(slots=True)
class InitializePartition:
    partition: int
    state_epoch: int
    start_offset: int
    invalid: str | None = None


@dataclass(slots=True)
class ReadPartition:
    partition: int
    leader_epoch: int
    invalid: str | None = None


@dataclass(slots=True)
class WritePartition:
    partition: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: list[StateBatch]
    delivery_complete_count: int = -1
    invalid: str | None = None


@dataclass(slots=True)
class DeletePartition:
    partition: int
    invalid: str | None = None


@dataclass(slots=True)
class ReadSummaryPartition:
    partition: int
    leader_epoch: int = -1
    invalid: str | None = None


RequestPartition = (
    InitializePartition | ReadPartition | WritePartition | DeletePartition | ReadSummaryPartition
)
P = TypeVar(
    "P", InitializePartition, ReadPartition, WritePartition, DeletePartition, ReadSummaryPartition
)


@dataclass(slots=True)
class TopicRequest(Generic[P]):
    """One topic entry. ``topic_id`` is echoed in the response exactly as spelled;
    ``key_topic_id`` is its canonical 22-char form, used for keys and routing."""

    topic_id: str
    key_topic_id: str
    partitions: list[P]


@dataclass(slots=True)
class ShareGroupStateRequest(Generic[P]):
    rpc: Rpc
    group_id: str
    topics: list[TopicRequest[P]]

    def entry_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics)


@dataclass(slots=True)
class FindCoordinatorRequest:
    keys: list[str]


# --- responses ------------------------------------------------------------------------


@dataclass(slots=True)
class PartitionResult:
    """Result of initialize, write and delete: ``partition``, ``error_code``,
    ``error_message`` (null on success)."""

    partition: int
    error_code: int = 0
    error_message: str | None = None


@dataclass(slots=True)
class ReadPartitionResult(PartitionResult):
    """Error results carry Kafka's schema defaults: 0, 0, []."""

    state_epoch: int = 0
    start_offset: int = 0
    state_batches: list[StateBatch] = field(default_factory=list)


@dataclass(slots=True)
class ReadSummaryPartitionResult(PartitionResult):
    """Error results carry Kafka's schema defaults: 0, 0, 0, -1."""

    state_epoch: int = 0
    leader_epoch: int = 0
    start_offset: int = 0
    delivery_complete_count: int = -1


AnyPartitionResult = PartitionResult | ReadPartitionResult | ReadSummaryPartitionResult
R = TypeVar("R", PartitionResult, ReadPartitionResult, ReadSummaryPartitionResult)


@dataclass(slots=True)
class TopicResult(Generic[R]):
    topic_id: str
    partitions: list[R]


@dataclass(slots=True)
class ShareGroupStateResponse(Generic[R]):
    rpc: Rpc
    results: list[TopicResult[R]]


def error_result(rpc: Rpc, partition: int, code: int, message: str | None) -> AnyPartitionResult:
    """The failed result of ``rpc`` for one partition, with the schema's default fields."""
    if rpc is Rpc.READ:
        return ReadPartitionResult(partition, code, message)
    if rpc is Rpc.READ_SUMMARY:
        return ReadSummaryPartitionResult(partition, code, message)
    return PartitionResult(partition, code, message)


@dataclass(slots=True)
class CoordinatorResult:
    key: str
    state_partition: int
    node_id: int
    host: str
    port: int
    error_code: int = 0
    error_message: str | None = None


@dataclass(slots=True)
class FindCoordinatorResponse:
    coordinators: list[CoordinatorResult]


@dataclass(slots=True)
class Fencing:
    state_epoch: int | None
    leader_epoch: int


@dataclass(slots=True)
class AdminState:
    """``GET /v1/admin/state``: the stored state of one key, no fencing, no side effect
    (SPEC §A.1 point 10). ``topic_id`` echoes the query's spelling."""

    group_id: str
    topic_id: str
    partition: int
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    state_batches: list[StateBatch]
    fencing: Fencing


@dataclass(slots=True)
class ErrorBody:
    """The body of every non-200 answer."""

    error_code: int
    error_message: str
