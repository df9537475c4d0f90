"""Request bodies (docs/api.md#requests): their format, their size, and their arrival
within ``--request-timeout-s``; 400, 408, 413 and 415 as docs/api.md says."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from protocol import codec, errors
from protocol.codec import Format
from server.http.edge import Edge, HTTPError, answer_format

_log = logging.getLogger("sharecoord.http")


async def read_body(request: web.Request, edge: Edge) -> tuple[bytes, Format, Format]:
    """The body and its format, and the answer's format; 415 / 413 as docs/api.md says."""
    config = edge.node.config
    content_type = request.headers.get("Content-Type")
    fmt = codec.format_of(content_type)
    if fmt is None:
        raise HTTPError(
            415,
            errors.INVALID_REQUEST,
            f"unsupported Content-Type {content_type!r}: use application/msgpack or "
            "application/json",
            answer_format(request),
        )
    out = codec.response_format(content_type, request.headers.get("Accept"))
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in ("", "identity"):
        raise HTTPError(
            415,
            errors.INVALID_REQUEST,
            f"unsupported Content-Encoding {coding!r}: send the body uncompressed",
            out,
        )
    limit = config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HTTPError(413, errors.INVALID_REQUEST, _too_large(limit), out)
    timeout = config.request_timeout_s
    try:
        if request.content.is_eof():
            body = await request.read()  # all there already: no deadline needed
        else:
            body = await _read_the_rest(request, edge, timeout)
    except web.HTTPRequestEntityTooLarge as exc:
        _untraced(exc)
        raise HTTPError(413, errors.INVALID_REQUEST, _too_large(limit), out) from None
    except web.RequestPayloadError as exc:
        # A body aiohttp could not read (broken chunking): the client's mistake, not a
        # bug (no 500, no trace).
        _untraced(exc)
        # What follows in the connection is never read: say so, or aiohttp's lingering
        # read after the answer trips over the same error and logs it as unhandled.
        request.content.feed_eof()
        raise _closing(
            HTTPError(
                400,
                errors.INVALID_REQUEST,
                f"the request body could not be read: {_one_line(str(exc))}",
                out,
            )
        ) from None
    except ConnectionError as exc:
        # The client closed the connection before its body arrived: nobody is left to
        # answer, and it is no bug either.
        _untraced(exc)
        _log.debug("%s %s: the connection closed mid-body", request.method, request.path)
        raise _closing(
            HTTPError(
                400, errors.INVALID_REQUEST, "the connection closed before the body arrived", out
            )
        ) from None
    except asyncio.TimeoutError as exc:  # not yet the builtin TimeoutError on Python 3.10
        _untraced(exc)
        # What is left of the body is never read, nor waited for: aiohttp would linger
        # up to 10 s more reading it.
        request.content.feed_eof()
        raise _closing(
            HTTPError(
                408,
                errors.INVALID_REQUEST,
                f"the request body did not arrive within {timeout:g} seconds "
                "(--request-timeout-s)",
                out,
            )
        ) from None
    return body, fmt, out


def _untraced(exc: BaseException) -> None:
    """Drop the tracebacks of a failed read's exception and of what it came from. aiohttp
    keeps the exception on the request's stream, and its traceback holds the frame of
    the read (with the body read so far) and the request, which holds the stream: a
    cycle that kept up to a whole partial body until a collection (24 MB of them after
    1,500 of the memory test's bad requests)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def _closing(error: HTTPError) -> HTTPError:
    """``error``, its answer closing the connection. Made here and raised at once by the
    caller: an exception kept in a local of the frame that raises it is a cycle (its
    traceback holds the frame), which keeps the request alive until a collection."""
    error.response.force_close()
    return error


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
