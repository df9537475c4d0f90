"""Fixtures of the end-to-end tests: the daemon in process behind a real socket (the
daemon as a process comes from the harness's ``spawn`` and ``daemons``, tests/harness)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from persistence import FileOps
from server.cluster import ClusterMap
from server.config import ServeConfig, load_serve_config
from server.http.app import create_app
from server.http.edge import EDGE, Edge
from server.http.transport import api_runner
from server.node import Node
from tests.figures import figures  # noqa: F401
from tests.fullfs import full_disk  # noqa: F401
from tests.harness import FORMATS, Api
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer


@dataclass
class StoreUnderTest:
    """The ``serve`` flags of one state store, and what that store holds."""

    kind: str
    flags: dict[str, Any]
    server: PostgresServer | None = None

    def postgres_records(self) -> int:
        """Rows in the PostgreSQL store's records table (blocking)."""
        assert self.server is not None
        schema = self.flags["state_store_schema"]
        return int(self.server.execute(f"SELECT count(*) FROM {schema}.sharecoord_records"))

    def daemon_flags(self) -> list[str]:
        """The same store as ``serve`` flags of a daemon process (the harness's spawn)."""
        return [f"--{name.replace('_', '-')}={value}" for name, value in self.flags.items()]


def _store_under_test(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "local":
        return StoreUnderTest("local", {})
    server = request.getfixturevalue("postgres")
    flags = {"state_store": server.uri(), "state_store_schema": fresh_schema()}
    return StoreUnderTest("postgres", flags, server)


@pytest.fixture(params=("local", "postgres"))
def store(request: pytest.FixtureRequest) -> StoreUnderTest:
    """Each state store in turn: the data directory, and the PostgreSQL store in a schema
    of its own on the session's server (tests/postgres.py). A test taking it runs once
    per store, with ``serve(**store.flags)`` (docs/design.md#cluster-mode) or a daemon
    started with ``store.daemon_flags()``."""
    return _store_under_test(request)


@pytest.fixture(params=("local", pytest.param("postgres", marks=pytest.mark.slow)))
def store_postgres_slow(request: pytest.FixtureRequest) -> StoreUnderTest:
    """As ``store``, the PostgreSQL one in `make reliability` only: for a long suite
    that runs whole on the local store in `make test`, and whose representative slice
    runs on both (``store``)."""
    return _store_under_test(request)


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    """Both body formats of docs/api.md: every test using it runs in JSON and in msgpack."""
    return str(request.param)


# --- the app in this process, on a real loopback socket ------------------------------------


class DaemonLikeServer(TestServer):
    """aiohttp's TestServer with the runner `serve` uses (server.http.transport.api_runner):
    the same connection handling and the same direct route to the RPC handlers. As
    `serve` does, it starts the node before serving and stops it after."""

    def __init__(self, node: Node, **kwargs: Any) -> None:
        super().__init__(create_app(node, token=kwargs.pop("token", None)), **kwargs)
        self.node = node

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return api_runner(self.app, self.node.config, **kwargs)

    async def start_server(self, **kwargs: Any) -> None:
        await self.node.start()
        await super().start_server(**kwargs)

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await self.node.stop()


@dataclass
class Served:
    """One app served on 127.0.0.1 as `serve` serves it, with a client session."""

    config: ServeConfig
    app: web.Application
    server: TestServer
    session: aiohttp.ClientSession
    token: str | None

    @property
    def url(self) -> str:
        return str(self.server.make_url("/")).rstrip("/")

    @property
    def node(self) -> Node:
        return self.app[EDGE].node

    @property
    def edge(self) -> Edge:
        return self.app[EDGE]

    def api(self, fmt: str = "json", *, token: str | None = None) -> Api:
        return Api(self.session, self.url, fmt, token=token if token is not None else self.token)


ServeFactory = Callable[..., Awaitable[Served]]


def serve_flags(data_dir: Path, flags: dict[str, Any]) -> argparse.Namespace:
    """Flags as the CLI gives them (text), for ``load_serve_config``."""
    values = {"data_dir": str(data_dir), "listen": "127.0.0.1:0", "partitions": 8}
    values.update(flags)
    return argparse.Namespace(
        **{k: v if isinstance(v, bool) else str(v) for k, v in values.items()}
    )


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeFactory]:
    """``await serve(**flags)``: build a node from ``serve`` flags and its app with
    ``create_app``, serve it on 127.0.0.1, and wait until /readyz says ready (unless
    ``ready=False``)."""
    started: list[Served] = []

    async def start(
        *,
        data_dir: Path | None = None,
        token: str | None = None,
        fs: FileOps | None = None,
        ready: bool = True,
        **flags: Any,
    ) -> Served:
        directory = data_dir or tmp_path / f"data{len(started)}"
        # Reads the cluster file if one is given: off the loop.
        config = await asyncio.to_thread(load_serve_config, serve_flags(directory, flags), {})
        node = Node(config, config.cluster_map, fs=fs)
        server = DaemonLikeServer(
            node,
            token=token.encode() if token is not None else None,
            host="127.0.0.1",
            port=0,
        )
        await server.start_server()
        if config.cluster is None:
            # As the daemon does for --listen :0: advertise the port actually bound.
            node.rebind(
                ClusterMap.single(config.node_id, "127.0.0.1", server.port, config.partitions)
            )
        served = Served(config, server.app, server, aiohttp.ClientSession(), token)
        started.append(served)
        if ready:
            await served.api().wait_ready()
        return served

    yield start
    for served in reversed(started):
        await served.session.close()
        await served.server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s
