"""The HTTP connection under the app: what aiohttp answers on its own, and how long a
connection may wait for its first request.

aiohttp answers some requests without the app's middlewares: a request line or headers
it cannot parse (its own text/plain 400), and an ``Expect`` header other than
``100-continue`` (a text/plain 417, raised before the middlewares run). docs/api.md promises
``{"error_code", "error_message"}`` on every non-200 answer, so these get it too: JSON
for a request that did not parse (its format is not known), the request's format for a
failed expectation. A malformed request is logged in one line at debug level, not as a
trace: it is the client's mistake, not a bug.

Two requests aiohttp's parser takes are refused here, before any handler, and their
connection closed: an HTTP/0.9 request line (no version: 400; the API is HTTP/1.1, and a
0.9 client could not even read a status line), and a ``Transfer-Encoding`` other than
exactly ``chunked`` (``gzip, chunked``: aiohttp would de-chunk it and hand over the still
encoded body). RFC 9112 §6.1 asks a server for 501 on a transfer coding it does not
implement; a value that names none is malformed (400, §6.3). The body is never read.
An HTTP/0.9 request is its request line alone, while the parser waits for the blank line
that ends an HTTP/1 header block: the connection's first line, when it has no version,
gets that blank line, so that it is refused at once rather than when the request timeout
closes the connection.

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

from aiohttp import HttpVersion10, web

from protocol import codec, errors
from protocol.codec import Format

_log = logging.getLogger("sharecoord.http")

JSON = "application/json"
# Longer than any request line aiohttp takes (8190 bytes): past it, nothing to look for.
_LONGEST_FIRST_LINE = 16 * 1024
_MEDIA = {Format.MSGPACK: "application/msgpack", Format.JSON: JSON}


def _one_line(text: str, limit: int = 200) -> str:
    """aiohttp's parser messages span lines (the bad bytes, a caret under them)."""
    parts = [p.strip() for p in text.splitlines()]
    line = " ".join(p for p in parts if p and set(p) != {"^"})
    return line if len(line) <= limit else line[:limit] + "..."


def _error_body(status: int, message: str) -> tuple[int, str]:
    if status >= 500:
        return errors.UNKNOWN_SERVER_ERROR, errors.UnknownServerError.default_message or ""
    code = errors.CLUSTER_AUTHORIZATION_FAILED if status == 401 else errors.INVALID_REQUEST
    if status == 404:
        code = errors.UNKNOWN_TOPIC_OR_PARTITION
    return code, message


class ApiRequestHandler(web.RequestHandler):
    """One connection: aiohttp's, with API error bodies and a first-request deadline."""

    __slots__ = ("_first_line", "_first_request_timeout", "_first_request_timer")

    def __init__(self, manager: web.Server, *, first_request_timeout: float, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._first_request_timeout = first_request_timeout
        self._first_request_timer: asyncio.TimerHandle | None = None
        # The connection's first line while it arrives; None once it ended.
        self._first_line: bytes | None = b""

    def data_received(self, data: bytes) -> None:
        if self._first_line is not None:
            data = self._end_a_version_less_first_line(data)
        super().data_received(data)

    def _end_a_version_less_first_line(self, data: bytes) -> bytes:
        """``data``, with a blank line after the connection's first line if that is an
        HTTP/0.9 request line (a method and a target, no version): the request is that
        line alone, and the blank line lets the parser hand it over to be refused."""
        assert self._first_line is not None
        end = data.find(b"\n")
        if end < 0:
            seen = self._first_line + data
            self._first_line = seen if len(seen) <= _LONGEST_FIRST_LINE else None
            return data
        line = (self._first_line + data[:end]).rstrip(b"\r")
        self._first_line = None
        if len(line.split(b" ")) != 2:
            return data  # a version, or no request line at all: the parser's to judge
        return data[: end + 1] + b"\r\n" + data[end + 1 :]

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

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or a handler that escaped every guard):
        the API's error body, and the connection closes."""
        text = _one_line(message or (str(exc) if exc is not None else "") or "bad request")
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            _log.debug("malformed HTTP request from %s: %s", request.remote, text)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already being sent; closing the connection")
        code, text = _error_body(status, f"malformed HTTP request: {text}")
        response = web.Response(
            status=status, body=codec.encode_error(code, text, Format.JSON), content_type=JSON
        )
        response.force_close()
        return response


