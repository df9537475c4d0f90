"""Bodies of the HTTP API (docs/api.md) to typed messages and back, in msgpack or JSON.

Pure, no I/O: bytes in, ``protocol.messages`` Structs out, and the reverse. This module
is the server's side (request bodies in, answers out) and what both sides share;
``protocol.client_codec`` is the client's mirror image.

Decoding is msgspec's, straight into the Structs of ``protocol.messages``: it parses
and checks every type and width in one pass. A body it refuses is parsed again by
``protocol.reparse`` (which says why one that does not parse does not, and keeps what
was wrong with a string: bytes that are not UTF-8, a raw control character) and
explained by ``protocol.explain`` (the field, what was expected, what came), so a
decoder raises only ``BodyError`` (HTTP 400, code 42), whatever the bytes are. Then one
pass over the decoded request (``prepare_request``) does what a schema cannot say:

1. ``Limits``: the group id's length in UTF-8 bytes, entries per request (partition
   entries, counting a topic without any as one) and state batches per entry; over a
   limit, the whole body is refused.
2. Each topic id is a Kafka Uuid in either spelling; its canonical 22-character form
   goes on the topic as ``key_topic_id``.
3. The edge checks of docs/semantics.md §A: a well-typed entry that fails one is not refused with
   the body; its ``invalid`` names the problem, and it fails alone with 42 (docs/semantics.md §A.1
   points 1, 3, 13, 16). In order, the first failure wins: partition < 0 (Kafka's
   text); epochs, ``start_offset`` and ``delivery_complete_count`` < -1; then batch by
   batch: negative offsets, ``first_offset > last_offset``, a delivery state outside
   {0, 1, 2, 4}, a negative delivery count.
4. A write whose batches are already sorted and disjoint, with no touching neighbours
   of the same state and count, is marked ``batches_combined``: combining them with
   nothing would return them as they are (docs/semantics.md §7), so the shard skips it.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from protocol.batches import DELIVERY_STATES, is_clean
from protocol.errors import MSG_NEGATIVE_PARTITION
from protocol.explain import BodyError, describe, first_problem, msgspec_problem
from protocol.messages import (
    AdminState,
    DeletePartition,
    ErrorBody,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitializePartition,
    ReadPartition,
    ReadSummaryPartition,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicRegistration,
    WriteFields,
    WritePartition,
)
from protocol.reparse import reparse_json, reparse_msgpack
from protocol.state_batch import BatchFields, StateBatch
from protocol.topic_id import canonical_topic_id
from protocol.widths import DEFAULT_MAX_GROUP_ID_BYTES, TOPIC_ID_EXPECTED

__all__ = [
    "DEFAULT_LIMITS",
    "BodyError",
    "Format",
    "Limits",
    "check_coordinator_keys",
    "check_group_id",
    "decode_body",
    "decode_find_coordinator",
    "decode_request",
    "decode_topic_registration",
    "encode",
    "encode_admin_state",
    "encode_error",
    "encode_find_coordinator_response",
    "encode_object",
    "encode_response",
    "format_of",
    "prepare_request",
    "response_format",
]

T = TypeVar("T")


# --- formats --------------------------------------------------------------------------


class Format(enum.Enum):
    """A body format, valued by its media type (what Content-Type says)."""

    # Looked up in dicts on every request: the identity hash (members are singletons and
    # compare by identity) instead of Enum's, a Python function hashing the name.
    __hash__ = object.__hash__

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


# --- limits ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Request size limits beyond the byte limit (docs/api.md "Limits")."""

    max_entries_per_request: int = 5000
    max_state_batches_per_entry: int = 10000
    max_group_id_bytes: int = DEFAULT_MAX_GROUP_ID_BYTES


def check_group_id(group_id: str, limits: Limits) -> None:
    """Refuse a group id longer than ``max_group_id_bytes`` in UTF-8 (``BodyError``).

    Every record of the log repeats its key's group id, and the daemon holds it for
    every share-partition it knows: this limit is what bounds a request's records by
    the size of its body (docs/api.md "Limits")."""
    size = _bytes_over(group_id, limits.max_group_id_bytes)
    if size is not None:
        raise BodyError("group_id", _over_group_id_limit(size, limits))


def _bytes_over(text: str, limit: int) -> int | None:
    """The UTF-8 size of ``text`` if it is over ``limit``, else None."""
    # A character is 1 to 4 bytes in UTF-8: most texts are decided without encoding.
    if len(text) * 4 <= limit:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > limit else None


