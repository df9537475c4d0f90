"""The access log: one line per request, at info with ``--access-log``, else at debug.

Each line carries ``method``, ``path``, ``status``, ``duration_ms`` (from the request
reaching the app to its answer sent), and for the share-group-state RPCs ``entries``:
the partition entries answered (``null`` when the body was refused before any entry was
read).

The middleware is installed only when its lines would be printed (``--access-log``
at info or debug, or ``--log-level debug``); otherwise nothing of it runs per request.
It goes first in the app's chain, so it also sees the answers the other middlewares
give on their own (401, 404, 413).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol.messages import Rpc
from server.config import ServeConfig
from server.logs import log_event

LOGGER_NAME = "sharecoord.access"
_log = logging.getLogger(LOGGER_NAME)
RPC_PATHS = frozenset(f"/v1/share-group-state/{rpc.value}" for rpc in Rpc)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def access_log_level(config: ServeConfig) -> int | None:
    """The level access lines are logged at, or None when they would not be printed."""
    if config.access_log and config.log_level in ("debug", "info"):
        return logging.INFO
    if config.log_level == "debug":
        return logging.DEBUG
    return None


def access_log_middleware(config: ServeConfig) -> Middleware | None:
    """The middleware for ``create_app``, or None: then it is not installed at all."""
    level = access_log_level(config)
    if level is None:
        return None

    @web.middleware
    async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        response: web.StreamResponse | None = None
        status: int | None = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:  # what no inner middleware turned into an answer
            status = exc.status
            raise
        except asyncio.CancelledError:
            raise  # the client went away or the server stopped: no status was sent
        except Exception:
            status = 500
            raise
        finally:
            fields: dict[str, Any] = {
                "method": request.method,
                "path": request.path,
                "status": status,
            }
            if request.path in RPC_PATHS:
                fields["entries"] = (
                    answered_entries(response) if response is not None and status == 200 else None
                )
            fields["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
            log_event(_log, level, "request", **fields)

    return access_log


def answered_entries(response: web.StreamResponse) -> int | None:
    """The partition entries of an RPC's answer (one result per entry of the request):
    counted in the encoded body, which msgpack walks without building its objects."""
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        return None
    body = response.body
    try:
        if response.content_type == "application/msgpack":
            return _msgpack_entries(body)
        document = json.loads(body)
        return sum(len(topic["partitions"]) for topic in document["results"])
    except (ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None


def _msgpack_entries(body: bytes) -> int:
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    count = 0
    for _ in range(unpacker.read_map_header()):
        if unpacker.unpack() != "results":
            unpacker.skip()
            continue
        for _ in range(unpacker.read_array_header()):
            for _ in range(unpacker.read_map_header()):
                if unpacker.unpack() != "partitions":
                    unpacker.skip()
                    continue
                entries = unpacker.read_array_header()
                count += entries
                for _ in range(entries):
                    unpacker.skip()
    return count