class ApiServer(web.Server):
    """aiohttp's Server, making ApiRequestHandler connections."""

    first_request_timeout: float = 60.0

    def __call__(self) -> web.RequestHandler:
        return ApiRequestHandler(
            self, loop=self._loop, first_request_timeout=self.first_request_timeout, **self._kwargs
        )


ServerHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def _refusal(request: web.BaseRequest) -> web.Response | None:
    """The answer to a request the API does not take whatever its route (the module
    docstring): HTTP/0.9, or a transfer coding other than chunked; else None."""
    if request.version < HttpVersion10:
        status, text = 400, "HTTP/0.9 is not supported: send HTTP/1.1"
    else:
        coding = request.headers.get("Transfer-Encoding")
        if coding is None or coding.strip().lower() == "chunked":
            return None
        if not coding.replace(",", "").strip():
            # No coding to implement, and no chunked last to find the body's end by: the
            # request is malformed (RFC 9112 §6.3), not asking for what we lack.
            status = 400
            text = "Transfer-Encoding names no transfer coding"
        else:
            status = 501
            text = f"Transfer-Encoding {_one_line(coding)!r} is not supported"
        text += ": send the body with Content-Length, or with Transfer-Encoding: chunked alone"
    _log.debug("refused a request from %s: %s", request.remote, text)
    fmt = codec.response_format(request.headers.get("Content-Type"), request.headers.get("Accept"))
    response = web.Response(
        status=status,
        body=codec.encode_error(errors.INVALID_REQUEST, text, fmt),
        content_type=_MEDIA[fmt],
    )
    response.force_close()  # a body, if any, is never read
    return response


def _answer_http_errors(handler: ServerHandler) -> ServerHandler:
    """The app's handler, with HTTP errors raised before its middlewares (aiohttp's
    Expect handling) answered with the API's body, and the requests no route takes
    (``_refusal``) refused; it also tells the connection a request started."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        if isinstance(protocol, ApiRequestHandler):
            protocol.request_started()
        refusal = _refusal(request)
        if refusal is not None:
            return refusal
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            fmt = codec.response_format(
                request.headers.get("Content-Type"), request.headers.get("Accept")
            )
            code, text = _error_body(exc.status, exc.text or exc.reason)
            return web.Response(
                status=exc.status,
                body=codec.encode_error(code, text, fmt),
                content_type=_MEDIA[fmt],
            )

    return handle


class ApiAppRunner(web.AppRunner):
    """``web.AppRunner`` whose server is an ApiServer (see the module docstring).
    ``route`` may put a handler of its own in front of the app's (the server's
    ``request_handler``, given the app's), as server.http.app.direct_rpc_handler does."""

    def __init__(
        self,
        app: web.Application,
        *,
        request_timeout_s: float,
        route: Callable[[web.Application, ServerHandler], ServerHandler] | None = None,
        **kwargs: Any,
    ):
        super().__init__(app, **kwargs)
        self._request_timeout_s = request_timeout_s
        self._route = route

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Application._make_handler builds a plain Server; ours only adds __call__ and a
        # class attribute, so the object keeps every field it was built with.
        server.__class__ = ApiServer
        assert isinstance(server, ApiServer)
        server.first_request_timeout = self._request_timeout_s
        handler = server.request_handler
        if self._route is not None:
            handler = self._route(self.app, handler)
        server.request_handler = _answer_http_errors(handler)
        return server
