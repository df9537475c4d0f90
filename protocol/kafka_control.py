"""The Kafka protocol's connection-level messages the Kafka listener answers besides the
share-group state RPCs: ApiVersions, FindCoordinator, SaslHandshake, SaslAuthenticate.
Pure, no I/O. Field layouts per version (``[]`` is an array, compact in flexible
versions; flexible versions end every structure in tagged fields):

ApiVersions (18), response header always v0::

    v0     request: (empty)
           response: ErrorCode int16, ApiKeys [ApiKey int16, MinVersion int16,
           MaxVersion int16]
    v1-2   request: (empty); response: v0 + ThrottleTimeMs int32
    v3-4   request: ClientSoftwareName string, ClientSoftwareVersion string
           response: as v1, flexible; the feature tagged fields (0-3) stay at their
           defaults, so they are absent

A version newer than ours is answered with a v0 body: error 35 UNSUPPORTED_VERSION and
ApiVersions' own range, so that the client can retry with a version we have. A v3+
request whose software name or version does not match Kafka's pattern
``[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?`` is answered with error 42.

FindCoordinator (10)::

    v0     request: Key string
           response: ErrorCode int16, NodeId int32, Host string, Port int32
    v1-2   request: Key string, KeyType int8
           response: ThrottleTimeMs int32, ErrorCode int16, ErrorMessage nullable
           string, NodeId int32, Host string, Port int32
    v3     as v1-2, flexible
    v4-6   request: KeyType int8, CoordinatorKeys [string]
           response: ThrottleTimeMs int32, Coordinators [Key string, NodeId int32,
           Host string, Port int32, ErrorCode int16, ErrorMessage nullable string]

Key types: 0 group, 1 transaction, 2 share (v6+; key ``group:topicId:partition``).

SaslHandshake (17), version 1 only (v0's raw token exchange is not offered): request
Mechanism string; response ErrorCode int16, Mechanisms [string].

SaslAuthenticate (36)::

    v0     request: AuthBytes bytes
           response: ErrorCode int16, ErrorMessage nullable string, AuthBytes bytes
    v1     request as v0; response: v0 + SessionLifetimeMs int64
    v2     as v1, flexible
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol import kafka_wire as wire
from protocol.kafka_messages import API_VERSIONS, SUPPORTED
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


# --- ApiVersions --------------------------------------------------------------------------


def decode_api_versions(version: int, reader: Reader) -> bool:
    """Whether the request is valid: v3+ carries the client's software name and version,
    which Kafka checks against a pattern. Earlier versions have no body."""
    if version < 3:
        return True
    name = reader.compact_string()
    software_version = reader.compact_string()
    reader.skip_tagged_fields()
    return bool(_SOFTWARE.fullmatch(name) and _SOFTWARE.fullmatch(software_version))


def encode_api_versions(
    version: int, error_code: int, apis: Iterable[tuple[int, int, int]] | None = None
) -> bytes:
    """The body. ``apis`` are ``(api_key, min, max)``; by default every API we serve."""
    rows = sorted((k, lo, hi) for k, (lo, hi) in SUPPORTED.items()) if apis is None else apis
    rows = list(rows)
    if version >= 3:
        out = [wire.int16(error_code), wire.compact_array_length(len(rows))]
        out += [wire.int16(k) + wire.int16(lo) + wire.int16(hi) + b"\x00" for k, lo, hi in rows]
        out += [wire.int32(0), b"\x00"]
        return b"".join(out)
    out = [wire.int16(error_code), wire.int32(len(rows))]
    out += [wire.int16(k) + wire.int16(lo) + wire.int16(hi) for k, lo, hi in rows]
    if version >= 1:
        out.append(wire.int32(0))
    return b"".join(out)


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


def decode_find_coordinator(version: int, reader: Reader) -> FindCoordinatorQuery:
    r = reader
    if version >= MIN_BATCHED_VERSION:
        key_type = r.int8()
        keys = [r.compact_string() for _ in range(r.compact_array_length())]
        r.skip_tagged_fields()
        return FindCoordinatorQuery(key_type, keys)
    key = r.compact_string() if version >= 3 else r.string()
    key_type = r.int8() if version >= 1 else GROUP_KEY
    if version >= 3:
        r.skip_tagged_fields()
    return FindCoordinatorQuery(key_type, [key])


def encode_find_coordinator(version: int, coordinators: Sequence[Coordinator]) -> bytes:
    """The body; before v4 it carries exactly one coordinator."""
    if version >= MIN_BATCHED_VERSION:
        out = [wire.int32(0), wire.compact_array_length(len(coordinators))]
        for c in coordinators:
            out += [
                wire.compact_string(c.key),
                wire.int32(c.node_id),
                wire.compact_string(c.host),
                wire.int32(c.port),
                wire.int16(c.error_code),
                wire.nullable_compact_string(c.error_message),
                b"\x00",
            ]
        out.append(b"\x00")
        return b"".join(out)
    (c,) = coordinators
    if version == 0:
        return (
            wire.int16(c.error_code)
            + wire.int32(c.node_id)
            + wire.string(c.host)
            + (wire.int32(c.port))
        )
    flexible = version >= 3
    message = (
        wire.nullable_compact_string(c.error_message)
        if flexible
        else wire.nullable_string(c.error_message)
    )
    host = wire.compact_string(c.host) if flexible else wire.string(c.host)
    body = wire.int32(0) + wire.int16(c.error_code) + message + wire.int32(c.node_id) + host
    body += wire.int32(c.port)
    return body + b"\x00" if flexible else body


# --- SASL -----------------------------------------------------------------------------------


def decode_sasl_handshake(version: int, reader: Reader) -> str:
    return reader.string()


def encode_sasl_handshake(error_code: int, mechanisms: Sequence[str]) -> bytes:
    return b"".join(
        [wire.int16(error_code), wire.int32(len(mechanisms))] + [wire.string(m) for m in mechanisms]
    )


def decode_sasl_authenticate(version: int, reader: Reader) -> bytes:
    if version >= 2:
        token = reader.compact_bytes()
        reader.skip_tagged_fields()
        return token
    return reader.bytes_()


def encode_sasl_authenticate(
    version: int, error_code: int, error_message: str | None, token: bytes
) -> bytes:
    if version >= 2:
        return b"".join(
            [
                wire.int16(error_code),
                wire.nullable_compact_string(error_message),
                wire.compact_bytes(token),
                wire.int64(0),  # no session lifetime: the connection stays authenticated
                b"\x00",
            ]
        )
    body = wire.int16(error_code) + wire.nullable_string(error_message)
    body += wire.int32(len(token)) + token
    return body + wire.int64(0) if version >= 1 else body
