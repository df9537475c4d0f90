"""The HTTP transport as ``serve`` runs it: the app served over a node with the
connection handling of ``server.http.connection``, the requests in flight counted, and
the drain at a stop (stop listening, finish the requests in flight within
``--shutdown-timeout-s``)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from server.config import ServeConfig
from server.http.app import EDGE, create_app, direct_rpc_handler
from server.http.connection import ApiAppRunner
from server.node import Drained, Node

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def api_runner(app: web.Application, config: ServeConfig, **kwargs: Any) -> ApiAppRunner:
    """The runner `serve` serves the app with (its connection handling, the RPCs' direct
    route); the tests' in-process server uses it too, so they see what `serve` does."""
    return ApiAppRunner(
        app, request_timeout_s=config.request_timeout_s, route=direct_rpc_handler, **kwargs
    )


class _InFlight:
    """Counts the requests being handled, to say at shutdown how many were drained.

    It wraps the server's request handler rather than being an app middleware: one
    counter and one call frame per request, outside the app's middleware chain."""

    def __init__(self) -> None:
        self.active = 0
        self.stopping = False
        self.drained = 0
        self.cut_off = 0

    def wrap(self, handler: Handler) -> Handler:
        async def counted(request: web.BaseRequest) -> web.StreamResponse:
            self.active += 1
            answered = False
            try:
                response = await handler(request)
                answered = True
                return response
            finally:
                self.active -= 1
                if self.stopping:
                    if answered:
                        self.drained += 1
                    else:  # cut waiting for its body, cancelled at the end of
                        # --shutdown-timeout-s, or failed
                        self.cut_off += 1

        return counted


class HttpTransport:
    """The HTTP API of one node (docs/api.md), served until ``stop``."""

    def __init__(self, node: Node, *, token: bytes | None) -> None:
        self.app = create_app(node, token=token)
        config = node.config
        self._runner = api_runner(
            self.app,
            config,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=config.shutdown_timeout_s,
            keepalive_timeout=config.request_timeout_s,
        )
        self._counter = _InFlight()

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        """Serve at ``host:port``; ``OSError`` if it cannot be bound."""
        runner = self._runner
        await runner.setup()
        assert runner.server is not None  # setup() made it
        runner.server.request_handler = self._counter.wrap(runner.server.request_handler)
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()

    def address(self) -> tuple[str, int] | None:
        """The host and port bound first, once serving."""
        for address in self._runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                return str(address[0]), int(address[1])
        return None

    @property
    def in_flight(self) -> int:
        return self._counter.active

    def stop_reading_bodies(self) -> int:
        """At SIGTERM, before the drain: the requests still waiting for their body are
        cut, not waited for (``Edge.stop_reading_bodies``); how many were."""
        self._counter.stopping = True
        return self.app[EDGE].stop_reading_bodies()

    async def stop(self) -> Drained:
        """Stop listening, let the requests in flight finish (up to
        ``--shutdown-timeout-s``), close the connections."""
        self._counter.stopping = True
        await self._runner.cleanup()
        return Drained(self._counter.drained, self._counter.cut_off)
