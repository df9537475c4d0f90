"""The HTTP edge (docs/api.md): what every handler and middleware shares.

Bodies are decoded at this edge (``protocol.codec``, ``server.http.bodies``): a malformed
body stops here with 400 / INVALID_REQUEST naming the field, and nothing reaches the
node. Every non-200 answer carries ``{"error_code", "error_message"}``: the handlers'
own, and what ``errors_middleware`` makes of what they raised. Every answer is sent
within ``--request-timeout-s`` (``deliver``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import StreamReader, web

from protocol import codec, errors
from protocol.codec import Format
from server.node import Node
from server.service import ServiceError

_log = logging.getLogger("sharecoord.http")

CONTENT_TYPES = {Format.MSGPACK: "application/msgpack", Format.JSON: "application/json"}


@dataclass
class Edge:
    """What the handlers share: the node they serve, the bearer token, and the bodies
    still arriving."""

    node: Node
    token: bytes | None
    # The bodies of the requests waiting for the rest of them, and whether the daemon
    # stopped reading bodies (stop_reading_bodies).
    reading_bodies: set[StreamReader] = field(default_factory=set)
    stopped_reading: bool = False

    def stop_reading_bodies(self) -> int:
        """At SIGTERM: cut every request still waiting for its body, and every one that
        starts waiting from now on, instead of waiting for them (up to the request
        timeout) within the shutdown timeout. They were never answered and are counted
        as cut off; their connections close. Returns how many were waiting."""
        self.stopped_reading = True
        for body in self.reading_bodies:
            # What aiohttp itself does to a request at the end of the shutdown timeout.
            body.set_exception(asyncio.CancelledError())
        return len(self.reading_bodies)


EDGE = web.AppKey("edge", Edge)
RequestHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- responses ------------------------------------------------------------------------


def respond(body: bytes, fmt: Format, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=CONTENT_TYPES[fmt])


def error_response(status: int, code: int, message: str, fmt: Format = Format.JSON) -> web.Response:
    return respond(codec.encode_error(code, message, fmt), fmt, status)


def accept_format(request: web.Request) -> Format:
    """Format for requests without a body (GET/DELETE): JSON unless Accept asks msgpack."""
    return codec.response_format("application/json", request.headers.get("Accept"))


def answer_format(request: web.Request) -> Format:
    """Format of an answer given before (or instead of) a handler: the request's format
    when its Content-Type names one, else JSON; Accept may ask for the other (docs/api.md)."""
    return codec.response_format(request.headers.get("Content-Type"), request.headers.get("Accept"))


# --- middlewares ----------------------------------------------------------------------

_STATUS_CODES = {
    400: errors.INVALID_REQUEST,
    401: errors.CLUSTER_AUTHORIZATION_FAILED,
    404: errors.UNKNOWN_TOPIC_OR_PARTITION,
    405: errors.INVALID_REQUEST,
    413: errors.INVALID_REQUEST,
    415: errors.INVALID_REQUEST,
}


@web.middleware
async def errors_middleware(request: web.Request, handler: RequestHandler) -> web.StreamResponse:
    """Every answer that is not ours already gets the API's error body."""
    return await answered(request, request.app[EDGE], handler)


async def answered(request: web.Request, edge: Edge, handler: RequestHandler) -> web.StreamResponse:
    """The handler's answer, or the API's error body for what it raised, sent here
    (``deliver``): errors_middleware's work, also done for the RPCs the server hands
    straight to their handlers (``direct_rpc_handler``)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _STATUS_CODES.get(exc.status, errors.UNKNOWN_SERVER_ERROR)
        response = error_response(
            exc.status, code, _describe_http_error(request, exc), answer_format(request)
        )
        allow = exc.headers.get("Allow")
        if allow is not None:  # a 405 must say what is allowed (RFC 9110 §15.5.6)
            response.headers["Allow"] = allow
    except asyncio.CancelledError:
        raise
    except Exception:
        _log.exception("unhandled error serving %s %s", request.method, request.path)
        response = error_response(
            500,
            errors.UNKNOWN_SERVER_ERROR,
            errors.UnknownServerError.default_message or "",
            answer_format(request),
        )
    if response.status >= 400:
        edge.node.metrics.http_errors.labels(response.status).inc()
    await deliver(request, response, edge.node.config.request_timeout_s)
    return response


# An answer this small goes into an empty socket buffer without waiting (aiohttp's
# writer only waits for a drain past 64 KiB), so it needs no deadline.
_SENT_AT_ONCE = 16 * 1024


async def deliver(request: web.Request, response: web.StreamResponse, timeout: float) -> None:
    """Send the answer here, within the request timeout. aiohttp would send it after the
    middlewares with no deadline at all: a client that never reads (its receive window
    full, the answer stuck in our send buffer) would hold the handler, the connection
    and the answer's memory forever. Such a client is cut off; aiohttp sends nothing
    more for an answer already sent.

    Most answers are small and find the connection's buffer empty: sent at once, they
    cannot wait, and skip the deadline's task (the largest cost of a small request)."""
    transport = request.transport
    length = response.content_length
    if (
        transport is not None
        and length is not None
        and length <= _SENT_AT_ONCE
        and transport.get_write_buffer_size() == 0
    ):
        with contextlib.suppress(ConnectionError):  # the client went away
            await _send(request, response)
        return
    try:
        await asyncio.wait_for(_send(request, response), timeout)
    except asyncio.TimeoutError:
        _log.info(
            "%s %s: the client did not take its answer within %g seconds; cut off",
            request.method,
            request.path,
            timeout,
        )
        transport = request.transport
        if transport is not None:
            transport.abort()
    except ConnectionError:
        pass  # the client went away; aiohttp notices on its own


async def _send(request: web.Request, response: web.StreamResponse) -> None:
    await response.prepare(request)
    await response.write_eof()


def _describe_http_error(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such endpoint: {request.method} {request.path} (see docs/api.md)"
    if exc.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    return exc.reason


class HTTPError(Exception):
    """An answer given before the handler's work (a body refused: 408, 413, 415),
    raised from where it is found and answered by ``handles_http_errors``."""

    def __init__(self, status: int, code: int, message: str, fmt: Format) -> None:
        super().__init__(message)
        self.response = error_response(status, code, message, fmt)


def handles_http_errors(handler: RequestHandler) -> RequestHandler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPError as exc:
            return exc.response

    wrapped.__name__ = handler.__name__
    return wrapped


def service_error(exc: ServiceError, fmt: Format) -> web.Response:
    """The answer to an admin operation the service refused, with its Kafka code."""
    status = {
        errors.UNKNOWN_TOPIC_OR_PARTITION: 404,
        errors.NOT_COORDINATOR: 421,
        errors.COORDINATOR_LOAD_IN_PROGRESS: 503,
        errors.COORDINATOR_NOT_AVAILABLE: 503,
    }.get(exc.code, 500)
    return error_response(status, exc.code, exc.message, fmt)
