"""The handlers of the HTTP API's routes (docs/api.md): the five RPCs, find-coordinator,
the admin routes, health, readiness and metrics. Each reads its request, asks the node
and encodes the answer in the format the request asked for."""

from __future__ import annotations

import functools
import re
import time
import urllib.parse
from typing import Any

import msgspec
from aiohttp import web

from persistence.errors import StoreUnavailableError
from protocol import codec, errors
from protocol.codec import BodyError
from protocol.explain import text_problem
from protocol.messages import (
    Acknowledged,
    CompactionCommitted,
    PartitionStatuses,
    Readiness,
    Rpc,
    TopicDeleted,
)
from protocol.records import ShareKey
from protocol.topic_id import canonical_topic_id
from server.cluster_status import cluster_status
from server.http.bodies import read_body
from server.http.edge import (
    CONTENT_TYPES,
    EDGE,
    Edge,
    HTTPError,
    RequestHandler,
    accept_format,
    error_response,
    handles_http_errors,
    respond,
    service_error,
)
from server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from server.offload import OFFLOAD_BODY_BYTES
from server.service import ServiceError


def rpc_handler(rpc: Rpc, edge: Edge) -> RequestHandler:
    """The handler of one of the five RPCs (docs/api.md#requests)."""
    name = rpc.value
    node = edge.node
    # The metric children this route touches, looked up once.
    metrics = node.metrics
    answered = metrics.rpc_requests.labels(name, "ok")
    refused = metrics.rpc_requests.labels(name, errors.INVALID_REQUEST)
    latency = metrics.rpc_latency.labels(name)
    limits = node.limits

    @handles_http_errors
    async def handle_rpc(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            body, fmt, out = await read_body(request, edge)
        except HTTPError:  # 413 / 415: refused bodies, as a 400 is
            refused.inc()
            raise
        try:
            if len(body) > OFFLOAD_BODY_BYTES:
                decoded = await node.offload(
                    functools.partial(codec.decode_request, rpc, body, fmt, limits)
                )
            else:
                decoded = codec.decode_request(rpc, body, fmt, limits)
        except BodyError as exc:
            refused.inc()
            return error_response(400, errors.INVALID_REQUEST, str(exc), out)
        response = await node.service.handle(rpc, decoded)
        encoded = codec.encode_response(response, out)
        answered.inc()
        latency.observe(time.perf_counter() - started)
        return web.Response(body=encoded, content_type=CONTENT_TYPES[out])

    handle_rpc.__name__ = f"handle_{rpc.name.lower()}"
    return handle_rpc


@handles_http_errors
async def handle_find_coordinator(request: web.Request) -> web.StreamResponse:
    edge = request.app[EDGE]
    body, fmt, out = await read_body(request, edge)
    try:
        decoded = codec.decode_find_coordinator(body, fmt, edge.node.limits)
    except BodyError as exc:
        return error_response(400, errors.INVALID_REQUEST, str(exc), out)
    response = await edge.node.service.find_coordinator(decoded)
    return respond(codec.encode_find_coordinator_response(response, out), out)


async def handle_admin_state(request: web.Request) -> web.StreamResponse:
    fmt = accept_format(request)
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
        return service_error(exc, fmt)
    if state is None:
        return error_response(
            404,
            errors.UNKNOWN_TOPIC_OR_PARTITION,
            f"no state for group {group_id!r}, topic {spelled}, partition {partition}",
            fmt,
        )
    return respond(
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


@handles_http_errors
async def handle_register_topic(request: web.Request) -> web.StreamResponse:
    body, fmt, out = await read_body(request, request.app[EDGE])
    try:
        _, topic_id, partition_count = codec.decode_topic_registration(body, fmt)
    except BodyError as exc:
        return error_response(400, errors.INVALID_REQUEST, str(exc), out)
    refused = _no_catalog_here(request, out)
    if refused is not None:
        return refused
    service = request.app[EDGE].node.service
    try:
        await service.register_topic(topic_id, partition_count)
    except ServiceError as exc:
        return service_error(exc, out)
    return respond(codec.encode(Acknowledged(0), out), out)


async def handle_delete_topic(request: web.Request) -> web.StreamResponse:
    fmt = accept_format(request)
    try:
        topic_id = canonical_topic_id(request.match_info["topic_id"])
    except ValueError as exc:
        return error_response(400, errors.INVALID_REQUEST, f"topic_id: {exc}", fmt)
    refused = _no_catalog_here(request, fmt)
    if refused is not None:
        return refused
    service = request.app[EDGE].node.service
    try:
        deleted = await service.delete_topic(topic_id)
    except ServiceError as exc:
        return service_error(exc, fmt)
    return respond(codec.encode(TopicDeleted(0, deleted), fmt), fmt)


def _no_catalog_here(request: web.Request, fmt: codec.Format) -> web.Response | None:
    """The topic catalog is a file of the data directory: a node on the PostgreSQL
    store keeps none (its nodes would each hold a different one), so it refuses to
    change it rather than write a file no other node reads. Asked after the request
    is read: a malformed one is a 400 on either store."""
    if request.app[EDGE].node.leadership is None:
        return None
    return error_response(
        409,
        errors.INVALID_REQUEST,
        "the topic catalog is kept in the data directory only: a node on the PostgreSQL "
        "store keeps none yet, so topics are neither registered nor deleted here",
        fmt,
    )


async def handle_commit_compaction(request: web.Request) -> web.StreamResponse:
    fmt = accept_format(request)
    committed, stale = await request.app[EDGE].node.service.commit_compaction()
    return respond(codec.encode(CompactionCommitted(committed, stale), fmt), fmt)


async def handle_partitions(request: web.Request) -> web.StreamResponse:
    fmt = accept_format(request)
    service = request.app[EDGE].node.service
    return respond(codec.encode(PartitionStatuses(service.partition_statuses()), fmt), fmt)


async def handle_cluster(request: web.Request) -> web.StreamResponse:
    fmt = accept_format(request)
    leadership = request.app[EDGE].node.leadership
    if leadership is None:
        return error_response(
            409,
            errors.INVALID_REQUEST,
            "this node runs on its data directory: its cluster file (or none) assigns the "
            "state partitions, with no leases and no heartbeats to show; GET "
            "/v1/admin/partitions shows what it owns",
            fmt,
        )
    try:
        view = await leadership.view()
    except (StoreUnavailableError, OSError) as exc:
        return error_response(
            503,
            errors.COORDINATOR_NOT_AVAILABLE,
            f"the state store cannot be asked who leads: {exc}",
            fmt,
        )
    status = cluster_status(view.leases, view.nodes, leadership.lease_ms)
    return respond(codec.encode(status, fmt), fmt)


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
