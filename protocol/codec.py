"""Bodies of the HTTP API (API.md) to typed messages and back, in msgpack or JSON.

Pure, no I/O: bytes in, ``protocol.messages`` objects out, and the reverse. This module
is the server's side (request bodies in, response bodies out) and the formats both sides
share; ``protocol.client_codec`` is the client's mirror image.

Decoding a request body follows API.md and SPEC §A.1, and raises only ``BodyError``
(HTTP 400, code 42, naming the field), whatever the bytes are:

1. The body must parse (strict JSON in UTF-8, or one msgpack object with no trailing
   bytes) and its top level must be a map.
2. Every field API.md lists is required, except write's ``delivery_complete_count`` and
   read-summary's ``leader_epoch`` (both default -1). Unknown fields are ignored.
3. Integers are exactly ``int`` (never a bool or a float, not even ``1.0``) within the
   width of Kafka's schema: partition and epochs int32, offsets int64,
   ``delivery_count`` int16, ``delivery_state`` int8, ``delivery_complete_count`` int32.
4. Strings are exactly ``str``; ``group_id`` is non-empty; strings that are stored or
   echoed must be encodable as UTF-8 (JSON can carry lone surrogates); ``topic_id`` is
   a Kafka Uuid in either spelling (``protocol.topic_id``).
5. ``Limits``: entries per request (partition entries, counting a topic without any as
   one), state batches per entry.

A well-typed entry that fails an edge check does not raise: it is decoded with
``invalid`` set to the message, and fails alone with 42 (SPEC §A.1 points 1, 3, 13, 16).
The checks run in this order, the first failure wins: partition < 0 (Kafka's text);
epochs, ``start_offset`` and ``delivery_complete_count`` < -1; then batch by batch:
negative offsets, ``first_offset > last_offset``, a delivery state outside
{0, 1, 2, 4}, a negative delivery count.

The request decoders are the daemon's hot path: they are written out per RPC with exact
type checks and local constants, and build error paths only when raising.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from protocol.batches import DELIVERY_STATES, StateBatch
from protocol.errors import MSG_NEGATIVE_PARTITION
from protocol.messages import (
    AdminState,
    DeletePartition,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitializePartition,
    PartitionResult,
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
from protocol.topic_id import canonical_topic_id

__all__ = [
    "DEFAULT_LIMITS",
    "BodyError",
    "Format",
    "Limits",
    "decode_find_coordinator",
    "decode_request",
    "decode_topic_registration",
    "encode_admin_state",
    "encode_error",
    "encode_find_coordinator_response",
    "encode_object",
    "encode_response",
    "format_of",
    "response_format",
]


# --- formats --------------------------------------------------------------------------


class Format(enum.Enum):
    """A body format, valued by its media type (what Content-Type says)."""

    MSGPACK = "application/msgpack"
    JSON = "application/json"


_MEDIA_TYPES = {f.value: f for f in Format}


def format_of(content_type: str | None) -> Format | None:
    """The format a Content-Type names (case and parameters ignored), else None (415)."""
    if content_type is None:
        return None
    return _MEDIA_TYPES.get(content_type.partition(";")[0].strip().lower())


def response_format(content_type: str | None, accept: str | None) -> Format:
    """The format to answer in: the request's, unless Accept names only the other one.

    Accept counts when, among the media types it lists with a non-zero q-value, exactly
    one of ours appears; wildcards and anything else leave the request's format. A
    request with no recognised Content-Type (a GET, or the body of a 415) answers in
    JSON unless Accept asks for msgpack.
    """
    fmt = format_of(content_type) or Format.JSON
    if not accept:
        return fmt
    named: set[Format] = set()
    for item in accept.split(","):
        media_type, _, params = item.partition(";")
        wanted = _MEDIA_TYPES.get(media_type.strip().lower())
        if wanted is not None and _q_value(params) > 0:
            named.add(wanted)
    return named.pop() if len(named) == 1 else fmt


def _q_value(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value.strip())
            except ValueError:
                return 1.0
    return 1.0


# --- errors and limits ----------------------------------------------------------------


class BodyError(ValueError):
    """A body that cannot be used: HTTP 400 with ``{"error_code": 42, ...}``.

    ``field`` is the path of the offending field (``topics[0].partitions[2].state_epoch``),
    ``""`` for the whole body; ``problem`` says what was wrong and what was expected.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)

    def __reduce__(self) -> tuple[type[BodyError], tuple[str, str]]:
        return (BodyError, (self.field, self.problem))

    def under(self, prefix: str) -> BodyError:
        """The same error with its field path placed below ``prefix``."""
        if not self.field:
            return BodyError(prefix, self.problem)
        sep = "" if self.field.startswith("[") else "."
        return BodyError(f"{prefix}{sep}{self.field}", self.problem)


