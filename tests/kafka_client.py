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
import importlib
import io
import re
import ssl
import uuid
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