def _over_group_id_limit(size: int, limits: Limits) -> str:
    return f"{size} bytes, over the limit of {limits.max_group_id_bytes} (max_group_id_bytes)"


DEFAULT_LIMITS = Limits()

# A daemon sees few distinct topics; spelling them canonically costs ~1 µs each time.
_canonical_topic_id = functools.lru_cache(maxsize=4096)(canonical_topic_id)


# --- decoding -------------------------------------------------------------------------


_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


_DECODERS: dict[tuple[Any, Format], Callable[[bytes], Any]] = {}


def _decoder(declared: Any, fmt: Format) -> Callable[[bytes], Any]:
    decode = _DECODERS.get((declared, fmt))
    if decode is None:
        if fmt is Format.MSGPACK:
            decode = msgspec.msgpack.Decoder(declared).decode
        else:
            decode = msgspec.json.Decoder(declared).decode
        _DECODERS[declared, fmt] = decode
    return decode


def decode_body(declared: type[T], body: bytes, fmt: Format) -> T:
    """``body`` decoded into ``declared``; raises only ``BodyError``, whatever the bytes."""
    return decode_with(_decoder(declared, fmt), declared, body, fmt)


def decoders_by_format(declared: Any) -> dict[Format, Callable[[bytes], Any]]:
    """``declared``'s decoder for each format, for a caller that looks it up per body:
    the cache above hashes the type, and a generic alias such as
    ShareGroupStateRequest[WritePartition] hashes in typing's Python (~120 ns)."""
    return {fmt: _decoder(declared, fmt) for fmt in Format}


def decode_with(decode: Callable[[bytes], Any], declared: type[T], body: bytes, fmt: Format) -> T:
    """``decode_body`` with ``declared``'s decoder for ``fmt`` at hand."""
    try:
        decoded: T = decode(body)
        return decoded
    # msgspec raises its DecodeError (a ValueError) for what is malformed or ill-typed,
    # UnicodeDecodeError (a ValueError too, not one of msgspec's) for a string that is
    # not UTF-8, and RecursionError for nesting too deep, even in a field nobody reads.
    # Each is explained below, on the error path, in the API's words.
    except (ValueError, RecursionError) as exc:
        # Kept without its traceback, which holds this frame: a frame holding the
        # exception that holds it is a cycle, and it would keep the body and the parse
        # below alive until the collector's next young collection.
        refused = exc.with_traceback(None)
    parsed = reparse_msgpack(body, refused) if fmt is Format.MSGPACK else reparse_json(body)
    problem = first_problem(parsed.value, declared, marked=parsed.marked) or parsed.not_json
    if problem is not None:
        try:
            raise problem
        finally:
            # Not left in this frame, which the problem's traceback holds: the cycle
            # would keep the body and its parse alive until a collection.
            del problem, parsed
    # The standard parser took what msgspec's did not, and nothing the schema names is
    # wrong (say, a lone surrogate in a field nobody reads): build it from the parse.
    try:
        return msgspec.convert(parsed.value, declared)
    except (ValueError, RecursionError):
        raise msgspec_problem(refused) from None


_REQUEST_TYPES: dict[Rpc, Any] = {
    Rpc.INITIALIZE: ShareGroupStateRequest[InitializePartition],
    Rpc.READ: ShareGroupStateRequest[ReadPartition],
    Rpc.WRITE: ShareGroupStateRequest[WritePartition],
    Rpc.DELETE: ShareGroupStateRequest[DeletePartition],
    Rpc.READ_SUMMARY: ShareGroupStateRequest[ReadSummaryPartition],
}


_REQUEST_DECODERS = {rpc: decoders_by_format(declared) for rpc, declared in _REQUEST_TYPES.items()}


def decode_request(
    rpc: Rpc, body: bytes, fmt: Format, limits: Limits = DEFAULT_LIMITS
) -> ShareGroupStateRequest[Any]:
    """Decode the body of one of the five share-group state RPCs. Raises ``BodyError``."""
    request: ShareGroupStateRequest[Any] = decode_with(
        _REQUEST_DECODERS[rpc][fmt], _REQUEST_TYPES[rpc], body, fmt
    )
    prepare_request(rpc, request, limits)
    return request


