"""The client's side of the HTTP API's bodies: requests out, answers in.

The mirror image of ``protocol.codec`` over the same declarations
(``protocol.messages``): an answer body that is malformed raises ``BodyError`` naming
the field, and nothing else.
"""

from __future__ import annotations

from typing import Any

from protocol.codec import BodyError, Format, decode_body, decode_with, decoders_by_format, encode
from protocol.messages import (
    AdminState,
    ErrorBody,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    PartitionResult,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
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


def encode_request(req: ShareGroupStateRequest[Any], fmt: Format) -> bytes:
    """The body of ``req``: topic ids as spelled; what the decode pass set on entries
    (``invalid``, ...) are attributes, not fields, and are never sent."""
    return encode(req, fmt)


def encode_find_coordinator(req: FindCoordinatorRequest, fmt: Format) -> bytes:
    return encode(req, fmt)


_RESPONSE_TYPES: dict[Rpc, Any] = {
    Rpc.INITIALIZE: ShareGroupStateResponse[PartitionResult],
    Rpc.READ: ShareGroupStateResponse[ReadPartitionResult],
    Rpc.WRITE: ShareGroupStateResponse[PartitionResult],
    Rpc.DELETE: ShareGroupStateResponse[PartitionResult],
    Rpc.READ_SUMMARY: ShareGroupStateResponse[ReadSummaryPartitionResult],
}


_RESPONSE_DECODERS = {
    rpc: decoders_by_format(declared) for rpc, declared in _RESPONSE_TYPES.items()
}


def decode_response(rpc: Rpc, body: bytes, fmt: Format) -> ShareGroupStateResponse[Any]:
    response: ShareGroupStateResponse[Any] = decode_with(
        _RESPONSE_DECODERS[rpc][fmt], _RESPONSE_TYPES[rpc], body, fmt
    )
    return response


def decode_find_coordinator_response(body: bytes, fmt: Format) -> FindCoordinatorResponse:
    return decode_body(FindCoordinatorResponse, body, fmt)


def decode_admin_state(body: bytes, fmt: Format) -> AdminState:
    return decode_body(AdminState, body, fmt)


def decode_error(body: bytes, fmt: Format) -> ErrorBody:
    return decode_body(ErrorBody, body, fmt)
