"""Setting the broker up for share-group state calls, over its own protocol: create the
user topics (the share coordinator checks each request's topic against the broker's
metadata, answering 3 for a topic it does not know), and wait until every partition of
``__share_group_state`` has a loaded coordinator.

Blocking calls, one request at a time, encoded and decoded by ``kio`` (a dev dependency,
Python 3.11+); the tests call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import datetime
import importlib
import io
import socket
import time
import uuid
from types import TracebackType
from typing import Any

from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta

from protocol.routing import partition_for

# The errors a share-group state call answers while its coordinator is not ready yet.
NOT_READY = (14, 15, 16)


def topic_text(value: Any) -> str:
    """A kio UUID in Kafka's 22-character text form."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def _encode(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def _response_class(request: Any) -> Any:
    module = type(request).__module__.replace(".request", ".response")
    found = importlib.import_module(module)
    name = type(request).__name__.replace("Request", "Response")
    return getattr(found, name)


class Connection:
    """One blocking connection; ``call`` sends a kio request and returns kio's answer."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout)
        self.correlation_id = 0

    def call(self, request: Any) -> Any:
        self.correlation_id += 1
        header = request.__header_schema__(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=self.correlation_id,
            client_id="kafka-peer",
        )
        frame = _encode(header) + _encode(request)
        self.sock.sendall(len(frame).to_bytes(4, "big") + frame)
        data = self._read(int.from_bytes(self._read(4), "big"))
        response = _response_class(request)
        answer_header, offset = entity_reader(response.__header_schema__)(data, 0)
        assert answer_header.correlation_id == self.correlation_id
        answer, _ = entity_reader(response)(data, offset)
        return answer

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def create_topic(connection: Connection, name: str, partitions: int) -> str:
    """Create a topic; its id in Kafka's text form."""
    topic = create_topics.CreatableTopic(
        name=TopicName(name),
        num_partitions=i32(partitions),
        replication_factor=i16(1),
        assignments=(),
        configs=(),
    )
    request = create_topics.CreateTopicsRequest(
        topics=(topic,),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
        validate_only=False,
    )
    (result,) = connection.call(request).topics
    if int(result.error_code) != 0:
        raise RuntimeError(f"CreateTopics {name}: {result.error_code!r} {result.error_message}")
    return topic_text(result.topic_id)


def share_coordinator(connection: Connection, key: str, timeout: float = 120.0) -> tuple[str, int]:
    """FindCoordinator (v6, key type 2) for ``key`` until it names a node: (host, port).
    The broker creates ``__share_group_state`` on the first one."""
    from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while True:
        request = FindCoordinatorRequest(key_type=i8(2), coordinator_keys=(key,))
        (found,) = connection.call(request).coordinators
        if int(found.error_code) == 0:
            return found.host, found.port
        if time.monotonic() > deadline:
            raise TimeoutError(f"FindCoordinator {key}: still {found.error_code!r}")
        time.sleep(0.1)


def wait_until_loaded(
    connection: Connection, topic_id: str, state_partitions: int, timeout: float = 180.0
) -> None:
    """For each partition of ``__share_group_state``: find its coordinator, then send a
    ReadSummary of a key it owns until the answer is no longer 14, 15 or 16."""
    from kio.schema.read_share_group_state_summary.v1 import (  # noqa: PLC0415
        request as summary,
    )

    raw_topic = base64.urlsafe_b64decode(topic_id + "==")
    deadline = time.monotonic() + timeout
    for state_partition in range(state_partitions):
        group = next(
            g
            for g in (f"kafka-peer-warm-up-{i}" for i in range(100_000))
            if partition_for(g, topic_id, 0, state_partitions) == state_partition
        )
        share_coordinator(connection, f"{group}:{topic_id}:0", timeout)
        request = summary.ReadShareGroupStateSummaryRequest(
            group_id=group,
            topics=(
                summary.ReadStateSummaryData(
                    topic_id=uuid.UUID(bytes=raw_topic),
                    partitions=(summary.PartitionData(partition=i32(0), leader_epoch=i32(-1)),),
                ),
            ),
        )
        while True:
            (topic,) = connection.call(request).results
            (result,) = topic.partitions
            if int(result.error_code) not in NOT_READY:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"state partition {state_partition} still answers {result.error_code!r}"
                )
            time.sleep(0.1)
