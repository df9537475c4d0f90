"""The HTTP app over a node (docs/api.md): the route table, the middlewares, and the
direct route of the five RPCs past the router."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from protocol.messages import (
    REQUEST_PARTITIONS,
    Acknowledged,
    AdminState,
    AnyPartitionResult,
    ClusterStatus,
    CompactionCommitted,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    Health,
    PartitionResult,
    PartitionStatuses,
    ReadPartitionResult,
    ReadSummaryPartitionResult,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicDeleted,
    TopicRegistration,
)
from protocol.widths import GroupId, Int32, TopicIdText
from server.http.access_log import access_log_level, access_log_middleware
from server.http.auth import auth_middleware, unauthorized
from server.http.connection import ServerHandler
from server.http.edge import EDGE, Edge, RequestHandler, answered, deliver, errors_middleware
from server.http.handlers import (
    ReadinessReport,
    handle_admin_state,
    handle_cluster,
    handle_commit_compaction,
    handle_delete_topic,
    handle_find_coordinator,
    handle_healthz,
    handle_metrics,
    handle_partitions,
    handle_readyz,
    handle_register_topic,
    rpc_handler,
)
from server.http.routes import Answer, Param, Route
from server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from server.node import Node

# path -> handler of the five share-group-state RPCs, as create_app registered them
RPC_HANDLERS = web.AppKey("rpc_handlers", dict[str, RequestHandler])


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
            refusal = unauthorized(request, edge)
            if refusal is not None:
                edge.node.metrics.http_errors.labels(refusal.status).inc()
                await deliver(request, refusal, edge.node.config.request_timeout_s)
                return refusal
        return await answered(request, edge, handler)

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
        "/v1/admin/cluster",
        handle_cluster,
        operation_id="getCluster",
        summary="On the PostgreSQL store: every state partition's leader, epoch and lease, "
        "and every node's listeners and last heartbeat (docs/api.md#admin-endpoints).",
        answers=(
            Answer(
                200,
                "The leaders and nodes tables, partitions without a live leader first.",
                ClusterStatus,
            ),
        ),
        refusals=(409, 503),
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
            handler = app[RPC_HANDLERS][route.path] = rpc_handler(route.handler, edge)
        else:
            handler = route.handler
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # and HEAD, as openapi.yaml says
        else:
            app.router.add_route(route.method, route.path, handler)
    return app
