"""The share-group state RPCs (Kafka apiKeys 83-87) in Kafka's binary protocol, and the
table of the APIs the Kafka listener serves. Pure, no I/O.

Requests decode straight into the Structs of ``protocol.messages`` (what the HTTP edge
decodes its bodies into), so ``protocol.codec.prepare_request`` and the service handle
them exactly as they handle HTTP; answers encode from the same Structs. All five are
flexible from version 0: request header v2, response header v1, compact strings and
arrays, tagged fields after every structure (``protocol.kafka_wire``).

Served APIs and versions (what ApiVersions answers; Kafka 4.1-4.3's ranges):

| apiKey | name | versions | flexible from |
| --- | --- | --- | --- |
| 10 | FindCoordinator | 0-6 | 3 |
| 17 | SaslHandshake | 1 | never |
| 18 | ApiVersions | 0-4 | 3 (its response header is always v0) |
| 36 | SaslAuthenticate | 0-2 | 2 |
| 83 | InitializeShareGroupState | 0 | 0 |
| 84 | ReadShareGroupState | 0 | 0 |
| 85 | WriteShareGroupState | 0-1 | 0 |
| 86 | DeleteShareGroupState | 0 | 0 |
| 87 | ReadShareGroupStateSummary | 0-1 | 0 |

Requests (every structure ends in tagged fields; ``[...]`` is a compact array)::

    83 Initialize   GroupId string, Topics [TopicId uuid, Partitions [Partition int32,
                    StateEpoch int32, StartOffset int64]]
    84 Read         GroupId string, Topics [TopicId uuid, Partitions [Partition int32,
                    LeaderEpoch int32]]
    85 Write        GroupId string, Topics [TopicId uuid, Partitions [Partition int32,
                    StateEpoch int32, LeaderEpoch int32, StartOffset int64,
                    DeliveryCompleteCount int32 (v1+; -1 when absent),
                    StateBatches [FirstOffset int64, LastOffset int64,
                    DeliveryState int8, DeliveryCount int16]]]
    86 Delete       GroupId string, Topics [TopicId uuid, Partitions [Partition int32]]
    87 ReadSummary  GroupId string, Topics [TopicId uuid, Partitions [Partition int32,
                    LeaderEpoch int32]]

Responses::

    83, 85, 86     Results [TopicId uuid, Partitions [Partition int32, ErrorCode int16,
                   ErrorMessage nullable string]]
    84 Read        Results [TopicId uuid, Partitions [Partition int32, ErrorCode int16,
                   ErrorMessage nullable string, StateEpoch int32, StartOffset int64,
                   StateBatches [FirstOffset int64, LastOffset int64, DeliveryState int8,
                   DeliveryCount int16]]]
    87 ReadSummary Results [TopicId uuid, Partitions [Partition int32, ErrorCode int16,
                   ErrorMessage nullable string, StateEpoch int32, LeaderEpoch int32,
                   StartOffset int64, DeliveryCompleteCount int32 (v1+)]]

A topic id is 16 bytes on the wire; decoded, it is its 22-character base64url text (as
Kafka prints it, and as the HTTP API spells it), and the answer writes it back as the
same 16 bytes. The decoder counts partition entries and state batches as it goes and
refuses a request over ``max_entries`` / ``max_batches`` before building the rest of it.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any

from protocol import kafka_wire as wire
from protocol.batches import StateBatch
from protocol.kafka_wire import Reader, WireError
from protocol.messages import (
    DeletePartition,
    InitializePartition,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicRequest,
    WritePartition,
)

FIND_COORDINATOR = 10
SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36

# apiKey -> (lowest, highest) version served.
SUPPORTED: dict[int, tuple[int, int]] = {
    FIND_COORDINATOR: (0, 6),
    SASL_HANDSHAKE: (1, 1),
    API_VERSIONS: (0, 4),
    SASL_AUTHENTICATE: (0, 2),
    83: (0, 0),
    84: (0, 0),
    85: (0, 1),
    86: (0, 0),
    87: (0, 1),
}
# apiKey -> first flexible version (None: never flexible).
_FLEXIBLE_FROM: dict[int, int | None] = {
    FIND_COORDINATOR: 3,
    SASL_HANDSHAKE: None,
    API_VERSIONS: 3,
    SASL_AUTHENTICATE: 2,
    83: 0,
    84: 0,
    85: 0,
    86: 0,
    87: 0,
}
RPCS: dict[int, Rpc] = {rpc.api_key: rpc for rpc in Rpc}


def is_flexible(api_key: int, version: int) -> bool:
    first = _FLEXIBLE_FROM.get(api_key)
    return first is not None and version >= first


def request_header_version(api_key: int, version: int) -> int:
    """v2 for flexible versions, else v1 (none of our APIs ever used v0). For an
    ApiVersions request of a version newer than ours, Kafka reads the header as the
    newest version would be read: v2."""
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    """ApiVersions always answers with header v0: a client that does not know our
    versions yet must be able to read it."""
    if api_key == API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0


# --- topic ids ----------------------------------------------------------------------------

# A daemon sees few distinct topics: their two spellings are cached both ways, within a
# bound so that a client sending ever new ids cannot grow it.
_TEXT: dict[bytes, str] = {}
_RAW: dict[str, bytes] = {}
_CACHE_LIMIT = 4096


def topic_text(raw: bytes) -> str:
    text = _TEXT.get(raw)
    if text is None:
        if len(_TEXT) >= _CACHE_LIMIT:
            _TEXT.clear()
        text = _TEXT[raw] = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    return text


def topic_raw(text: str) -> bytes:
    """The 16 bytes of a topic id given in its 22-character form."""
    raw = _RAW.get(text)
    if raw is None:
        if len(_RAW) >= _CACHE_LIMIT:
            _RAW.clear()
        raw = base64.urlsafe_b64decode(text + "==")
        if len(raw) != 16:
            raise ValueError(f"topic id {text!r} is not 16 bytes")
        _RAW[text] = raw
    return raw


# --- requests -----------------------------------------------------------------------------

_BATCH = struct.Struct(">qqbh")
_BATCH_SIZE = _BATCH.size
_II = struct.Struct(">ii")
_IIQ = struct.Struct(">iiq")
_IIIQ = struct.Struct(">iiiq")


class Budget:
    """What one request may still hold: entries (a topic with none counts as one, as in
    ``protocol.codec.Limits``) and state batches per entry."""

    __slots__ = ("batches", "entries")

    def __init__(self, entries: int, batches: int) -> None:
        self.entries = entries
        self.batches = batches

    def take_entries(self, n: int) -> None:
        self.entries -= n or 1
        if self.entries < 0:
            raise WireError("more partition entries than --max-entries-per-request")


def _initialize(r: Reader, version: int, budget: Budget) -> InitializePartition:
    partition, state_epoch, start_offset = _IIQ.unpack_from(r.buf, r._take(16))
    r.skip_tagged_fields()
    return InitializePartition(partition, state_epoch, start_offset)


def _read(r: Reader, version: int, budget: Budget) -> ReadPartition:
    partition, leader_epoch = _II.unpack_from(r.buf, r._take(8))
    r.skip_tagged_fields()
    return ReadPartition(partition, leader_epoch)


def _read_summary(r: Reader, version: int, budget: Budget) -> ReadSummaryPartition:
    partition, leader_epoch = _II.unpack_from(r.buf, r._take(8))
    r.skip_tagged_fields()
    return ReadSummaryPartition(partition, leader_epoch)


def _delete(r: Reader, version: int, budget: Budget) -> DeletePartition:
    partition = r.int32()
    r.skip_tagged_fields()
    return DeletePartition(partition)


def _write(r: Reader, version: int, budget: Budget) -> WritePartition:
    partition, state_epoch, leader_epoch, start_offset = _IIIQ.unpack_from(r.buf, r._take(20))
    complete = r.int32() if version >= 1 else -1
    n = r.compact_array_length()
    if n > budget.batches:
        raise WireError("more state batches than --max-state-batches-per-entry")
    batches = []
    buf = r.buf
    for _ in range(n):
        first, last, state, count = _BATCH.unpack_from(buf, r._take(_BATCH_SIZE))
        r.skip_tagged_fields()
        batches.append(StateBatch(first, last, state, count))
    r.skip_tagged_fields()
    return WritePartition(partition, state_epoch, leader_epoch, start_offset, batches, complete)


_ENTRY_READERS: dict[Rpc, Callable[[Reader, int, Budget], Any]] = {
    Rpc.INITIALIZE: _initialize,
    Rpc.READ: _read,
    Rpc.WRITE: _write,
    Rpc.DELETE: _delete,
    Rpc.READ_SUMMARY: _read_summary,
}


def decode_state_request(
    rpc: Rpc, version: int, reader: Reader, budget: Budget
) -> ShareGroupStateRequest[Any]:
    """The body of one of the five RPCs, from the reader's position to its end."""
    read_entry = _ENTRY_READERS[rpc]
    r = reader
    group_id = r.compact_string()
    topics: list[TopicRequest[Any]] = []
    for _ in range(r.compact_array_length()):
        raw = r.uuid()
        n = r.compact_array_length()
        budget.take_entries(n)
        entries = [read_entry(r, version, budget) for _ in range(n)]
        r.skip_tagged_fields()
        topics.append(TopicRequest(topic_text(raw), entries))
    r.skip_tagged_fields()
    r.expect_end()
    return ShareGroupStateRequest(group_id, topics)


