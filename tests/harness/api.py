"""The daemon's HTTP API as docs/api.md describes it, for tests: topic ids, keys,
request bodies, and ``Api``, a small client.

``Api`` sends the API's requests in either format (``"json"`` or ``"msgpack"``) and
decodes whatever comes back by its Content-Type, so a test sees what a caller sees.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack

from protocol.routing import partition_for
from tests.harness.metrics import metric_value
from tests.harness.wait import wait_until

# Two topic ids for tests: Kafka's 22-char form and the same id in RFC 4122 form.
TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
TOPIC_RFC4122 = "5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d"
OTHER_TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"

MEDIA = {"json": "application/json", "msgpack": "application/msgpack"}
FORMATS = ("json", "msgpack")


# --- keys ---------------------------------------------------------------------------------


def partitions_in(
    state_partition: int,
    num_partitions: int,
    *,
    group_id: str,
    topic_id: str = TOPIC,
    count: int = 1,
    start: int = 0,
) -> list[int]:
    """The first ``count`` partition numbers >= ``start`` of ``group_id``/``topic_id``
    whose keys belong to ``state_partition`` (topic id in its 22-char form)."""
    found: list[int] = []
    partition = start
    while len(found) < count:
        if partition_for(group_id, topic_id, partition, num_partitions) == state_partition:
            found.append(partition)
        partition += 1
    return found


# --- request bodies -----------------------------------------------------------------------


def batch(first: int, last: int, state: int = 0, count: int = 1) -> dict[str, int]:
    return {
        "first_offset": first,
        "last_offset": last,
        "delivery_state": state,
        "delivery_count": count,
    }


def body(group_id: str, *topics: tuple[str, Iterable[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "topics": [{"topic_id": t, "partitions": list(entries)} for t, entries in topics],
    }


def init_entry(partition: int, state_epoch: int = 0, start_offset: int = 0) -> dict[str, Any]:
    return {"partition": partition, "state_epoch": state_epoch, "start_offset": start_offset}


def write_entry(
    partition: int,
    *batches: dict[str, int],
    state_epoch: int = 0,
    leader_epoch: int = 0,
    start_offset: int = -1,
    delivery_complete_count: int | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "partition": partition,
        "state_epoch": state_epoch,
        "leader_epoch": leader_epoch,
        "start_offset": start_offset,
        "state_batches": list(batches),
    }
    if delivery_complete_count is not None:
        entry["delivery_complete_count"] = delivery_complete_count
    return entry


def read_entry(partition: int, leader_epoch: int = 0) -> dict[str, Any]:
    return {"partition": partition, "leader_epoch": leader_epoch}


def part(partition: int) -> dict[str, Any]:
    return {"partition": partition}


# --- the HTTP client ----------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    content_type: str
    headers: Mapping[str, str]
    body: Any  # decoded JSON / msgpack, or text
    raw: bytes

    @property
    def format(self) -> str | None:
        for name, media in MEDIA.items():
            if self.content_type == media:
                return name
        return None


def encode(obj: Any, fmt: str) -> bytes:
    if fmt == "msgpack":
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj).encode()


def decode(raw: bytes, content_type: str) -> Any:
    if content_type == MEDIA["msgpack"]:
        return msgpack.unpackb(raw, raw=False)
    if content_type == MEDIA["json"]:
        return json.loads(raw)
    return raw.decode("utf-8", "replace")


class Api:
    """docs/api.md over HTTP, in one format; ``token`` adds the bearer header."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        fmt: str = "json",
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.fmt = fmt
        self.token = token
        self.ssl_context = ssl_context

    def with_format(self, fmt: str) -> Api:
        return Api(self.session, self.base_url, fmt, token=self.token, ssl_context=self.ssl_context)

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | Any = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        kwargs: dict[str, Any] = {}
        if self.ssl_context is not None:
            kwargs["ssl"] = self.ssl_context
        async with self.session.request(
            method,
            self.base_url + path,
            data=data,
            headers=self._headers(headers),
            params=params,
            **kwargs,
        ) as response:
            raw = await response.read()
            content_type = response.content_type
            return Reply(
                response.status, content_type, response.headers, decode(raw, content_type), raw
            )

    async def post(self, path: str, obj: Any, *, headers: Mapping[str, str] | None = None) -> Reply:
        """POST ``obj`` encoded in this client's format, with its Content-Type."""
        all_headers = {"Content-Type": MEDIA[self.fmt], **(headers or {})}
        return await self.request("POST", path, data=encode(obj, self.fmt), headers=all_headers)

    async def rpc_reply(self, rpc: str, obj: Any) -> Reply:
        return await self.post(f"/v1/share-group-state/{rpc}", obj)

    async def rpc(self, rpc: str, obj: Any) -> dict[str, Any]:
        """One of the five RPCs; asserts HTTP 200 in this client's format."""
        reply = await self.rpc_reply(rpc, obj)
        assert reply.status == 200, (reply.status, reply.body)
        assert reply.format == self.fmt, reply.content_type
        return reply.body  # type: ignore[no-any-return]

    async def results(self, rpc: str, obj: Any) -> list[dict[str, Any]]:
        """The partition results of a one-topic request, in order."""
        answer = await self.rpc(rpc, obj)
        assert len(answer["results"]) == 1, answer
        return answer["results"][0]["partitions"]  # type: ignore[no-any-return]

    async def codes(self, rpc: str, obj: Any) -> list[int]:
        return [r["error_code"] for r in await self.results(rpc, obj)]

    async def admin_state(
        self, group_id: str, topic_id: str, partition: int, *, accept: str | None = None
    ) -> Reply:
        headers = {"Accept": accept} if accept else {"Accept": MEDIA[self.fmt]}
        return await self.request(
            "GET",
            "/v1/admin/state",
            params={"group_id": group_id, "topic_id": topic_id, "partition": str(partition)},
            headers=headers,
        )

    async def register_topic(self, topic_id: str, partition_count: int) -> Reply:
        """``PUT /v1/admin/topics`` in this client's format."""
        return await self.request(
            "PUT",
            "/v1/admin/topics",
            data=encode({"topic_id": topic_id, "partition_count": partition_count}, self.fmt),
            headers={"Content-Type": MEDIA[self.fmt]},
        )

    async def delete_topic(self, topic_id: str) -> Reply:
        """``DELETE /v1/admin/topics/{topic_id}``, answered in this client's format."""
        return await self.request(
            "DELETE", f"/v1/admin/topics/{topic_id}", headers={"Accept": MEDIA[self.fmt]}
        )

    async def state(self, group_id: str, topic_id: str, partition: int) -> dict[str, Any] | None:
        """The admin state of a key, or None on 404 (code 3)."""
        reply = await self.admin_state(group_id, topic_id, partition)
        if reply.status == 404:
            assert reply.body["error_code"] == 3, reply.body
            return None
        assert reply.status == 200, (reply.status, reply.body)
        return reply.body  # type: ignore[no-any-return]

    async def readyz(self) -> Reply:
        return await self.request("GET", "/readyz")

    async def wait_ready(self) -> None:
        """Until /readyz answers 200: every state partition this node owns is loaded."""
        await wait_until(
            self.readyz, "/readyz to answer 200", until=lambda reply: reply.status == 200
        )

    async def metrics(self) -> str:
        """The /metrics page, to read with tests/harness/metrics.py."""
        reply = await self.request("GET", "/metrics")
        assert reply.status == 200
        return reply.raw.decode()

    async def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (``metric_value``: exactly these labels, 0 if absent)."""
        return metric_value(await self.metrics(), name, **labels)