def prepare_request(
    rpc: Rpc, request: ShareGroupStateRequest[Any], limits: Limits = DEFAULT_LIMITS
) -> None:
    """The pass over a decoded request that a schema cannot express (module docstring,
    points 1-4). Raises ``BodyError`` for what refuses the whole body."""
    check_group_id(request.group_id, limits)
    topics = request.topics
    entries = 0
    for ti, topic in enumerate(topics):
        try:
            topic.key_topic_id = _canonical_topic_id(topic.topic_id)
        except ValueError:
            raise BodyError(
                f"topics[{ti}].topic_id",
                f"expected {TOPIC_ID_EXPECTED}, got {describe(topic.topic_id)}",
            ) from None
        # A topic with no partitions still costs a result: it counts as one entry, so
        # a body of empty topics cannot dodge the limit.
        entries += len(topic.partitions) or 1
    if entries > limits.max_entries_per_request:
        raise BodyError(
            "topics",
            f"{entries} entries (partition entries, and 1 per topic without any), "
            f"more than the limit of {limits.max_entries_per_request}",
        )
    check = _EDGE_CHECKS[rpc]
    for ti, topic in enumerate(topics):
        check(topic.partitions, limits.max_state_batches_per_entry, ti)


def _check_initialize(entries: list[InitializePartition], max_batches: int, ti: int) -> None:
    for e in entries:
        if e.partition < 0 or e.state_epoch < -1 or e.start_offset < -1:
            e.invalid = _entry_problem(
                e.partition, ("state_epoch", e.state_epoch), ("start_offset", e.start_offset)
            )


def _check_read(entries: list[ReadPartition], max_batches: int, ti: int) -> None:
    for e in entries:
        if e.partition < 0 or e.leader_epoch < -1:
            e.invalid = _entry_problem(e.partition, ("leader_epoch", e.leader_epoch))


def _check_delete(entries: list[DeletePartition], max_batches: int, ti: int) -> None:
    for e in entries:
        if e.partition < 0:
            e.invalid = MSG_NEGATIVE_PARTITION


def _check_read_summary(entries: list[ReadSummaryPartition], max_batches: int, ti: int) -> None:
    # leader_epoch is ignored by the RPC, but checked like every epoch
    # (docs/semantics.md §A.1 point 16).
    _check_read(entries, max_batches, ti)  # type: ignore[arg-type]


def _check_write(entries: list[WritePartition], max_batches: int, ti: int) -> None:
    states = DELIVERY_STATES
    for pi, e in enumerate(entries):
        partition, state_epoch, leader_epoch, start_offset, batches, complete = _WRITE_FIELDS(e)
        if len(batches) > max_batches:
            raise BodyError(
                f"topics[{ti}].partitions[{pi}].state_batches",
                f"{len(batches)} state batches, more than the limit of {max_batches}",
            )
        if partition < 0 or state_epoch < -1 or leader_epoch < -1 or start_offset < -1:
            e.invalid = _entry_problem(
                partition,
                ("state_epoch", state_epoch),
                ("leader_epoch", leader_epoch),
                ("start_offset", start_offset),
            )
            continue
        if complete < -1:
            e.invalid = f"delivery_complete_count must be -1 or greater, got {complete}"
            continue
        for bi, b in enumerate(batches):
            first, last, state, count = _BATCH_FIELDS(b)
            # 0 <= first <= last implies last >= 0.
            if first < 0 or first > last or count < 0 or state not in states:
                e.invalid = _batch_problem(b, bi)
                break
        else:
            # One batch is combined as it is; the shard sees that without help.
            if len(batches) > 1 and is_clean(batches):
                e.batches_combined = True


# A write entry's fields and a batch's, each in one C call (msgspec's astuple; the orders
# are checked where the classes are defined): from compiled code, each field read is
# otherwise a generic attribute lookup.
_WRITE_FIELDS: Final[Callable[[WritePartition], WriteFields]] = msgspec.structs.astuple
_BATCH_FIELDS: Final[Callable[[StateBatch], BatchFields]] = msgspec.structs.astuple

_EDGE_CHECKS: dict[Rpc, Callable[[Any, int, int], None]] = {
    Rpc.INITIALIZE: _check_initialize,
    Rpc.READ: _check_read,
    Rpc.WRITE: _check_write,
    Rpc.DELETE: _check_delete,
    Rpc.READ_SUMMARY: _check_read_summary,
}


def _entry_problem(partition: int, *at_least_minus_one: tuple[str, int]) -> str | None:
    """The first failed edge check among the partition and the -1-or-greater fields."""
    if partition < 0:
        return MSG_NEGATIVE_PARTITION
    for name, value in at_least_minus_one:
        if value < -1:
            return f"{name} must be -1 or greater, got {value}"
    return None


