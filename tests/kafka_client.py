"""A Kafka-protocol client for the tests, built on ``kio`` (an implementation of the wire
format independent of ours): requests are kio entities, answers are decoded by kio.

``KafkaClient`` keeps one connection and sends requests with increasing correlation ids;
``send`` returns the decoded answer, ``pipeline`` sends several before reading any.
``share_request`` turns the HTTP API's JSON body (docs/api.md) into the kio request of
the same RPC, and ``as_http`` turns a kio answer into the HTTP API's JSON answer, so a
test can compare the two listeners value for value.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import importlib
import io
import re
import ssl
import struct
import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("kio", reason="kio needs Python 3.11+")

import contextlib

from kio.serial import entity_reader, entity_writer

RPC_MODULES = {
    "initialize": "initialize_share_group_state",
    "read": "read_share_group_state",
    "write": "write_share_group_state",
    "delete": "delete_share_group_state",
    "read-summary": "read_share_group_state_summary",
}
LATEST = {"initialize": 0, "read": 0, "write": 1, "delete": 0, "read-summary": 1}
_KAFKA_LINE = re.compile(r"^sharecoord kafka listener on \[?([^\]]+?)\]?:(\d+)$")


def kafka_address(stdout_lines: list[str]) -> tuple[str, int]:
    """The Kafka listener's address from a daemon's stdout."""
    for line in stdout_lines:
        match = _KAFKA_LINE.match(line)
        if match:
            return match[1], int(match[2])
    raise AssertionError(f"no Kafka listener line in {stdout_lines}")


def raw_request(api_key: int, version: int, correlation: int, body: bytes = b"") -> bytes:
    """A frame of any apiKey and version, header v2 (null client id, no tagged fields)
    over ``body``: for the requests no library would build."""
    header = api_key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big", signed=True)
    header += correlation.to_bytes(4, "big", signed=True) + b"\xff\xff" + b"\x00"
    data = header + body
    return len(data).to_bytes(4, "big") + data


def schema(module: str, version: int, kind: str) -> Any:
    return importlib.import_module(f"kio.schema.{module}.v{version}.{kind}")


def message_class(module: str, version: int, kind: str) -> Any:
    mod = schema(module, version, kind)
    suffix = "Request" if kind == "request" else "Response"
    (name,) = [
        n for n in dir(mod) if n.endswith(suffix) and n not in ("RequestHeader", "ResponseHeader")
    ]
    return getattr(mod, name)


def encode(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def topic_uuid(topic_id: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=="))


def topic_text(value: uuid.UUID | None) -> str:
    raw = bytes(16) if value is None else value.bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def share_request(rpc: str, body: dict[str, Any], version: int | None = None) -> Any:
    """The kio request of ``rpc`` carrying the HTTP API's JSON ``body``."""
    version = LATEST[rpc] if version is None else version
    mod = schema(RPC_MODULES[rpc], version, "request")
    top = message_class(RPC_MODULES[rpc], version, "request")
    topic_cls = next(
        getattr(mod, n) for n in dir(mod) if n.endswith(("StateData", "StateSummaryData"))
    )
    part_cls = mod.PartitionData
    topics = []
    for topic in body["topics"]:
        parts = []
        for entry in topic["partitions"]:
            fields = {k: v for k, v in entry.items() if k in part_cls.__dataclass_fields__}
            if "leader_epoch" in part_cls.__dataclass_fields__:
                fields.setdefault("leader_epoch", -1)
            if "state_batches" in fields:
                fields["state_batches"] = tuple(
                    mod.StateBatch(**batch) for batch in fields["state_batches"]
                )
            parts.append(part_cls(**fields))
        topics.append(topic_cls(topic_id=topic_uuid(topic["topic_id"]), partitions=tuple(parts)))
    return top(group_id=body["group_id"], topics=tuple(topics))


