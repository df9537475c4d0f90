"""The share-group state RPCs (Kafka apiKeys 83-87) in Kafka's binary protocol, and the
table of the APIs the Kafka listener serves. Pure, no I/O.

Requests decode straight into the Structs of ``protocol.messages`` (what the HTTP edge
decodes its bodies into), so ``protocol.codec.prepare_request`` and the service handle
them exactly as they handle HTTP; answers encode from the same Structs.

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

The layouts of every message and version are declared in ``protocol/kafka_specs`` (one
JSON file per message, in the shape of Kafka's own) and compiled by
``protocol.kafka_codec``; this module says which typed message each structure is
(``_request_shapes``, ``_response_shapes``). The five RPCs are flexible from version 0:
request header v2, response header v1, compact strings and arrays, tagged fields after
every structure.

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
from protocol.kafka_codec import MessageCodec
from protocol.kafka_schema import MESSAGES, Converter, MessageSpec, Shape, SpecError, Versions
from protocol.kafka_wire import Reader, WireError
from protocol.messages import (
    REQUEST_PARTITIONS,
    AnyPartitionResult,
    PartitionResult,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicRequest,
    TopicResult,
)
from protocol.state_batch import StateBatch

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


def _declaration(api_key: int, kind: str) -> MessageSpec:
    """The declared request or response of an API."""
    (spec,) = [s for s in MESSAGES.values() if s.get("apiKey") == api_key and s["type"] == kind]
    return spec


def _flexible_from(api_key: int) -> int | None:
    """The first flexible version of an API, as its request's declaration says."""
    spec = _declaration(api_key, "request")
    flexible = Versions.parse(spec["flexibleVersions"])
    if flexible.high is not None and flexible.high >= flexible.low:
        raise SpecError(f"{spec['name']}: flexible versions must be N+ or none")
    return flexible.low if flexible.high is None else None


# apiKey -> first flexible version (None: never flexible); looked up on every request.
_FLEXIBLE_FROM: dict[int, int | None] = {key: _flexible_from(key) for key in SUPPORTED}
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

    def check_batches(self, n: int) -> None:
        if n > self.batches:
            raise WireError("more state batches than --max-state-batches-per-entry")


_TOPIC_ID: Converter = (topic_text, topic_raw)
_RESULT_CLASSES: dict[Rpc, type[AnyPartitionResult]] = {
    Rpc.READ: ReadPartitionResult,
    Rpc.READ_SUMMARY: ReadSummaryPartitionResult,
}


def _request_shapes(rpc: Rpc) -> dict[str, Shape]:
    """Each array counts against the budget before its first element is read."""
    batches = {"state_batches": "check_batches"} if rpc is Rpc.WRITE else {}
    shapes = {
        "": Shape(ShareGroupStateRequest),
        "topics": Shape(
            TopicRequest, convert={"topic_id": _TOPIC_ID}, limits={"partitions": "take_entries"}
        ),
        "topics.partitions": Shape(REQUEST_PARTITIONS[rpc], limits=batches),
    }
    if rpc is Rpc.WRITE:
        shapes["topics.partitions.state_batches"] = Shape(StateBatch)
    return shapes


def _response_shapes(rpc: Rpc) -> dict[str, Shape]:
    shapes = {
        "": Shape(ShareGroupStateResponse),
        "results": Shape(TopicResult, convert={"topic_id": _TOPIC_ID}),
        "results.partitions": Shape(_RESULT_CLASSES.get(rpc, PartitionResult)),
    }
    if rpc is Rpc.READ:
        shapes["results.partitions.state_batches"] = Shape(StateBatch)
    return shapes


def _codecs(kind: str, shapes: Callable[[Rpc], dict[str, Shape]]) -> dict[Rpc, MessageCodec]:
    return {
        rpc: MessageCodec(
            _declaration(rpc.api_key, kind)["name"],
            shapes(rpc),
            range(SUPPORTED[rpc.api_key][1] + 1),
        )
        for rpc in Rpc
    }


_REQUESTS = _codecs("request", _request_shapes)
_RESPONSES = _codecs("response", _response_shapes)
_REQUEST_DECODERS = {rpc: codec.decoders for rpc, codec in _REQUESTS.items()}
_RESPONSE_ENCODERS = {rpc: codec.encoders for rpc, codec in _RESPONSES.items()}


def decode_state_request(
    rpc: Rpc, version: int, reader: Reader, budget: Budget
) -> ShareGroupStateRequest[Any]:
    """The body of one of the five RPCs, from the reader's position to its end."""
    request: ShareGroupStateRequest[Any] = _REQUEST_DECODERS[rpc][version](reader, budget)
    reader.expect_end()
    return request


def is_empty_request(request: ShareGroupStateRequest[Any]) -> bool:
    """What Kafka's share coordinator answers with an empty response, doing nothing: an
    empty group id, no topics, or a topic without partitions."""
    if not request.group_id or not request.topics:
        return True
    for topic in request.topics:  # noqa: SIM110 - any() over a generator: 178 against 63 ns
        if not topic.partitions:
            return True
    return False


# --- responses ----------------------------------------------------------------------------

_SIZE = struct.Struct(">i")


def encode_state_response(
    rpc: Rpc, version: int, correlation_id: int, response: ShareGroupStateResponse[Any]
) -> bytes:
    """The whole frame of the answer: size, response header, body."""
    out = bytearray(b"\x00\x00\x00\x00")  # the size, once known
    wire.write_response_header(out, correlation_id, response_header_version(rpc.api_key, version))
    _RESPONSE_ENCODERS[rpc][version](out, response)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


# --- the client's side: requests as a share-partition leader sends them -------------------


def encode_state_request(rpc: Rpc, version: int, request: ShareGroupStateRequest[Any]) -> bytes:
    """The body (no header) of a request, for clients: the tests and the benchmark's
    load generator. Topic ids must be in their 22-character form."""
    return _REQUESTS[rpc].encode(version, request)


def encode_request_frame(
    api_key: int, version: int, correlation_id: int, body: bytes, client_id: str | None = None
) -> bytes:
    """A whole request frame: size, the header its API and version call for, body."""
    header = wire.request_header(
        api_key, version, correlation_id, client_id, request_header_version(api_key, version)
    )
    return wire.frame(header, body)
