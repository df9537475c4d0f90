"""The Kafka wire as the rest of sharecoord reads and writes it: the primitives
(``protocol.kafka_primitives``) and the headers. Pure, no I/O.

A frame on a Kafka connection is an int32 size followed by that many bytes: a request
header and a request body, or a response header and a response body. The headers are
declared in ``protocol/kafka_specs`` (RequestHeader, ResponseHeader) and built by
``protocol.kafka_codec`` as every message is:

| header | fields |
| --- | --- |
| request v1 | api_key int16, api_version int16, correlation_id int32, client_id |
| request v2 | v1 + tagged fields; client_id stays a nullable *string*, never compact |
| response v0 | correlation_id int32 |
| response v1 | v0 + tagged fields |

Which header version a message uses depends on its API and version
(``protocol.kafka_messages``): flexible versions use request v2 / response v1.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.kafka_codec import MessageCodec
from protocol.kafka_primitives import (
    Reader,
    WireError,
    bytes_,
    compact_array_length,
    compact_bytes,
    compact_string,
    frame,
    int8,
    int16,
    int32,
    int64,
    nullable_bytes,
    nullable_compact_bytes,
    nullable_compact_string,
    nullable_string,
    peek_api,
    string,
    uvarint,
    varint,
)
from protocol.kafka_schema import Shape

__all__ = [
    "Reader",
    "RequestHeader",
    "WireError",
    "bytes_",
    "compact_array_length",
    "compact_bytes",
    "compact_string",
    "frame",
    "int8",
    "int16",
    "int32",
    "int64",
    "nullable_bytes",
    "nullable_compact_bytes",
    "nullable_compact_string",
    "nullable_string",
    "peek_api",
    "read_request_header",
    "request_header",
    "response_header",
    "skip_request_header",
    "string",
    "uvarint",
    "varint",
    "write_response_header",
]


@dataclass(frozen=True, slots=True)
class RequestHeader:
    request_api_key: int
    request_api_version: int
    correlation_id: int
    client_id: str | None


# No API the listener serves uses request header v0 (that of ControlledShutdown v0).
_REQUEST_HEADERS = (1, 2)
_REQUEST_HEADER = MessageCodec("RequestHeader", {"": Shape(RequestHeader)}, _REQUEST_HEADERS)
# The server's hot path has no use for the client id: it is checked, not decoded.
_SKIP_REQUEST_HEADER = MessageCodec(
    "RequestHeader", {"": Shape(skip=frozenset({"client_id"}))}, _REQUEST_HEADERS
)
_RESPONSE_HEADER = MessageCodec("ResponseHeader")


def read_request_header(reader: Reader, header_version: int) -> RequestHeader:
    """A request header, its client id read as Kafka reads it (``_client_id``): the one
    field the declaration's strict string does not describe, so read by hand here."""
    api_key = reader.int16()
    api_version = reader.int16()
    correlation_id = reader.int32()
    client_id = _client_id(reader) if header_version >= 1 else None
    if header_version >= 2:
        reader.skip_tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def _client_id(reader: Reader) -> str | None:
    """The header's client id: a label, which Kafka decodes replacing what is not UTF-8
    and never refuses. Nor does the hot path (``skip_request_header``), which does not
    decode it at all: a request that passes there must pass here too."""
    n = reader.int16()
    if n < -1:
        raise WireError(f"a client id length of {n}")
    if n == -1:
        return None
    pos = reader._take(n)
    return str(reader.buf[pos : pos + n], "utf-8", "replace")


def skip_request_header(reader: Reader, header_version: int) -> int:
    """Read past a request header v1 or v2 and return its correlation id."""
    header = _SKIP_REQUEST_HEADER.decoders[header_version](reader, None)
    correlation_id: int = header["correlation_id"]
    return correlation_id


def request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, version: int
) -> bytes:
    """A request header (for clients: tests, the benchmark's load generator)."""
    header = RequestHeader(api_key, api_version, correlation_id, client_id)
    return _REQUEST_HEADER.encode(version, header)


def response_header(correlation_id: int, version: int) -> bytes:
    out = bytearray()
    write_response_header(out, correlation_id, version)
    return bytes(out)


def write_response_header(out: bytearray, correlation_id: int, version: int) -> None:
    """Append a response header to ``out`` (where a whole frame is being written)."""
    _RESPONSE_HEADER.encoders[version](out, {"correlation_id": correlation_id})
