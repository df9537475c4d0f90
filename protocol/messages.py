"""The wire schema of the HTTP API (docs/api.md), declared once as msgspec Structs.

Field names are the snake_case forms of Kafka's RPC schema fields (apiKeys 83-87);
the widths come from ``protocol.widths``. The same declarations are what the daemon
decodes request bodies into (``protocol.codec``), what the client encodes and decodes
(``protocol.client_codec``), and what ``openapi.yaml`` is generated from
(``server.http.openapi``). Field order is the order in which bodies are written.

A decoded request entry is the operation itself: ``protocol.codec`` sets two things on
it that never travel on the wire (they are attributes, not fields, so no body can set
them): ``invalid``, the message of a failed edge check (docs/semantics.md §A: negative partition,
``first_offset > last_offset``, unknown delivery state, ...), which fails that entry
alone with INVALID_REQUEST (42); and, for a write, ``batches_combined``: its batches
are already in the combiner's shape, so the shard can skip combining them with nothing.
A decoded topic carries ``key_topic_id``, the canonical 22-character form of its
``topic_id`` (which the answer echoes as spelled).
"""

from __future__ import annotations

import enum
from typing import Annotated, Generic, TypeVar, cast

from msgspec import Meta, Struct

from protocol.state_batch import StateBatch
from protocol.widths import GroupId, Int16, Int32, Int64, TopicIdText


class Rpc(enum.Enum):
    """The five share-group state RPCs, valued by their path segment."""

    # Looked up in dicts on every request: the identity hash (members are singletons and
    # compare by identity) instead of Enum's, a Python function hashing the name.
    __hash__ = object.__hash__

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
# dict=True: a decoded entry takes the decode pass's findings as plain attributes; the
# class attributes below (not annotated, so msgspec does not take them for fields) are
# their defaults. Only fields are ever decoded or encoded.


class InitializePartition(Struct, dict=True):
    partition: Int32
    state_epoch: Int32
    start_offset: Int64

    invalid = cast("str | None", None)


class ReadPartition(Struct, dict=True):
    partition: Int32
    leader_epoch: Int32

    invalid = cast("str | None", None)


class WritePartition(Struct, dict=True):
    partition: Int32
    state_epoch: Int32
    leader_epoch: Int32
    start_offset: Int64
    state_batches: list[StateBatch]
    delivery_complete_count: Int32 = -1

    invalid = cast("str | None", None)
    batches_combined = False


# A write entry's declared fields as ``msgspec.structs.astuple`` gives them, in this order,
# for compiled code (protocol/state_batch.py says why): protocol/codec.py, protocol/shard.py.
WriteFields = tuple[int, int, int, int, list[StateBatch], int]
WRITE_FIELD_ORDER = (
    "partition",
    "state_epoch",
    "leader_epoch",
    "start_offset",
    "state_batches",
    "delivery_complete_count",
)
if WritePartition.__struct_fields__ != WRITE_FIELD_ORDER:
    raise TypeError(f"WritePartition {WritePartition.__struct_fields__} differs from WriteFields")


class DeletePartition(Struct, dict=True):
    partition: Int32

    invalid = cast("str | None", None)


class ReadSummaryPartition(Struct, dict=True):
    partition: Int32
    leader_epoch: Int32 = -1

    invalid = cast("str | None", None)


RequestPartition = (
    InitializePartition | ReadPartition | WritePartition | DeletePartition | ReadSummaryPartition
)
P = TypeVar(
    "P", InitializePartition, ReadPartition, WritePartition, DeletePartition, ReadSummaryPartition
)


class TopicRequest(Struct, Generic[P], dict=True):
    """One topic entry; ``topic_id`` is echoed in the answer exactly as spelled."""

    topic_id: TopicIdText
    partitions: list[P]

    key_topic_id = ""


class ShareGroupStateRequest(Struct, Generic[P]):
    group_id: GroupId
    topics: list[TopicRequest[P]]

    def entry_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics)


REQUEST_PARTITIONS: dict[Rpc, type[RequestPartition]] = {
    Rpc.INITIALIZE: InitializePartition,
    Rpc.READ: ReadPartition,
    Rpc.WRITE: WritePartition,
    Rpc.DELETE: DeletePartition,
    Rpc.READ_SUMMARY: ReadSummaryPartition,
}


class FindCoordinatorRequest(Struct):
    """The keys are ``group:topicId:partition``; each is parsed on its own, and one that
    does not parse fails alone."""

    keys: Annotated[list[str], Meta(extra={"expected": "a list of strings"})]


class TopicRegistration(Struct):
    """``PUT /v1/admin/topics``: register or resize a topic of the topic catalog."""

    topic_id: TopicIdText
    partition_count: Annotated[
        int, Meta(ge=1, le=2**31 - 1, extra={"expected": "an integer from 1 to 2147483647"})
    ]


# --- responses ------------------------------------------------------------------------


