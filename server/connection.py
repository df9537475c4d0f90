"""The HTTP connection under the app: how long a connection may wait for its first
request.

A client that connects and sends its request line and headers slowly, or never, is cut
off after ``request_timeout_s``. aiohttp before 3.14.5 starts no timer until a first
request was served, and from then on only times out connections idle between requests
(its keep-alive timer, which the daemon sets to the same timeout), so the deadline of the
first request is ours.

aiohttp builds its ``Server`` inside ``Application._make_handler``, so the runner hands
that object our subclass, which makes our ``RequestHandler`` subclass per connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

_log = logging.getLogger("sharecoord.http")


class ApiRequestHandler(web.RequestHandler):
    """One connection: aiohttp's, with a first-request deadline."""

    __slots__ = ("_first_request_timeout", "_first_request_timer")

    def __init__(self, manager: web.Server, *, first_request_timeout: float, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._first_request_timeout = first_request_timeout
        self._first_request_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._first_request_timer = asyncio.get_running_loop().call_later(
            self._first_request_timeout, self._first_request_overdue
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        self.request_started()
        super().connection_lost(exc)

    def request_started(self) -> None:
        """The first request's headers arrived: the deadline is aiohttp's from here."""
        timer, self._first_request_timer = self._first_request_timer, None
        if timer is not None:
            timer.cancel()

    def _first_request_overdue(self) -> None:
        self._first_request_timer = None
        _log.debug(
            "closing a connection that sent no whole request within %gs",
            self._first_request_timeout,
        )
        self.force_close()


class ApiServer(web.Server):
    """aiohttp's Server, making ApiRequestHandler connections."""

    first_request_timeout: float = 60.0

    def __call__(self) -> web.RequestHandler:
        return ApiRequestHandler(
            self, loop=self._loop, first_request_timeout=self.first_request_timeout, **self._kwargs
        )


def _marking_requests(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """The app's handler, telling the connection that a request started."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, ApiRequestHandler):
            protocol.request_started()
        return await handler(request)

    return handle


class ApiAppRunner(web.AppRunner):
    """``web.AppRunner`` whose server is an ApiServer (see the module docstring)."""

    def __init__(self, app: web.Application, *, request_timeout_s: float, **kwargs: Any):
        super().__init__(app, **kwargs)
        self._request_timeout_s = request_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Application._make_handler builds a plain Server; ours only adds __call__ and a
        # class attribute, so the object keeps every field it was built with.
        server.__class__ = ApiServer
        assert isinstance(server, ApiServer)
        server.first_request_timeout = self._request_timeout_s
        server.request_handler = _marking_requests(server.request_handler)
        return server
