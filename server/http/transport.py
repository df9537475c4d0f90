"""The HTTP transport as ``serve`` runs it: the listen address bound before the node
starts, the app served over the node with the connection handling of
``server.http.connection``, the requests in flight counted, and the drain at a stop
(stop listening, finish the requests in flight within ``--shutdown-timeout-s``)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from server.config import ServeConfig
from server.http.app import create_app, direct_rpc_handler
from server.http.connection import ApiAppRunner
from server.http.edge import EDGE
from server.node import Drained, Node

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# Connections the kernel completes before they are accepted (aiohttp's default).
BACKLOG = 128


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Bind and listen at ``--listen`` as the event loop's ``create_server`` would (every
    address the host resolves to; SO_REUSEADDR; an IPv6 socket for IPv6 alone), but
    before anything serves: ``serve`` binds first, so that an address in use is one line
    and no data directory made. Connections made meanwhile wait in the backlog.
    ``OSError`` if an address cannot be bound."""
    infos = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


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

    async def start(
        self, sockets: list[socket.socket], ssl_context: ssl.SSLContext | None
    ) -> None:
        """Serve on the sockets ``bind_sockets`` bound."""
        runner = self._runner
        await runner.setup()
        assert runner.server is not None  # setup() made it
        runner.server.request_handler = self._counter.wrap(runner.server.request_handler)
        for sock in sockets:
            await web.SockSite(runner, sock, ssl_context=ssl_context, backlog=BACKLOG).start()

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