@dataclass(frozen=True)
class Limits:
    """Request size limits beyond the byte limit (API.md "Security")."""

    max_entries_per_request: int = 5000
    max_state_batches_per_entry: int = 10000


DEFAULT_LIMITS = Limits()


class _Width(NamedTuple):
    expected: str
    lo: int
    hi: int


_INT8 = _Width("an integer in int8 range", -(2**7), 2**7 - 1)
_INT16 = _Width("an integer in int16 range", -(2**15), 2**15 - 1)
_INT32 = _Width("an integer in int32 range", -(2**31), 2**31 - 1)
_INT64 = _Width("an integer in int64 range", -(2**63), 2**63 - 1)
# A daemon sees few distinct topics; spelling them canonically costs ~1 µs each time.
_canonical_topic_id = functools.lru_cache(maxsize=4096)(canonical_topic_id)
_TOPIC_ID = "a Kafka topic id (22 base64url characters or a 36-character RFC 4122 UUID)"


def _describe(value: object) -> str:
    """A short, safe description of a received value for an error message."""
    if value is None:
        return "null"
    if value is True or value is False:
        return f"a boolean ({str(value).lower()})"
    if type(value) is int:
        bits = value.bit_length()
        return str(value) if bits <= 128 else f"an integer of {bits} bits"
    if type(value) is float:
        return f"a float ({value!r})"
    if type(value) is str:
        # repr escapes lone surrogates, so the message always encodes.
        return f"a string ({value!r})" if len(value) <= 40 else f"a string ({value[:40]!r}...)"
    if type(value) is bytes:
        return "binary data (msgpack bin)"
    if type(value) is list:
        return "a list"
    if type(value) is dict:
        return "a map"
    return f"a msgpack {type(value).__name__}"


def _field_error(container: dict[Any, Any], key: str, expected: str, where: str) -> BodyError:
    """The error of ``container[key]``, missing or not what was ``expected``."""
    field = f"{where}.{key}" if where else key
    if key not in container:
        return BodyError(field, f"missing required field, expected {expected}")
    return BodyError(field, f"expected {expected}, got {_describe(container[key])}")


def _not_a(expected: str, value: object, field: str) -> BodyError:
    return BodyError(field, f"expected {expected}, got {_describe(value)}")


