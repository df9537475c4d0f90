"""The HTTP edge (docs/api.md): aiohttp handlers and middlewares over a ``server.node.Node``.

Bodies are decoded here (``protocol.codec``): a malformed body stops at this edge with
400 / INVALID_REQUEST naming the field, and nothing reaches the state. Every non-200
answer carries ``{"error_code", "error_message"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import StreamReader, web

from protocol import codec, errors
from protocol.codec import BodyError, Format
from protocol.explain import text_problem
from protocol.messages import (
    REQUEST_PARTITIONS,
    Acknowledged,
    AdminState,
    AnyPartitionResult,
    CompactionCommitted,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    Health,
    PartitionResult,
    PartitionStatuses,
    Readiness,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicDeleted,
    TopicRegistration,
)
from protocol.records import ShareKey
from protocol.topic_id import canonical_topic_id
from protocol.widths import GroupId, Int32, TopicIdText
from server.http.access_log import access_log_level, access_log_middleware
from server.http.connection import ServerHandler
from server.http.routes import Answer, Param, Route
from server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from server.node import Node
from server.offload import OFFLOAD_BODY_BYTES
from server.security import check_bearer
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
# path -> handler of the five share-group-state RPCs, as create_app registered them
RPC_HANDLERS = web.AppKey("rpc_handlers", dict[str, RequestHandler])


# --- responses ------------------------------------------------------------------------


def _respond(body: bytes, fmt: Format, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=CONTENT_TYPES[fmt])


def error_response(status: int, code: int, message: str, fmt: Format = Format.JSON) -> web.Response:
    return _respond(codec.encode_error(code, message, fmt), fmt, status)


def _accept_format(request: web.Request) -> Format:
    """Format for requests without a body (GET/DELETE): JSON unless Accept asks msgpack."""
    return codec.response_format("application/json", request.headers.get("Accept"))


def _answer_format(request: web.Request) -> Format:
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
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every answer that is not ours already gets the API's error body."""
    return await _answered(request, request.app[EDGE], handler)


