"""The Kafka protocol's connection-level messages the Kafka listener answers besides the
share-group state RPCs: ApiVersions, FindCoordinator, SaslHandshake, SaslAuthenticate.
Pure, no I/O. Their layouts are declared in ``protocol/kafka_specs`` and compiled by
``protocol.kafka_codec`` (a message decodes into a dict of its snake_case fields, and
encodes from one); what changes between versions, in short:

* ApiVersions (18): v0 has no body and answers ErrorCode and ApiKeys; v1 adds
  ThrottleTimeMs; v3 (flexible) sends the client's software name and version and may
  answer tagged feature fields, left at their defaults here, so absent. The response
  header is always v0.
* FindCoordinator (10): v0-v3 look up one Key (KeyType from v1) and answer one
  coordinator at the top level; v4 on look up CoordinatorKeys and answer Coordinators;
  v3 on are flexible. Key types: 0 group, 1 transaction, 2 share (v6+; key
  ``group:topicId:partition``).
* SaslHandshake (17): version 1 only (v0's raw token exchange is not offered).
* SaslAuthenticate (36): v1 adds SessionLifetimeMs to the response; v2 is flexible.

A version of ApiVersions newer than ours is answered with a v0 body: error 35
UNSUPPORTED_VERSION and ApiVersions' own range, so that the client can retry with a
version we have. A v3+ request whose software name or version does not match Kafka's
pattern ``[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?`` is answered with error 42.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol.kafka_codec import MessageCodec
from protocol.kafka_messages import API_VERSIONS, SUPPORTED
from protocol.kafka_schema import Shape
from protocol.kafka_wire import Reader

UNSUPPORTED_VERSION = 35
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

GROUP_KEY = 0
TRANSACTION_KEY = 1
SHARE_KEY = 2
MIN_SHARE_KEY_VERSION = 6
MIN_BATCHED_VERSION = 4

_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


_API_VERSIONS_REQUEST = MessageCodec("ApiVersionsRequest")
_API_VERSIONS_RESPONSE = MessageCodec("ApiVersionsResponse")
_FIND_COORDINATOR_REQUEST = MessageCodec("FindCoordinatorRequest")
_SASL_HANDSHAKE_REQUEST = MessageCodec("SaslHandshakeRequest")
_SASL_HANDSHAKE_RESPONSE = MessageCodec("SaslHandshakeResponse")
_SASL_AUTHENTICATE_REQUEST = MessageCodec("SaslAuthenticateRequest")
_SASL_AUTHENTICATE_RESPONSE = MessageCodec("SaslAuthenticateResponse")

# --- ApiVersions --------------------------------------------------------------------------


def decode_api_versions(version: int, reader: Reader) -> bool:
    """Whether the request is valid: v3+ carries the client's software name and version,
    which Kafka checks against a pattern. Earlier versions have no body."""
    request = _API_VERSIONS_REQUEST.decode(version, reader)
    if version < 3:
        return True
    return bool(
        _SOFTWARE.fullmatch(request["client_software_name"])
        and _SOFTWARE.fullmatch(request["client_software_version"])
    )


def encode_api_versions(
    version: int, error_code: int, apis: Iterable[tuple[int, int, int]] | None = None
) -> bytes:
    """The body. ``apis`` are ``(api_key, min, max)``; by default every API we serve."""
    rows = sorted((k, lo, hi) for k, (lo, hi) in SUPPORTED.items()) if apis is None else apis
    api_keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in rows]
    return _API_VERSIONS_RESPONSE.encode(
        version, {"error_code": error_code, "api_keys": api_keys, "throttle_time_ms": 0}
    )


def unsupported_api_versions() -> bytes:
    """The v0 body answering an ApiVersions request of a version we do not know."""
    low, high = SUPPORTED[API_VERSIONS]
    return encode_api_versions(0, UNSUPPORTED_VERSION, [(API_VERSIONS, low, high)])


# --- FindCoordinator ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindCoordinatorQuery:
    key_type: int
    keys: list[str]


@dataclass(frozen=True, slots=True)
class Coordinator:
    key: str
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None


_FIND_COORDINATOR_RESPONSE = MessageCodec(
    "FindCoordinatorResponse", {"coordinators": Shape(Coordinator)}
)


def decode_find_coordinator(version: int, reader: Reader) -> FindCoordinatorQuery:
    """Before v4 the one key; a v0 request's key type is the declared default, 0."""
    request = _FIND_COORDINATOR_REQUEST.decode(version, reader)
    keys = request["coordinator_keys"] if version >= MIN_BATCHED_VERSION else [request["key"]]
    return FindCoordinatorQuery(request["key_type"], keys)


def encode_find_coordinator(version: int, coordinators: Sequence[Coordinator]) -> bytes:
    """The body; before v4 it carries exactly one coordinator, at the top level."""
    if version >= MIN_BATCHED_VERSION:
        response: dict[str, object] = {"throttle_time_ms": 0, "coordinators": coordinators}
    else:
        (c,) = coordinators
        response = {
            "throttle_time_ms": 0,
            "error_code": c.error_code,
            "error_message": c.error_message,
            "node_id": c.node_id,
            "host": c.host,
            "port": c.port,
        }
    return _FIND_COORDINATOR_RESPONSE.encode(version, response)


# --- SASL -----------------------------------------------------------------------------------


def decode_sasl_handshake(version: int, reader: Reader) -> str:
    mechanism: str = _SASL_HANDSHAKE_REQUEST.decode(version, reader)["mechanism"]
    return mechanism


def encode_sasl_handshake(error_code: int, mechanisms: Sequence[str]) -> bytes:
    return _SASL_HANDSHAKE_RESPONSE.encode(1, {"error_code": error_code, "mechanisms": mechanisms})


def decode_sasl_authenticate(version: int, reader: Reader) -> bytes:
    token: bytes = _SASL_AUTHENTICATE_REQUEST.decode(version, reader)["auth_bytes"]
    return token


def encode_sasl_authenticate(
    version: int, error_code: int, error_message: str | None, token: bytes
) -> bytes:
    # No session lifetime (the declared default, 0): the connection stays authenticated.
    response = {"error_code": error_code, "error_message": error_message, "auth_bytes": token}
    return _SASL_AUTHENTICATE_RESPONSE.encode(version, response)
