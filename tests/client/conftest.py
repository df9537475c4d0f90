"""Fixtures of the client's tests: real daemons, clients that close, certificates."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from client import ShareCoordinatorClient
from protocol.topic_id import topic_id_to_rfc4122
from tests.harness import Api, Daemon, DaemonConfig, metric_total

# Two spellings of one Kafka topic id (docs/semantics.md §1.2): 22-char base64url and RFC 4122.
TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
TOPIC_RFC4122 = topic_id_to_rfc4122(TOPIC)
OTHER_TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"

_groups = itertools.count()


@pytest.fixture(scope="session")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the tests whose behaviour is per key: each uses its own group."""
    directory = tmp_path_factory.mktemp("shared")
    # The daemon's default number of state partitions (50), the client's default too.
    daemon = Daemon(DaemonConfig(directory / "data", partitions=None)).start()
    yield daemon
    daemon.stop()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., ShareCoordinatorClient]]:
    """Make clients that are closed after the test."""
    made: list[ShareCoordinatorClient] = []

    def make(*args: Any, **kwargs: Any) -> ShareCoordinatorClient:
        client = ShareCoordinatorClient(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A group id no other test uses (tests share the session daemon)."""
    return f"{request.node.name[:60]}-{next(_groups)}"


@dataclass
class Trace:
    """What a client sent, seen through an aiohttp ``TraceConfig``."""

    config: aiohttp.TraceConfig
    requests: list[tuple[str, str, str | None]]  # method, path, Content-Type

    def paths(self, suffix: str = "") -> list[str]:
        return [path for _, path, _ in self.requests if path.endswith(suffix)]


def trace() -> Trace:
    seen: list[tuple[str, str, str | None]] = []

    async def on_start(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        seen.append((params.method, params.url.path, params.headers.get("Content-Type")))

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_start)
    return Trace(config, seen)


def request_ended(path_suffix: str) -> tuple[aiohttp.TraceConfig, asyncio.Event]:
    """A trace config that sets the event when a request to ``...path_suffix`` ends."""
    ended = asyncio.Event()

    async def on_end(session: Any, context: Any, params: aiohttp.TraceRequestEndParams) -> None:
        if params.url.path.endswith(path_suffix):
            ended.set()

    config = aiohttp.TraceConfig()
    config.on_request_end.append(on_end)
    return config, ended


async def scrape(daemon: Daemon) -> str:
    async with aiohttp.ClientSession() as session:
        return await Api(session, daemon.url).metrics()


async def rpc_requests(daemon: Daemon, rpc: str) -> float:
    """RPC requests the daemon answered for ``rpc`` (any outcome)."""
    return metric_total(await scrape(daemon), "sharecoord_rpc_requests_total", rpc=rpc)


async def refused_requests(daemon: Daemon, rpc: str) -> float:
    """Requests for ``rpc`` the daemon refused whole (HTTP 400, code 42)."""
    text = await scrape(daemon)
    return metric_total(text, "sharecoord_rpc_requests_total", rpc=rpc, outcome="42")


async def entry_results(daemon: Daemon, rpc: str, code: int) -> float:
    """Partition entries of ``rpc`` the daemon answered with ``code``."""
    text = await scrape(daemon)
    return metric_total(text, "sharecoord_partition_results_total", rpc=rpc, error_code=str(code))