def is_empty_request(request: ShareGroupStateRequest[Any]) -> bool:
    """What Kafka's share coordinator answers with an empty response, doing nothing: an
    empty group id, no topics, or a topic without partitions."""
    return (
        not request.group_id
        or not request.topics
        or any(not topic.partitions for topic in request.topics)
    )


# --- responses ----------------------------------------------------------------------------

_PART = struct.Struct(">ih")
_READ_TAIL = struct.Struct(">iq")
_SUMMARY_TAIL = struct.Struct(">iiq")
_SUMMARY_TAIL_V1 = struct.Struct(">iiqi")
_BATCH_OUT = struct.Struct(">qqbhx")  # the pad byte is the batch's empty tagged fields
_CORRELATION = struct.Struct(">i")
_NULL = b"\x00"


def encode_state_response(
    rpc: Rpc, version: int, correlation_id: int, response: ShareGroupStateResponse[Any]
) -> bytes:
    """The whole frame of the answer: size, response header v1, body."""
    out = bytearray(b"\x00\x00\x00\x00")
    out += _CORRELATION.pack(correlation_id)
    out += _NULL  # the header's tagged fields
    results = response.results
    out += wire.uvarint(len(results) + 1)
    summary_tail = _SUMMARY_TAIL_V1 if version >= 1 else _SUMMARY_TAIL
    for topic in results:
        out += topic_raw(topic.topic_id)
        partitions = topic.partitions
        out += wire.uvarint(len(partitions) + 1)
        for p in partitions:
            out += _PART.pack(p.partition, p.error_code)
            message = p.error_message
            out += _NULL if message is None else wire.nullable_compact_string(message)
            if rpc is Rpc.READ:
                assert isinstance(p, ReadPartitionResult)
                out += _READ_TAIL.pack(p.state_epoch, p.start_offset)
                batches = p.state_batches
                out += wire.uvarint(len(batches) + 1)
                for b in batches:
                    out += _BATCH_OUT.pack(
                        b.first_offset, b.last_offset, b.delivery_state, b.delivery_count
                    )
            elif rpc is Rpc.READ_SUMMARY:
                assert isinstance(p, ReadSummaryPartitionResult)
                fields = (p.state_epoch, p.leader_epoch, p.start_offset)
                if version >= 1:
                    out += summary_tail.pack(*fields, p.delivery_complete_count)
                else:
                    out += summary_tail.pack(*fields)
            out += _NULL
        out += _NULL
    out += _NULL
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


