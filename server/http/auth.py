"""The bearer token check (docs/api.md#security): every ``/v1/`` request carries
``Authorization: Bearer <token>`` when the daemon has ``--auth-token-file``; the others
are answered 401 before their body is read."""

from __future__ import annotations

from aiohttp import web

from protocol import errors
from protocol.messages import Rpc
from server.http.edge import EDGE, Edge, RequestHandler, answer_format, error_response
from server.security import check_bearer

# The five RPCs' paths, by the name their metrics carry: a refusal is counted as theirs.
RPC_PATHS = {f"/v1/share-group-state/{rpc.value}": rpc.value for rpc in Rpc}


@web.middleware
async def auth_middleware(request: web.Request, handler: RequestHandler) -> web.StreamResponse:
    refusal = unauthorized(request, request.app[EDGE])
    if refusal is not None:
        return refusal
    return await handler(request)


def unauthorized(request: web.Request, edge: Edge) -> web.Response | None:
    """The 401 for a /v1/ request without the right bearer token, or None."""
    token = edge.token
    if (
        token is None
        or not request.path.startswith("/v1/")
        or check_bearer(request.headers.get("Authorization"), token)
    ):
        return None
    rpc_name = RPC_PATHS.get(request.path)
    if rpc_name is not None:
        edge.node.metrics.rpc_requests.labels(rpc_name, errors.CLUSTER_AUTHORIZATION_FAILED).inc()
    return error_response(
        401,
        errors.CLUSTER_AUTHORIZATION_FAILED,
        errors.ClusterAuthorizationFailed.default_message or "",
        answer_format(request),
    )
