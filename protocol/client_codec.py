"""The client's side of the HTTP API's bodies: requests out, responses in.

The mirror image of ``protocol.codec`` (the server's side), sharing its formats and
``BodyError``: a response body that is malformed raises ``BodyError`` and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.batches import StateBatch
from protocol.codec import (
    _INT8,
    _INT16,
    _INT32,
    _INT64,
    BodyError,
    Format,
    _batch_maps,
    _dump,
    _field_error,
    _load_map,
    _not_a,
    _Width,
)
from protocol.messages import (
    AdminState,
    CoordinatorResult,
    DeletePartition,
    ErrorBody,
    Fencing,
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
    TopicResult,
    WritePartition,
)

__all__ = [
    "BodyError",
    "Format",
    "decode_admin_state",
    "decode_error",
    "decode_find_coordinator_response",
    "decode_response",
    "encode_find_coordinator",
    "encode_request",
]


# --- client side: request encoding ----------------------------------------------------


def _initialize_map(p: InitializePartition) -> dict[str, Any]:
    return {"partition": p.partition, "state_epoch": p.state_epoch, "start_offset": p.start_offset}


def _leader_epoch_map(p: ReadPartition | ReadSummaryPartition) -> dict[str, Any]:
    return {"partition": p.partition, "leader_epoch": p.leader_epoch}


def _write_map(p: WritePartition) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "state_epoch": p.state_epoch,
        "leader_epoch": p.leader_epoch,
        "start_offset": p.start_offset,
        "delivery_complete_count": p.delivery_complete_count,
        "state_batches": _batch_maps(p.state_batches),
    }


def _delete_map(p: DeletePartition) -> dict[str, Any]:
    return {"partition": p.partition}


_PARTITION_MAPS: dict[Rpc, Callable[[Any], dict[str, Any]]] = {
    Rpc.INITIALIZE: _initialize_map,
    Rpc.READ: _leader_epoch_map,
    Rpc.WRITE: _write_map,
    Rpc.DELETE: _delete_map,
    Rpc.READ_SUMMARY: _leader_epoch_map,
}


def encode_request(req: ShareGroupStateRequest[Any], fmt: Format) -> bytes:
    """The body of ``req`` (topic ids as spelled; ``invalid`` is not sent)."""
    partition_map = _PARTITION_MAPS[req.rpc]
    topics = [
        {"topic_id": t.topic_id, "partitions": [partition_map(p) for p in t.partitions]}
        for t in req.topics
    ]
    return _dump({"group_id": req.group_id, "topics": topics}, fmt)


def encode_find_coordinator(req: FindCoordinatorRequest, fmt: Format) -> bytes:
    return _dump({"keys": req.keys}, fmt)


# --- client side: response decoding ---------------------------------------------------
# These trust the server for meaning but still check every type, so that a malformed
# body raises BodyError and nothing else. Clarity over speed here.


def _int(m: dict[Any, Any], key: str, width: _Width, where: str) -> int:
    value = m.get(key)
    if type(value) is not int or not width.lo <= value <= width.hi:
        raise _field_error(m, key, width.expected, where)
    return value


def _str(m: dict[Any, Any], key: str, where: str) -> str:
    value = m.get(key)
    if type(value) is not str:
        raise _field_error(m, key, "a string", where)
    return value


def _message(m: dict[Any, Any], key: str, where: str) -> str | None:
    value = m.get(key, 0)  # a missing key fails the str check below, null does not
    if value is None:
        return None
    if type(value) is not str:
        raise _field_error(m, key, "a string or null", where)
    return value


def _list(m: dict[Any, Any], key: str, where: str) -> list[Any]:
    value = m.get(key)
    if type(value) is not list:
        raise _field_error(m, key, "a list", where)
    return value


def _map(value: object, where: str) -> dict[Any, Any]:
    if type(value) is not dict:
        raise _not_a("a map", value, where)
    return value


def _map_field(m: dict[Any, Any], key: str, where: str) -> dict[Any, Any]:
    value = m.get(key)
    if type(value) is not dict:
        raise _field_error(m, key, "a map", where)
    return value


def _batches(m: dict[Any, Any], where: str) -> list[StateBatch]:
    out = []
    for bi, raw in enumerate(_list(m, "state_batches", where)):
        at = f"{where}.state_batches[{bi}]" if where else f"state_batches[{bi}]"
        b = _map(raw, at)
        out.append(
            StateBatch(
                _int(b, "first_offset", _INT64, at),
                _int(b, "last_offset", _INT64, at),
                _int(b, "delivery_state", _INT8, at),
                _int(b, "delivery_count", _INT16, at),
            )
        )
    return out


def _base_result(m: dict[Any, Any], at: str) -> PartitionResult:
    return PartitionResult(
        _int(m, "partition", _INT32, at),
        _int(m, "error_code", _INT16, at),
        _message(m, "error_message", at),
    )


def _read_result(m: dict[Any, Any], at: str) -> ReadPartitionResult:
    return ReadPartitionResult(
        _int(m, "partition", _INT32, at),
        _int(m, "error_code", _INT16, at),
        _message(m, "error_message", at),
        _int(m, "state_epoch", _INT32, at),
        _int(m, "start_offset", _INT64, at),
        _batches(m, at),
    )


def _read_summary_result(m: dict[Any, Any], at: str) -> ReadSummaryPartitionResult:
    return ReadSummaryPartitionResult(
        _int(m, "partition", _INT32, at),
        _int(m, "error_code", _INT16, at),
        _message(m, "error_message", at),
        _int(m, "state_epoch", _INT32, at),
        _int(m, "leader_epoch", _INT32, at),
        _int(m, "start_offset", _INT64, at),
        _int(m, "delivery_complete_count", _INT32, at),
    )


_RESULT_DECODERS: dict[Rpc, Callable[[dict[Any, Any], str], Any]] = {
    Rpc.INITIALIZE: _base_result,
    Rpc.READ: _read_result,
    Rpc.WRITE: _base_result,
    Rpc.DELETE: _base_result,
    Rpc.READ_SUMMARY: _read_summary_result,
}


def decode_response(rpc: Rpc, body: bytes, fmt: Format) -> ShareGroupStateResponse[Any]:
    root = _load_map(body, fmt)
    decode_result = _RESULT_DECODERS[rpc]
    results: list[TopicResult[Any]] = []
    for ti, raw_topic in enumerate(_list(root, "results", "")):
        where = f"results[{ti}]"
        topic = _map(raw_topic, where)
        topic_id = _str(topic, "topic_id", where)
        partitions = [
            decode_result(_map(raw, f"{where}.partitions[{pi}]"), f"{where}.partitions[{pi}]")
            for pi, raw in enumerate(_list(topic, "partitions", where))
        ]
        results.append(TopicResult(topic_id, partitions))
    return ShareGroupStateResponse(rpc, results)


def decode_find_coordinator_response(body: bytes, fmt: Format) -> FindCoordinatorResponse:
    root = _load_map(body, fmt)
    coordinators = []
    for i, raw in enumerate(_list(root, "coordinators", "")):
        at = f"coordinators[{i}]"
        c = _map(raw, at)
        coordinators.append(
            CoordinatorResult(
                _str(c, "key", at),
                _int(c, "state_partition", _INT32, at),
                _int(c, "node_id", _INT32, at),
                _str(c, "host", at),
                _int(c, "port", _INT32, at),
                _int(c, "error_code", _INT16, at),
                _message(c, "error_message", at),
            )
        )
    return FindCoordinatorResponse(coordinators)


def decode_admin_state(body: bytes, fmt: Format) -> AdminState:
    root = _load_map(body, fmt)
    fencing = _map_field(root, "fencing", "")
    # Fencing.state_epoch is nullable: the key may have no state-epoch maximum.
    fence_state_epoch = (
        None
        if fencing.get("state_epoch", 0) is None
        else _int(fencing, "state_epoch", _INT32, "fencing")
    )
    return AdminState(
        _str(root, "group_id", ""),
        _str(root, "topic_id", ""),
        _int(root, "partition", _INT32, ""),
        _int(root, "snapshot_epoch", _INT32, ""),
        _int(root, "state_epoch", _INT32, ""),
        _int(root, "leader_epoch", _INT32, ""),
        _int(root, "start_offset", _INT64, ""),
        _int(root, "delivery_complete_count", _INT32, ""),
        _batches(root, ""),
        Fencing(fence_state_epoch, _int(fencing, "leader_epoch", _INT32, "fencing")),
    )


def decode_error(body: bytes, fmt: Format) -> ErrorBody:
    root = _load_map(body, fmt)
    return ErrorBody(_int(root, "error_code", _INT16, ""), _str(root, "error_message", ""))