# --- the client's side: requests as a share-partition leader sends them -------------------


def encode_state_request(rpc: Rpc, version: int, request: ShareGroupStateRequest[Any]) -> bytes:
    """The body (no header) of a request, for clients: the tests and the benchmark's
    load generator. Topic ids must be in their 22-character form."""
    out = bytearray(wire.compact_string(request.group_id))
    out += wire.uvarint(len(request.topics) + 1)
    for topic in request.topics:
        out += topic_raw(topic.topic_id)
        out += wire.uvarint(len(topic.partitions) + 1)
        for e in topic.partitions:
            if rpc is Rpc.INITIALIZE:
                out += _IIQ.pack(e.partition, e.state_epoch, e.start_offset)
            elif rpc in (Rpc.READ, Rpc.READ_SUMMARY):
                out += _II.pack(e.partition, e.leader_epoch)
            elif rpc is Rpc.DELETE:
                out += wire.int32(e.partition)
            else:
                out += _IIIQ.pack(e.partition, e.state_epoch, e.leader_epoch, e.start_offset)
                if version >= 1:
                    out += wire.int32(e.delivery_complete_count)
                out += wire.uvarint(len(e.state_batches) + 1)
                for b in e.state_batches:
                    out += _BATCH_OUT.pack(
                        b.first_offset, b.last_offset, b.delivery_state, b.delivery_count
                    )
            out += _NULL
        out += _NULL
    out += _NULL
    return bytes(out)


def encode_request_frame(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: str | None = None
) -> bytes:
    """A whole request frame: size, the header its API and version call for, body."""
    header = wire.request_header(
        api_key, version, correlation_id, client_id, request_header_version(api_key, version)
    )
    return wire.frame(header, body)