def _batch_problem(b: StateBatch, bi: int) -> str:
    first, last = b.first_offset, b.last_offset
    if first < 0:
        return f"state_batches[{bi}]: first_offset must be 0 or greater, got {first}"
    if last < 0:
        return f"state_batches[{bi}]: last_offset must be 0 or greater, got {last}"
    if first > last:
        return f"state_batches[{bi}]: first_offset {first} is greater than last_offset {last}"
    if b.delivery_state not in DELIVERY_STATES:
        return (
            f"state_batches[{bi}]: delivery_state must be one of 0, 1, 2, 4, got {b.delivery_state}"
        )
    return f"state_batches[{bi}]: delivery_count must be 0 or greater, got {b.delivery_count}"


def decode_find_coordinator(
    body: bytes, fmt: Format, limits: Limits = DEFAULT_LIMITS
) -> FindCoordinatorRequest:
    """``{"keys": [str, ...]}``. The keys are not parsed here: a bad one fails alone."""
    request = decode_body(FindCoordinatorRequest, body, fmt)
    check_coordinator_keys(request.keys, limits)
    return request


def check_coordinator_keys(keys: list[str], limits: Limits) -> None:
    """The limits of a find-coordinator request: how many keys, and each key's group id
    part (what precedes its last two ``:``, the whole key without them). Raises
    ``BodyError``."""
    if len(keys) > limits.max_entries_per_request:
        raise BodyError(
            "keys", f"{len(keys)} keys, more than the limit of {limits.max_entries_per_request}"
        )
    limit = limits.max_group_id_bytes
    for i, key in enumerate(keys):
        if len(key) * 4 <= limit:  # its group id part is within the limit, whatever it is
            continue
        # As the key's parsing splits it (protocol.routing): trailing ':' dropped.
        size = _bytes_over(key.rstrip(":").rsplit(":", 2)[0], limit)
        if size is not None:
            raise BodyError(f"keys[{i}]", "its group id: " + _over_group_id_limit(size, limits))


def decode_topic_registration(body: bytes, fmt: Format) -> tuple[str, str, int]:
    """``PUT /v1/admin/topics``: ``(topic_id as spelled, canonical id, partition_count)``."""
    registration = decode_body(TopicRegistration, body, fmt)
    try:
        canonical = _canonical_topic_id(registration.topic_id)
    except ValueError:
        raise BodyError(
            "topic_id", f"expected {TOPIC_ID_EXPECTED}, got {describe(registration.topic_id)}"
        ) from None
    return registration.topic_id, canonical, registration.partition_count


# --- encoding -------------------------------------------------------------------------

_MSGPACK_ENCODER = msgspec.msgpack.Encoder()
_JSON_STRUCT_ENCODER = msgspec.json.Encoder()


def encode(obj: object, fmt: Format) -> bytes:
    """Any body of ``protocol.messages`` (or plain maps and lists of them)."""
    if fmt is Format.MSGPACK:
        return _MSGPACK_ENCODER.encode(obj)
    return _JSON_STRUCT_ENCODER.encode(obj)


def encode_response(resp: ShareGroupStateResponse[Any], fmt: Format) -> bytes:
    """``{"results": [{"topic_id", "partitions": [...]}]}``."""
    return encode(resp, fmt)


def encode_find_coordinator_response(resp: FindCoordinatorResponse, fmt: Format) -> bytes:
    return encode(resp, fmt)


def encode_admin_state(state: AdminState, fmt: Format) -> bytes:
    """The admin state of one key (docs/semantics.md §A.1 point 10)."""
    return encode(state, fmt)


def encode_error(code: int, message: str, fmt: Format) -> bytes:
    """The body of every non-200 answer. Its text may quote anything a client sent, so
    JSON escapes everything outside ASCII (a lone surrogate included) and msgpack
    replaces what UTF-8 cannot carry."""
    if fmt is Format.MSGPACK:
        safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return _MSGPACK_ENCODER.encode(ErrorBody(code, safe))
    return _JSON_ENCODER.encode({"error_code": code, "error_message": message}).encode("ascii")


def encode_object(obj: object, fmt: Format) -> bytes:
    """A small admin body (``{"error_code": 0}``, partition listings, ...)."""
    return encode(obj, fmt)