def _check_utf8(text: str, field: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BodyError(
                field, "expected valid Unicode text, got a string with a lone surrogate"
            ) from None


# --- parsing --------------------------------------------------------------------------


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _load_map(body: bytes, fmt: Format) -> dict[Any, Any]:
    try:
        if fmt is Format.MSGPACK:
            root = msgpack.unpackb(body, raw=False, strict_map_key=True)
        else:
            root = _JSON_DECODER.decode(body.decode("utf-8"))
    # Whatever the parser raises (ExtraData, FormatError, StackError, UnicodeDecodeError,
    # RecursionError, ValueError for an over-long int literal, ...), the body did not
    # parse; msgpack does not document the full list, so none may escape.
    except Exception as exc:
        text = str(exc)[:200].encode("utf-8", "backslashreplace").decode("utf-8")
        name = "msgpack" if fmt is Format.MSGPACK else "JSON"
        raise BodyError("", f"the body is not valid {name}: {text or type(exc).__name__}") from None
    if type(root) is not dict:
        raise BodyError("", f"expected the body to be a map, got {_describe(root)}")
    return root


def _dump(obj: object, fmt: Format) -> bytes:
    if fmt is Format.MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    # ensure_ascii (the default) keeps any text, even a lone surrogate, encodable.
    return _JSON_ENCODER.encode(obj).encode("ascii")


# --- request decoding (server side, hot path) -----------------------------------------


def decode_request(
    rpc: Rpc, body: bytes, fmt: Format, limits: Limits = DEFAULT_LIMITS
) -> ShareGroupStateRequest[Any]:
    """Decode the body of one of the five share-group state RPCs. Raises ``BodyError``."""
    root = _load_map(body, fmt)
    group_id = root.get("group_id")
    if type(group_id) is not str or not group_id:
        raise _field_error(root, "group_id", "a non-empty string", "")
    _check_utf8(group_id, "group_id")
    raw_topics = root.get("topics")
    if type(raw_topics) is not list:
        raise _field_error(root, "topics", "a list", "")

    # First the topic level, so that an oversized request fails before any work.
    headers: list[tuple[str, str, list[Any]]] = []
    entries = 0
    for ti, raw_topic in enumerate(raw_topics):
        header = _topic_header(raw_topic, ti)
        # A topic with no partitions still costs a result: it counts as one entry, so
        # a body of empty topics cannot dodge the limit.
        entries += len(header[2]) or 1
        headers.append(header)
    max_entries = limits.max_entries_per_request
    if entries > max_entries:
        raise BodyError(
            "topics",
            f"{entries} entries (partition entries, and 1 per topic without any), "
            f"more than the limit of {max_entries}",
        )

    decode_partitions = _PARTITION_DECODERS[rpc]
    max_batches = limits.max_state_batches_per_entry
    topics: list[TopicRequest[Any]] = []
    for ti, (topic_id, key_topic_id, raw_partitions) in enumerate(headers):
        try:
            partitions = decode_partitions(raw_partitions, max_batches)
        except BodyError as exc:
            raise exc.under(f"topics[{ti}].partitions") from None
        topics.append(TopicRequest(topic_id, key_topic_id, partitions))
    return ShareGroupStateRequest(rpc, group_id, topics)


def _topic_header(raw_topic: object, ti: int) -> tuple[str, str, list[Any]]:
    """``(topic_id as spelled, canonical topic id, raw partitions)`` of one topic."""
    if type(raw_topic) is not dict:
        raise _not_a("a map", raw_topic, f"topics[{ti}]")
    topic_id = raw_topic.get("topic_id")
    if type(topic_id) is not str:
        raise _field_error(raw_topic, "topic_id", _TOPIC_ID, f"topics[{ti}]")
    try:
        key_topic_id = _canonical_topic_id(topic_id)
    except ValueError:
        raise _not_a(_TOPIC_ID, topic_id, f"topics[{ti}].topic_id") from None
    raw_partitions = raw_topic.get("partitions")
    if type(raw_partitions) is not list:
        raise _field_error(raw_topic, "partitions", "a list", f"topics[{ti}]")
    return topic_id, key_topic_id, raw_partitions


# The per-RPC decoders below raise BodyError with paths relative to the partitions list
# ("[2].state_epoch"); decode_request places them under "topics[i].partitions".


def _initialize_partitions(raw: list[Any], max_batches: int) -> list[InitializePartition]:
    i32_lo, i32_hi, i64_lo, i64_hi = _INT32.lo, _INT32.hi, _INT64.lo, _INT64.hi
    out: list[InitializePartition] = []
    for pi, e in enumerate(raw):
        if type(e) is not dict:
            raise _not_a("a map", e, f"[{pi}]")
        partition = e.get("partition")
        if type(partition) is not int or not i32_lo <= partition <= i32_hi:
            raise _field_error(e, "partition", _INT32.expected, f"[{pi}]")
        state_epoch = e.get("state_epoch")
        if type(state_epoch) is not int or not i32_lo <= state_epoch <= i32_hi:
            raise _field_error(e, "state_epoch", _INT32.expected, f"[{pi}]")
        start_offset = e.get("start_offset")
        if type(start_offset) is not int or not i64_lo <= start_offset <= i64_hi:
            raise _field_error(e, "start_offset", _INT64.expected, f"[{pi}]")
        invalid = None
        if partition < 0 or state_epoch < -1 or start_offset < -1:
            invalid = _entry_problem(
                partition, ("state_epoch", state_epoch), ("start_offset", start_offset)
            )
        out.append(InitializePartition(partition, state_epoch, start_offset, invalid))
    return out


def _read_partitions(raw: list[Any], max_batches: int) -> list[ReadPartition]:
    i32_lo, i32_hi = _INT32.lo, _INT32.hi
    out: list[ReadPartition] = []
    for pi, e in enumerate(raw):
        if type(e) is not dict:
            raise _not_a("a map", e, f"[{pi}]")
        partition = e.get("partition")
        if type(partition) is not int or not i32_lo <= partition <= i32_hi:
            raise _field_error(e, "partition", _INT32.expected, f"[{pi}]")
        leader_epoch = e.get("leader_epoch")
        if type(leader_epoch) is not int or not i32_lo <= leader_epoch <= i32_hi:
            raise _field_error(e, "leader_epoch", _INT32.expected, f"[{pi}]")
        invalid = None
        if partition < 0 or leader_epoch < -1:
            invalid = _entry_problem(partition, ("leader_epoch", leader_epoch))
        out.append(ReadPartition(partition, leader_epoch, invalid))
    return out


def _write_partitions(raw: list[Any], max_batches: int) -> list[WritePartition]:
    i8_lo, i8_hi, i16_lo, i16_hi = _INT8.lo, _INT8.hi, _INT16.lo, _INT16.hi
    i32_lo, i32_hi, i64_lo, i64_hi = _INT32.lo, _INT32.hi, _INT64.lo, _INT64.hi
    states = DELIVERY_STATES
    batch = StateBatch
    out: list[WritePartition] = []
    for pi, e in enumerate(raw):
        if type(e) is not dict:
            raise _not_a("a map", e, f"[{pi}]")
        partition = e.get("partition")
        if type(partition) is not int or not i32_lo <= partition <= i32_hi:
            raise _field_error(e, "partition", _INT32.expected, f"[{pi}]")
        state_epoch = e.get("state_epoch")
        if type(state_epoch) is not int or not i32_lo <= state_epoch <= i32_hi:
            raise _field_error(e, "state_epoch", _INT32.expected, f"[{pi}]")
        leader_epoch = e.get("leader_epoch")
        if type(leader_epoch) is not int or not i32_lo <= leader_epoch <= i32_hi:
            raise _field_error(e, "leader_epoch", _INT32.expected, f"[{pi}]")
        start_offset = e.get("start_offset")
        if type(start_offset) is not int or not i64_lo <= start_offset <= i64_hi:
            raise _field_error(e, "start_offset", _INT64.expected, f"[{pi}]")
        complete = e.get("delivery_complete_count", -1)
        if type(complete) is not int or not i32_lo <= complete <= i32_hi:
            raise _field_error(e, "delivery_complete_count", _INT32.expected, f"[{pi}]")
        raw_batches = e.get("state_batches")
        if type(raw_batches) is not list:
            raise _field_error(e, "state_batches", "a list", f"[{pi}]")
        if len(raw_batches) > max_batches:
            raise BodyError(
                f"[{pi}].state_batches",
                f"{len(raw_batches)} state batches, more than the limit of {max_batches}",
            )
        batches: list[StateBatch] = []
        first_bad = -1
        for bi, b in enumerate(raw_batches):
            if type(b) is not dict:
                raise _not_a("a map", b, f"[{pi}].state_batches[{bi}]")
            first = b.get("first_offset")
            if type(first) is not int or not i64_lo <= first <= i64_hi:
                raise _field_error(b, "first_offset", _INT64.expected, _batch(pi, bi))
            last = b.get("last_offset")
            if type(last) is not int or not i64_lo <= last <= i64_hi:
                raise _field_error(b, "last_offset", _INT64.expected, _batch(pi, bi))
            state = b.get("delivery_state")
            if type(state) is not int or not i8_lo <= state <= i8_hi:
                raise _field_error(b, "delivery_state", _INT8.expected, _batch(pi, bi))
            count = b.get("delivery_count")
            if type(count) is not int or not i16_lo <= count <= i16_hi:
                raise _field_error(b, "delivery_count", _INT16.expected, _batch(pi, bi))
            # 0 <= first <= last implies last >= 0.
            if first_bad < 0 and (first < 0 or first > last or count < 0 or state not in states):
                first_bad = bi
            batches.append(batch(first, last, state, count))
        invalid = None
        if partition < 0 or state_epoch < -1 or leader_epoch < -1 or start_offset < -1:
            invalid = _entry_problem(
                partition,
                ("state_epoch", state_epoch),
                ("leader_epoch", leader_epoch),
                ("start_offset", start_offset),
            )
        elif complete < -1:
            invalid = f"delivery_complete_count must be -1 or greater, got {complete}"
        elif first_bad >= 0:
            invalid = _batch_problem(batches[first_bad], first_bad)
        out.append(
            WritePartition(
                partition, state_epoch, leader_epoch, start_offset, batches, complete, invalid
            )
        )
    return out


def _delete_partitions(raw: list[Any], max_batches: int) -> list[DeletePartition]:
    i32_lo, i32_hi = _INT32.lo, _INT32.hi
    out: list[DeletePartition] = []
    for pi, e in enumerate(raw):
        if type(e) is not dict:
            raise _not_a("a map", e, f"[{pi}]")
        partition = e.get("partition")
        if type(partition) is not int or not i32_lo <= partition <= i32_hi:
            raise _field_error(e, "partition", _INT32.expected, f"[{pi}]")
        out.append(DeletePartition(partition, MSG_NEGATIVE_PARTITION if partition < 0 else None))
    return out


def _read_summary_partitions(raw: list[Any], max_batches: int) -> list[ReadSummaryPartition]:
    i32_lo, i32_hi = _INT32.lo, _INT32.hi
    out: list[ReadSummaryPartition] = []
    for pi, e in enumerate(raw):
        if type(e) is not dict:
            raise _not_a("a map", e, f"[{pi}]")
        partition = e.get("partition")
        if type(partition) is not int or not i32_lo <= partition <= i32_hi:
            raise _field_error(e, "partition", _INT32.expected, f"[{pi}]")
        # Ignored by the RPC, but still checked like every epoch (SPEC §A.1 point 16).
        leader_epoch = e.get("leader_epoch", -1)
        if type(leader_epoch) is not int or not i32_lo <= leader_epoch <= i32_hi:
            raise _field_error(e, "leader_epoch", _INT32.expected, f"[{pi}]")
        invalid = None
        if partition < 0 or leader_epoch < -1:
            invalid = _entry_problem(partition, ("leader_epoch", leader_epoch))
        out.append(ReadSummaryPartition(partition, leader_epoch, invalid))
    return out


_PARTITION_DECODERS: dict[Rpc, Callable[[list[Any], int], list[Any]]] = {
    Rpc.INITIALIZE: _initialize_partitions,
    Rpc.READ: _read_partitions,
    Rpc.WRITE: _write_partitions,
    Rpc.DELETE: _delete_partitions,
    Rpc.READ_SUMMARY: _read_summary_partitions,
}


def _batch(pi: int, bi: int) -> str:
    return f"[{pi}].state_batches[{bi}]"


def _entry_problem(partition: int, *at_least_minus_one: tuple[str, int]) -> str | None:
    """The first failed edge check among the partition and the -1-or-greater fields."""
    if partition < 0:
        return MSG_NEGATIVE_PARTITION
    for name, value in at_least_minus_one:
        if value < -1:
            return f"{name} must be -1 or greater, got {value}"
    return None


def _batch_problem(b: StateBatch, bi: int) -> str:
    first, last, state, count = b
    if first < 0:
        return f"state_batches[{bi}]: first_offset must be 0 or greater, got {first}"
    if last < 0:
        return f"state_batches[{bi}]: last_offset must be 0 or greater, got {last}"
    if first > last:
        return f"state_batches[{bi}]: first_offset {first} is greater than last_offset {last}"
    if state not in DELIVERY_STATES:
        return f"state_batches[{bi}]: delivery_state must be one of 0, 1, 2, 4, got {state}"
    return f"state_batches[{bi}]: delivery_count must be 0 or greater, got {count}"


# --- other server-side decoders -------------------------------------------------------


def decode_find_coordinator(
    body: bytes, fmt: Format, limits: Limits = DEFAULT_LIMITS
) -> FindCoordinatorRequest:
    """``{"keys": [str, ...]}``. The keys are not parsed here: a bad one fails alone."""
    root = _load_map(body, fmt)
    keys = root.get("keys")
    if type(keys) is not list:
        raise _field_error(root, "keys", "a list of strings", "")
    if len(keys) > limits.max_entries_per_request:
        raise BodyError(
            "keys", f"{len(keys)} keys, more than the limit of {limits.max_entries_per_request}"
        )
    for i, key in enumerate(keys):
        if type(key) is not str:
            raise _not_a("a string", key, f"keys[{i}]")
        _check_utf8(key, f"keys[{i}]")  # echoed in the response
    return FindCoordinatorRequest(keys)


def decode_topic_registration(body: bytes, fmt: Format) -> tuple[str, str, int]:
    """``PUT /v1/admin/topics``: ``(topic_id as spelled, canonical id, partition_count)``."""
    root = _load_map(body, fmt)
    topic_id = root.get("topic_id")
    if type(topic_id) is not str:
        raise _field_error(root, "topic_id", _TOPIC_ID, "")
    try:
        key_topic_id = _canonical_topic_id(topic_id)
    except ValueError:
        raise _not_a(_TOPIC_ID, topic_id, "topic_id") from None
    count = root.get("partition_count")
    if type(count) is not int or not 1 <= count <= _INT32.hi:
        raise _field_error(root, "partition_count", "an integer from 1 to 2147483647", "")
    return topic_id, key_topic_id, count


# --- response encoding (server side) --------------------------------------------------


def _batch_maps(batches: list[StateBatch]) -> list[dict[str, int]]:
    return [
        {"first_offset": f, "last_offset": last, "delivery_state": s, "delivery_count": c}
        for f, last, s, c in batches
    ]


def _base_result_map(r: PartitionResult) -> dict[str, Any]:
    return {"partition": r.partition, "error_code": r.error_code, "error_message": r.error_message}


def _read_result_map(r: ReadPartitionResult) -> dict[str, Any]:
    return {
        "partition": r.partition,
        "error_code": r.error_code,
        "error_message": r.error_message,
        "state_epoch": r.state_epoch,
        "start_offset": r.start_offset,
        "state_batches": _batch_maps(r.state_batches),
    }


def _read_summary_result_map(r: ReadSummaryPartitionResult) -> dict[str, Any]:
    return {
        "partition": r.partition,
        "error_code": r.error_code,
        "error_message": r.error_message,
        "state_epoch": r.state_epoch,
        "leader_epoch": r.leader_epoch,
        "start_offset": r.start_offset,
        "delivery_complete_count": r.delivery_complete_count,
    }


_RESULT_MAPS: dict[Rpc, Callable[[Any], dict[str, Any]]] = {
    Rpc.INITIALIZE: _base_result_map,
    Rpc.READ: _read_result_map,
    Rpc.WRITE: _base_result_map,
    Rpc.DELETE: _base_result_map,
    Rpc.READ_SUMMARY: _read_summary_result_map,
}


def encode_response(resp: ShareGroupStateResponse[Any], fmt: Format) -> bytes:
    """``{"results": [{"topic_id", "partitions": [...]}]}`` with the fields of ``resp.rpc``."""
    result_map = _RESULT_MAPS[resp.rpc]
    results = [
        {"topic_id": t.topic_id, "partitions": [result_map(r) for r in t.partitions]}
        for t in resp.results
    ]
    return _dump({"results": results}, fmt)


def encode_find_coordinator_response(resp: FindCoordinatorResponse, fmt: Format) -> bytes:
    coordinators = [
        {
            "key": c.key,
            "state_partition": c.state_partition,
            "node_id": c.node_id,
            "host": c.host,
            "port": c.port,
            "error_code": c.error_code,
            "error_message": c.error_message,
        }
        for c in resp.coordinators
    ]
    return _dump({"coordinators": coordinators}, fmt)


def encode_admin_state(state: AdminState, fmt: Format) -> bytes:
    """The admin state of one key (SPEC §A.1 point 10)."""
    return _dump(
        {
            "group_id": state.group_id,
            "topic_id": state.topic_id,
            "partition": state.partition,
            "snapshot_epoch": state.snapshot_epoch,
            "state_epoch": state.state_epoch,
            "leader_epoch": state.leader_epoch,
            "start_offset": state.start_offset,
            "delivery_complete_count": state.delivery_complete_count,
            "state_batches": _batch_maps(state.state_batches),
            "fencing": {
                "state_epoch": state.fencing.state_epoch,
                "leader_epoch": state.fencing.leader_epoch,
            },
        },
        fmt,
    )


def encode_error(code: int, message: str, fmt: Format) -> bytes:
    """The body of every non-200 answer."""
    return _dump({"error_code": code, "error_message": message}, fmt)


def encode_object(obj: dict[str, Any], fmt: Format) -> bytes:
    """A small admin body (``{"error_code": 0}``, partition listings, ...)."""
    return _dump(obj, fmt)
