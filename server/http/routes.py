"""What a route of the HTTP API is: the shape of the one table (``server.http.app.ROUTES``)
that ``create_app`` registers and ``server.http.openapi`` documents, so the two cannot drift.

Bodies, answers and parameters are named by their msgspec declarations
(``protocol.messages``, ``protocol.widths``): the OpenAPI schemas are generated from the
same types the decoders use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from protocol.messages import Rpc

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Answer:
    """An answer a route gives with a body of its own (not the shared error body)."""

    status: int
    description: str
    body: Any  # the declaration of the JSON body (or ``str`` for text)
    media_type: str = "application/json"


@dataclass(frozen=True)
class Param:
    """A query or path parameter, checked by the handler as its declaration says."""

    name: str
    declared: Any
    where: Literal["query", "path"] = "query"


@dataclass(frozen=True)
class Route:
    """One method on one path.

    ``handler`` is an ``Rpc`` for the share-group state RPCs: their handlers are built
    per app, binding their metric children once. A GET also answers HEAD (aiohttp's
    automatic route). ``refusals`` are the statuses the handler answers with the error
    body; those every route shares (417 from aiohttp, 401 on ``/v1/``, 400, 408, 413
    and 415 where a body is read) are added by ``server.http.openapi``.
    """

    method: Literal["GET", "POST", "PUT", "DELETE"]
    path: str
    handler: Handler | Rpc
    operation_id: str
    summary: str
    answers: tuple[Answer, ...]
    body: Any = None  # the declaration of the JSON body the handler reads, if it reads one
    params: tuple[Param, ...] = ()
    refusals: tuple[int, ...] = ()