def as_http(answer: Any) -> dict[str, Any]:
    """A kio share-group state answer as the HTTP API's JSON answer."""
    results = []
    for topic in answer.results:
        parts = []
        for p in topic.partitions:
            fields: dict[str, Any] = {}
            for name in p.__dataclass_fields__:
                if name.startswith("__"):
                    continue
                value = getattr(p, name)
                if name == "error_code":
                    value = int(value)
                elif name == "state_batches":
                    value = [
                        {
                            "first_offset": b.first_offset,
                            "last_offset": b.last_offset,
                            "delivery_state": b.delivery_state,
                            "delivery_count": b.delivery_count,
                        }
                        for b in value
                    ]
                fields[name] = value
            parts.append(fields)
        results.append({"topic_id": topic_text(topic.topic_id), "partitions": parts})
    return {"results": results}


class KafkaClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.correlation_id = 0

    @classmethod
    async def connect(
        cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None
    ) -> KafkaClient:
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl_context)
        return cls(reader, writer)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()

    def frame(self, entity: Any, correlation_id: int | None = None) -> tuple[bytes, int]:
        if correlation_id is None:
            self.correlation_id += 1
            correlation_id = self.correlation_id
        header_cls = entity.__header_schema__
        header = header_cls(
            request_api_key=entity.__api_key__,
            request_api_version=entity.__version__,
            correlation_id=correlation_id,
            client_id="sharecoord-tests",
        )
        body = encode(header) + encode(entity)
        return len(body).to_bytes(4, "big") + body, correlation_id

    async def read_frame(self) -> bytes:
        size = int.from_bytes(await self.reader.readexactly(4), "big")
        return await self.reader.readexactly(size)

    def decode(self, request: Any, data: bytes, correlation_id: int) -> Any:
        module = type(request).__module__.split(".")
        response_cls = message_class(module[2], int(module[3][1:]), "response")
        header, offset = entity_reader(response_cls.__header_schema__)(data, 0)
        assert header.correlation_id == correlation_id
        answer, size = entity_reader(response_cls)(data, offset)
        assert offset + size == len(data)
        return answer

    async def send(self, request: Any) -> Any:
        data, correlation_id = self.frame(request)
        self.writer.write(data)
        await self.writer.drain()
        return self.decode(request, await self.read_frame(), correlation_id)

    async def pipeline(self, requests: list[Any]) -> list[Any]:
        frames = [self.frame(r) for r in requests]
        self.writer.write(b"".join(data for data, _ in frames))
        await self.writer.drain()
        return [
            self.decode(request, await self.read_frame(), correlation_id)
            for request, (_, correlation_id) in zip(requests, frames, strict=True)
        ]

    async def login_plain(self, password: str, user: str = "tests") -> None:
        """SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v2); asserts it succeeded."""
        handshake = message_class("sasl_handshake", 1, "request")(mechanism="PLAIN")
        assert int((await self.send(handshake)).error_code) == 0
        token = b"\x00" + user.encode() + b"\x00" + password.encode()
        done = await self.send(message_class("sasl_authenticate", 2, "request")(auth_bytes=token))
        assert int(done.error_code) == 0, done.error_message

    async def rpc(self, rpc: str, body: dict[str, Any], version: int | None = None) -> Any:
        """One share-group state RPC from an HTTP-API body; the answer as HTTP's JSON."""
        return as_http(await self.send(share_request(rpc, body, version)))

    async def closed_by_peer(self, timeout: float = 30.0) -> bool:
        """Whether the daemon closes the connection (EOF or reset) within ``timeout``."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            while data:
                data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except (ConnectionError, ssl.SSLError):
            return True
        except asyncio.TimeoutError:
            return False
        return True


# --- every string a request carries, made of any bytes --------------------------------------

_TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
_ENTRY = {"partition": 0, "state_epoch": 0, "leader_epoch": 0, "start_offset": 0}


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    return len(raw).to_bytes(2, "big") + raw


def _compact(raw: bytes) -> bytes:
    return _uvarint(len(raw) + 1) + raw


def _frame(
    api_key: int, version: int, body: bytes, *, flexible: bool, client_id: bytes | None = None
) -> bytes:
    """A request frame, header v2 (``flexible``) or v1, with a client id of exactly
    those bytes (null if None)."""
    header = struct.pack(">hhi", api_key, version, 7)
    header += b"\xff\xff" if client_id is None else _string(client_id)
    data = header + (b"\x00" if flexible else b"") + body
    return len(data).to_bytes(4, "big") + data


def share_frame(rpc: str, version: int, group: bytes, client_id: bytes | None = None) -> bytes:
    """A request of ``rpc`` (kio's encoding) whose group id is exactly ``group``."""
    entry = {**_ENTRY, "state_batches": []} if rpc == "write" else _ENTRY
    request = share_request(rpc, body_of("g", entry), version)
    encoded = encode(request)
    assert encoded.startswith(_compact(b"g"))  # the group id comes first
    encoded = _compact(group) + encoded[len(_compact(b"g")) :]
    return _frame(request.__api_key__, version, encoded, flexible=True, client_id=client_id)


def body_of(group: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {"group_id": group, "topics": [{"topic_id": _TOPIC, "partitions": [entry]}]}


def find_coordinator_frame(version: int, keys: list[bytes]) -> bytes:
    """FindCoordinator for share keys (type 2; one key before v4) of exactly these bytes."""
    if version >= 4:
        keys_array = _uvarint(len(keys) + 1) + b"".join(_compact(k) for k in keys)
        body = b"\x02" + keys_array + b"\x00"
    elif version == 3:
        body = _compact(keys[0]) + b"\x02\x00"
    else:
        body = _string(keys[0]) + (b"\x02" if version >= 1 else b"")
    return _frame(10, version, body, flexible=version >= 3)


def _find_coordinator_key(version: int, raw: bytes) -> bytes:
    return find_coordinator_frame(version, [raw])


def _find_coordinator_second_key(raw: bytes) -> bytes:
    return find_coordinator_frame(6, [f"g:{_TOPIC}:0".encode(), raw])


def _sasl_mechanism(raw: bytes) -> bytes:
    return _frame(17, 1, _string(raw), flexible=False)


def _api_versions(version: int, which: str, raw: bytes) -> bytes:
    name, software_version = (raw, b"1") if which == "name" else (b"tests", raw)
    body = _compact(name) + _compact(software_version) + b"\x00"
    return _frame(18, version, body, flexible=True)


def _api_versions_client_id(raw: bytes) -> bytes:
    return _frame(18, 0, b"", flexible=False, client_id=raw)


def _read_client_id(raw: bytes) -> bytes:
    return share_frame("read", 0, b"g", client_id=raw)


# (where, a frame with that string made of the given bytes, whether the daemon decodes
# it): the group id of every RPC at every version, FindCoordinator's keys at every
# version, SaslHandshake's mechanism, ApiVersions' client software name and version;
# and the header's client id, which the daemon skips unread (Kafka decodes it, never
# refusing one).
STRING_POSITIONS: list[tuple[str, Callable[[bytes], bytes], bool]] = [
    *[
        (f"{rpc} v{version} group_id", functools.partial(share_frame, rpc, version), True)
        for rpc in RPC_MODULES
        for version in range(LATEST[rpc] + 1)
    ],
    *[
        (f"FindCoordinator v{v} key", functools.partial(_find_coordinator_key, v), True)
        for v in range(7)
    ],
    ("FindCoordinator v6 keys[1]", _find_coordinator_second_key, True),
    ("SaslHandshake v1 mechanism", _sasl_mechanism, True),
    *[
        (f"ApiVersions v{v} software {which}", functools.partial(_api_versions, v, which), True)
        for v in (3, 4)
        for which in ("name", "version")
    ],
    ("ApiVersions v0 client_id", _api_versions_client_id, False),
    ("read v0 client_id", _read_client_id, False),
]