class PartitionResult(Struct, gc=False):
    """Result of initialize, write and delete; ``error_message`` is null on success."""

    partition: Int32
    error_code: Int16
    error_message: str | None


class ReadPartitionResult(PartitionResult, gc=False):
    """Error results carry Kafka's schema defaults: 0, 0, [] (``error_result``)."""

    state_epoch: Int32
    start_offset: Int64
    state_batches: list[StateBatch]


class ReadSummaryPartitionResult(PartitionResult, gc=False):
    """Error results carry Kafka's schema defaults: 0, 0, 0, -1 (``error_result``)."""

    state_epoch: Int32
    leader_epoch: Int32
    start_offset: Int64
    delivery_complete_count: Int32


AnyPartitionResult = PartitionResult | ReadPartitionResult | ReadSummaryPartitionResult
R = TypeVar("R", PartitionResult, ReadPartitionResult, ReadSummaryPartitionResult)


class TopicResult(Struct, Generic[R]):
    topic_id: str
    partitions: list[R]


class ShareGroupStateResponse(Struct, Generic[R]):
    """Results mirror the request: same topics and entries, same order."""

    results: list[TopicResult[R]]


def error_result(rpc: Rpc, partition: int, code: int, message: str | None) -> AnyPartitionResult:
    """The failed result of ``rpc`` for one partition, with the schema's default fields."""
    if rpc is Rpc.READ:
        return ReadPartitionResult(partition, code, message, 0, 0, [])
    if rpc is Rpc.READ_SUMMARY:
        return ReadSummaryPartitionResult(partition, code, message, 0, 0, 0, -1)
    return PartitionResult(partition, code, message)


class CoordinatorResult(Struct):
    key: str
    state_partition: Int32
    node_id: Int32
    host: str
    port: Int32
    error_code: Int16
    error_message: str | None


class FindCoordinatorResponse(Struct):
    coordinators: list[CoordinatorResult]


class Fencing(Struct):
    """The maxima fencing uses (docs/semantics.md §2); ``state_epoch`` is null for a key built only
    from updates."""

    state_epoch: Int32 | None
    leader_epoch: Int32


class AdminState(Struct):
    """``GET /v1/admin/state``: the stored state of one key, no fencing, no side effect
    (docs/semantics.md §A.1 point 10). ``topic_id`` echoes the query's spelling."""

    group_id: str
    topic_id: str
    partition: Int32
    snapshot_epoch: Int32
    state_epoch: Int32
    leader_epoch: Int32
    start_offset: Int64
    delivery_complete_count: Int32
    state_batches: list[StateBatch]
    fencing: Fencing


class ErrorBody(Struct):
    """The body of every non-200 answer."""

    error_code: Int16
    error_message: str


# --- admin answers --------------------------------------------------------------------


class Acknowledged(Struct):
    """``PUT /v1/admin/topics``."""

    error_code: Int16


class TopicDeleted(Struct):
    """``DELETE /v1/admin/topics/{topic_id}``."""

    error_code: Int16
    deleted_share_partitions: int


class CompactionCommitted(Struct):
    """``POST /v1/admin/compaction/commit``: staged outputs as ``partition/base``."""

    committed: list[str]
    stale: list[str]


class PartitionStatus(Struct):
    """One state partition in ``GET /v1/admin/partitions``; the log fields are null
    while it loads."""

    partition: int
    status: str
    log_start_offset: int | None
    log_end_offset: int | None
    segments: int | None
    bytes: int | None
    keys: int
    error: str | None


class PartitionStatuses(Struct):
    partitions: list[PartitionStatus]


class Readiness(Struct):
    """``GET /readyz``."""

    status: str
    failed_partitions: list[int]


class Health(Struct):
    """``GET /healthz``."""

    status: str


class PartitionLeader(Struct):
    """One state partition in ``GET /v1/admin/cluster``: its leader as the leaders
    table holds it. ``node_id`` is null for a partition nobody ever led, ``lease_expiry``
    (RFC 3339, UTC) null for one never led or released; ``lease_remaining_ms`` is by
    PostgreSQL's clock, negative once expired; ``live``: the lease has not expired."""

    state_partition: int
    node_id: int | None
    epoch: int
    lease_expiry: str | None
    lease_remaining_ms: float | None
    live: bool


class ClusterNode(Struct):
    """One node in ``GET /v1/admin/cluster``: where it listens and its last heartbeat
    (RFC 3339, UTC), with its age by PostgreSQL's clock; ``live``: younger than the
    lease."""

    node_id: int
    http_listener: str | None
    kafka_listener: str | None
    last_heartbeat: str
    heartbeat_age_ms: float
    live: bool


class ClusterStatus(Struct):
    """``GET /v1/admin/cluster`` (and ``sharecoord cluster status --json``): every
    state partition's leader and every node, and how many partitions have no live
    leader."""

    lease_ms: int
    partitions_without_leader: int
    partitions: list[PartitionLeader]
    nodes: list[ClusterNode]