async def _answered(
    request: web.Request,
    edge: Edge,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """The handler's answer, or the API's error body for what it raised, sent here
    (``_deliver``): errors_middleware's work, also done for the RPCs the server hands
    straight to their handlers (``direct_rpc_handler``)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _STATUS_CODES.get(exc.status, errors.UNKNOWN_SERVER_ERROR)
        response = error_response(
            exc.status, code, _describe_http_error(request, exc), _answer_format(request)
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
            _answer_format(request),
        )
    if response.status >= 400:
        edge.node.metrics.http_errors.labels(response.status).inc()
    await _deliver(request, response, edge.node.config.request_timeout_s)
    return response


# An answer this small goes into an empty socket buffer without waiting (aiohttp's
# writer only waits for a drain past 64 KiB), so it needs no deadline.
_SENT_AT_ONCE = 16 * 1024


async def _deliver(request: web.Request, response: web.StreamResponse, timeout: float) -> None:
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


@web.middleware
async def auth_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    refusal = _unauthorized(request, request.app[EDGE])
    if refusal is not None:
        return refusal
    return await handler(request)


def _unauthorized(request: web.Request, edge: Edge) -> web.Response | None:
    """The 401 for a /v1/ request without the right bearer token, or None."""
    token = edge.token
    if (
        token is None
        or not request.path.startswith("/v1/")
        or check_bearer(request.headers.get("Authorization"), token)
    ):
        return None
    rpc_name = _RPC_PATHS.get(request.path)
    if rpc_name is not None:
        edge.node.metrics.rpc_requests.labels(rpc_name, errors.CLUSTER_AUTHORIZATION_FAILED).inc()
    return error_response(
        401,
        errors.CLUSTER_AUTHORIZATION_FAILED,
        errors.ClusterAuthorizationFailed.default_message or "",
        _answer_format(request),
    )


# --- request bodies -------------------------------------------------------------------


async def _read_body(
    request: web.Request, edge: Edge
) -> tuple[bytes, Format, Format]:
    """The body and its format, and the answer's format; 415 / 413 as docs/api.md says."""
    config = edge.node.config
    content_type = request.headers.get("Content-Type")
    fmt = codec.format_of(content_type)
    if fmt is None:
        raise _HTTPError(
            415,
            errors.INVALID_REQUEST,
            f"unsupported Content-Type {content_type!r}: use application/msgpack or "
            "application/json",
            _answer_format(request),
        )
    out = codec.response_format(content_type, request.headers.get("Accept"))
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in ("", "identity"):
        raise _HTTPError(
            415,
            errors.INVALID_REQUEST,
            f"unsupported Content-Encoding {coding!r}: send the body uncompressed",
            out,
        )
    limit = config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _HTTPError(413, errors.INVALID_REQUEST, _too_large(limit), out)
    timeout = config.request_timeout_s
    try:
        if request.content.is_eof():
            body = await request.read()  # all there already: no deadline needed
        else:
            body = await _read_the_rest(request, edge, timeout)
    except web.HTTPRequestEntityTooLarge:
        raise _HTTPError(413, errors.INVALID_REQUEST, _too_large(limit), out) from None
    except web.RequestPayloadError as exc:
        # A body aiohttp could not read (broken chunking): the client's mistake, not a
        # bug (no 500, no trace).
        error = _HTTPError(
            400,
            errors.INVALID_REQUEST,
            f"the request body could not be read: {_one_line(str(exc))}",
            out,
        )
        error.response.force_close()
        # What follows in the connection is never read: say so, or aiohttp's lingering
        # read after the answer trips over the same error and logs it as unhandled.
        request.content.feed_eof()
        raise error from None
    except ConnectionError:
        # The client closed the connection before its body arrived: nobody is left to
        # answer, and it is no bug either.
        _log.debug("%s %s: the connection closed mid-body", request.method, request.path)
        error = _HTTPError(
            400, errors.INVALID_REQUEST, "the connection closed before the body arrived", out
        )
        error.response.force_close()
        raise error from None
    except asyncio.TimeoutError:  # not yet the builtin TimeoutError on Python 3.10
        error = _HTTPError(
            408,
            errors.INVALID_REQUEST,
            f"the request body did not arrive within {timeout:g} seconds (--request-timeout-s)",
            out,
        )
        error.response.force_close()  # what is left of the body is never read
        # Nor waited for: aiohttp would linger up to 10 s more reading it.
        request.content.feed_eof()
        raise error from None
    return body, fmt, out


async def _read_the_rest(request: web.Request, edge: Edge, timeout: float) -> bytes:
    """A body still arriving: within the request timeout (a client that stops sending
    must not hold the connection and this handler forever; aiohttp itself only times out
    idle keep-alive connections), and not past SIGTERM (``stop_reading_bodies``)."""
    if edge.stopped_reading:
        raise asyncio.CancelledError()  # as stop_reading_bodies cuts those it found
    reading = edge.reading_bodies
    reading.add(request.content)
    try:
        return await asyncio.wait_for(request.read(), timeout)
    finally:
        reading.discard(request.content)


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[:limit] + "..."


def _too_large(limit: int) -> str:
    return f"the request body exceeds the limit of {limit} bytes (--max-body-bytes)"


class _HTTPError(Exception):
    def __init__(self, status: int, code: int, message: str, fmt: Format) -> None:
        super().__init__(message)
        self.response = error_response(status, code, message, fmt)


def _handles_http_errors(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except _HTTPError as exc:
            return exc.response

    wrapped.__name__ = handler.__name__
    return wrapped


def _service_error(exc: ServiceError, fmt: Format) -> web.Response:
    status = {
        errors.UNKNOWN_TOPIC_OR_PARTITION: 404,
        errors.NOT_COORDINATOR: 421,
        errors.COORDINATOR_LOAD_IN_PROGRESS: 503,
        errors.COORDINATOR_NOT_AVAILABLE: 503,
    }.get(exc.code, 500)
    return error_response(status, exc.code, exc.message, fmt)


# --- handlers -------------------------------------------------------------------------


_RPC_PATHS = {f"/v1/share-group-state/{rpc.value}": rpc.value for rpc in Rpc}


def _rpc_handler(
    rpc: Rpc, edge: Edge
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    name = rpc.value
    # The metric children this route touches, looked up once.
    metrics = edge.node.metrics
    answered = metrics.rpc_requests.labels(name, "ok")
    refused = metrics.rpc_requests.labels(name, errors.INVALID_REQUEST)
    latency = metrics.rpc_latency.labels(name)
    limits = edge.node.limits

    @_handles_http_errors
    async def handle_rpc(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            body, fmt, out = await _read_body(request, edge)
        except _HTTPError:  # 413 / 415: refused bodies, as a 400 is
            refused.inc()
            raise
        try:
            if len(body) > OFFLOAD_BODY_BYTES:
                decoded = await edge.node.offload(
                    functools.partial(codec.decode_request, rpc, body, fmt, limits)
                )
            else:
                decoded = codec.decode_request(rpc, body, fmt, limits)
        except BodyError as exc:
            refused.inc()
            return error_response(400, errors.INVALID_REQUEST, str(exc), out)
        response = await edge.node.service.handle(rpc, decoded)
        encoded = codec.encode_response(response, out)
        answered.inc()
        latency.observe(time.perf_counter() - started)
        return web.Response(body=encoded, content_type=CONTENT_TYPES[out])

    handle_rpc.__name__ = f"handle_{rpc.name.lower()}"
    return handle_rpc


@_handles_http_errors
async def handle_find_coordinator(request: web.Request) -> web.StreamResponse:
    edge = request.app[EDGE]
    body, fmt, out = await _read_body(request, edge)
    try:
        decoded = codec.decode_find_coordinator(body, fmt, edge.node.limits)
    except BodyError as exc:
        return error_response(400, errors.INVALID_REQUEST, str(exc), out)
    response = edge.node.service.find_coordinator(decoded)
    return _respond(codec.encode_find_coordinator_response(response, out), out)


async def handle_admin_state(request: web.Request) -> web.StreamResponse:
    fmt = _accept_format(request)
    query = request.query
    edge = request.app[EDGE]
    try:
        group_id = _query_group_id(request, edge.node.limits)
        spelled = _query_str(query, "topic_id")
        topic_id = _query_topic_id(spelled)
        partition = _query_int32(query, "partition")
    except ValueError as exc:
        return error_response(400, errors.INVALID_REQUEST, str(exc), fmt)
    service = edge.node.service
    try:
        state = await service.admin_state(ShareKey(group_id, topic_id, partition))
    except ServiceError as exc:
        return _service_error(exc, fmt)
    if state is None:
        return error_response(
            404,
            errors.UNKNOWN_TOPIC_OR_PARTITION,
            f"no state for group {group_id!r}, topic {spelled}, partition {partition}",
            fmt,
        )
    return _respond(
        codec.encode_admin_state(msgspec.structs.replace(state, topic_id=spelled), fmt), fmt
    )


_DECIMAL = re.compile(r"-?[0-9]+")


def _query_topic_id(spelled: str) -> str:
    try:
        return canonical_topic_id(spelled)
    except ValueError as exc:
        raise ValueError(f"query parameter topic_id: {exc}, got {spelled!r}") from None


def _query_group_id(request: web.Request, limits: codec.Limits) -> str:
    group_id = _query_str(request.query, "group_id")
    if "\ufffd" in group_id:
        # What aiohttp made of bytes that are not UTF-8 (or a U+FFFD the client sent):
        # the group id it names is not the one the client had, so it is refused.
        _refuse_undecodable(request.rel_url.raw_query_string, "group_id")
    try:
        codec.check_group_id(group_id, limits)
    except BodyError as exc:
        raise ValueError(f"query parameter {exc}") from None
    return group_id


def _refuse_undecodable(raw_query: str, name: str) -> None:
    """``ValueError`` if the first value of ``name`` in the query, percent-decoded, is
    not UTF-8."""
    for key, value in urllib.parse.parse_qsl(
        raw_query, keep_blank_values=True, errors="surrogateescape"
    ):
        if key == name:
            problem = text_problem(value, marked=True)
            if problem is not None:
                raise ValueError(f"query parameter {name}: {problem}")
            return


def _query_str(query: Any, name: str) -> str:
    value = query.get(name)
    if value is None or value == "":
        raise ValueError(f"query parameter {name} is required")
    return str(value)


def _query_int32(query: Any, name: str) -> int:
    text = _query_str(query, name)
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"query parameter {name} must be an integer, got {text!r}")
    value = int(text)
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"query parameter {name} is out of int32 range")
    return value


@_handles_http_errors
async def handle_register_topic(request: web.Request) -> web.StreamResponse:
    body, fmt, out = await _read_body(request, request.app[EDGE])
    try:
        _, topic_id, partition_count = codec.decode_topic_registration(body, fmt)
    except BodyError as exc:
        return error_response(400, errors.INVALID_REQUEST, str(exc), out)
    service = request.app[EDGE].node.service
    try:
        await service.register_topic(topic_id, partition_count)
    except ServiceError as exc:
        return _service_error(exc, out)
    return _respond(codec.encode(Acknowledged(0), out), out)


async def handle_delete_topic(request: web.Request) -> web.StreamResponse:
    fmt = _accept_format(request)
    try:
        topic_id = canonical_topic_id(request.match_info["topic_id"])
    except ValueError as exc:
        return error_response(400, errors.INVALID_REQUEST, f"topic_id: {exc}", fmt)
    service = request.app[EDGE].node.service
    try:
        deleted = await service.delete_topic(topic_id)
    except ServiceError as exc:
        return _service_error(exc, fmt)
    return _respond(codec.encode(TopicDeleted(0, deleted), fmt), fmt)


async def handle_commit_compaction(request: web.Request) -> web.StreamResponse:
    fmt = _accept_format(request)
    committed, stale = await request.app[EDGE].node.service.commit_compaction()
    return _respond(codec.encode(CompactionCommitted(committed, stale), fmt), fmt)


async def handle_partitions(request: web.Request) -> web.StreamResponse:
    fmt = _accept_format(request)
    service = request.app[EDGE].node.service
    return _respond(codec.encode(PartitionStatuses(service.partition_statuses()), fmt), fmt)


async def handle_healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


class FailedPartition(msgspec.Struct):
    partition: int
    error: str


class ReadinessReport(Readiness):
    """``GET /readyz``, with why each failed partition failed (a partition this node
    may not serve from its data directory says so here too)."""

    failures: list[FailedPartition] = msgspec.field(default_factory=list)


async def handle_readyz(request: web.Request) -> web.StreamResponse:
    node = request.app[EDGE].node
    loading = node.loading()
    failures = node.failures()
    report = ReadinessReport(
        "loading" if loading else "ready",
        [partition for partition, _ in failures],
        [FailedPartition(partition, error) for partition, error in failures],
    )
    return web.Response(
        body=msgspec.json.encode(report),
        status=503 if loading else 200,
        content_type="application/json",
    )


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    text = request.app[EDGE].node.metrics.render()
    return web.Response(body=text.encode("utf-8"), headers={"Content-Type": METRICS_CONTENT_TYPE})


def direct_rpc_handler(app: web.Application, through_app: ServerHandler) -> ServerHandler:
    """The server's request handler: a POST to one of the five RPCs goes straight to its
    handler, with what the middlewares would do around it (the bearer check, the error
    body, the deadline on the answer); every other request goes `through_app` (router
    and middlewares). The router's lookup and the middleware chain cost about a tenth
    of a small write's CPU (bench.ceiling against a bare aiohttp server), for routes
    that are fixed. With the access log on, everything goes through the app, so that
    every request is logged."""
    edge = app[EDGE]
    if access_log_level(edge.node.config) is not None:
        return through_app
    handlers = app[RPC_HANDLERS]
    checks_token = edge.token is not None

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        handler = handlers.get(request.path) if request.method == "POST" else None
        # Expect: 100-continue is the app's to answer (aiohttp does it in its router).
        if handler is None or "Expect" in request.headers:
            return await through_app(request)
        assert isinstance(request, web.Request)  # the app's request factory made it
        if checks_token:
            refusal = _unauthorized(request, edge)
            if refusal is not None:
                edge.node.metrics.http_errors.labels(refusal.status).inc()
                await _deliver(request, refusal, edge.node.config.request_timeout_s)
                return refusal
        return await _answered(request, edge, handler)

    return handle


# --- routes ---------------------------------------------------------------------------
# What create_app registers is what server.http.openapi documents: one table.


def _rpc_route(rpc: Rpc, kafka_name: str, result: type[AnyPartitionResult]) -> Route:
    # The generics are subscripted with values here, which typing cannot follow.
    request: Any = ShareGroupStateRequest
    response: Any = ShareGroupStateResponse
    return Route(
        "POST",
        f"/v1/share-group-state/{rpc.value}",
        rpc,
        operation_id=kafka_name[0].lower() + kafka_name[1:],
        summary=f"{kafka_name} (Kafka apiKey {rpc.api_key})",
        body=request[REQUEST_PARTITIONS[rpc]],
        answers=(
            Answer(200, "One result per partition entry, in request order.", response[result]),
        ),
    )


_KEY_PARAMS = (
    Param("group_id", GroupId),
    Param("topic_id", TopicIdText),
    Param("partition", Int32),
)

ROUTES: tuple[Route, ...] = (
    _rpc_route(Rpc.INITIALIZE, "InitializeShareGroupState", PartitionResult),
    _rpc_route(Rpc.READ, "ReadShareGroupState", ReadPartitionResult),
    _rpc_route(Rpc.WRITE, "WriteShareGroupState", PartitionResult),
    _rpc_route(Rpc.DELETE, "DeleteShareGroupState", PartitionResult),
    _rpc_route(Rpc.READ_SUMMARY, "ReadShareGroupStateSummary", ReadSummaryPartitionResult),
    Route(
        "POST",
        "/v1/find-coordinator",
        handle_find_coordinator,
        operation_id="findCoordinator",
        summary="The node owning each coordinator key `group:topicId:partition`.",
        body=FindCoordinatorRequest,
        answers=(
            Answer(
                200,
                "One entry per key, in request order; a key that does not parse gets 42.",
                FindCoordinatorResponse,
            ),
        ),
    ),
    Route(
        "GET",
        "/v1/admin/state",
        handle_admin_state,
        operation_id="getAdminState",
        summary="The stored state of one share-partition (docs/semantics.md §A.1 point 10).",
        params=_KEY_PARAMS,
        answers=(Answer(200, "The stored state, with the fencing maxima.", AdminState),),
        refusals=(400, 404, 421, 503),
    ),
    Route(
        "PUT",
        "/v1/admin/topics",
        handle_register_topic,
        operation_id="registerTopic",
        summary="Register a topic in the topic catalog, or change its partition count "
        "(docs/semantics.md §A).",
        body=TopicRegistration,
        answers=(Answer(200, "Registered.", Acknowledged),),
        refusals=(503,),
    ),
    Route(
        "DELETE",
        "/v1/admin/topics/{topic_id}",
        handle_delete_topic,
        operation_id="deleteTopic",
        summary="Drop a topic from the catalog and tombstone its share-partition state on "
        "this node.",
        params=(Param("topic_id", TopicIdText, "path"),),
        answers=(Answer(200, "Deleted.", TopicDeleted),),
        refusals=(400, 404, 503),
    ),
    Route(
        "POST",
        "/v1/admin/compaction/commit",
        handle_commit_compaction,
        operation_id="commitCompaction",
        summary="Swap staged compaction output in now (docs/design.md); any body is ignored.",
        answers=(
            Answer(
                200,
                'What was committed, and what was stale, as "partition/base".',
                CompactionCommitted,
            ),
        ),
    ),
    Route(
        "GET",
        "/v1/admin/partitions",
        handle_partitions,
        operation_id="listPartitions",
        summary="The status of every state partition this node owns.",
        answers=(Answer(200, "One entry per owned state partition.", PartitionStatuses),),
    ),
    Route(
        "GET",
        "/healthz",
        handle_healthz,
        operation_id="healthz",
        summary="Liveness: 200 while the process serves HTTP.",
        answers=(Answer(200, "Alive.", Health),),
    ),
    Route(
        "GET",
        "/readyz",
        handle_readyz,
        operation_id="readyz",
        summary="Readiness: 503 while a state partition this node owns is loading, then 200.",
        answers=(
            Answer(
                200,
                "Ready; failed partitions (they answer 15) are listed, with why.",
                ReadinessReport,
            ),
            Answer(503, "Still loading.", ReadinessReport),
        ),
    ),
    Route(
        "GET",
        "/metrics",
        handle_metrics,
        operation_id="metrics",
        summary="The metrics, in Prometheus text format.",
        answers=(Answer(200, "The metrics.", str, METRICS_CONTENT_TYPE.split(";")[0]),),
    ),
)


def create_app(node: Node, *, token: bytes | None = None) -> web.Application:
    """The app serving ``node``: the routes, the middlewares (the access log, the error
    body, the bearer check when there is a ``token``). The node's lifecycle is not the
    app's: whoever serves the app starts the node before and stops it after."""
    config = node.config
    edge = Edge(node, token)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        # The bearer check runs only when there is a token to check.
        middlewares=[errors_middleware, auth_middleware] if token else [errors_middleware],
        # Bodies come uncompressed (docs/api.md); a Content-Encoding is refused (415), and
        # aiohttp must not try to decompress what nobody reads (it logs the failure of
        # an unread body it lingers over as an unhandled exception, with a trace).
        handler_args={"auto_decompress": False},
    )
    app[EDGE] = edge
    # The access log (server/http/access_log.py): first in the chain, absent when off.
    if (access_log := access_log_middleware(config)) is not None:
        app.middlewares.insert(0, access_log)
    app[RPC_HANDLERS] = {}
    for route in ROUTES:
        if isinstance(route.handler, Rpc):
            handler = app[RPC_HANDLERS][route.path] = _rpc_handler(route.handler, edge)
        else:
            handler = route.handler
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # and HEAD, as openapi.yaml says
        else:
            app.router.add_route(route.method, route.path, handler)
    return app
