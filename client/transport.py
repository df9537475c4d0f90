"""HTTP to the daemons (docs/api.md#transport): one pooled aiohttp session per client.

One ``aiohttp.ClientSession`` over one ``TCPConnector`` serves every node: keep-alive
connections, a bounded number per host. This module sends bytes and says what came
back; what an answer means for each entry is the caller's business, helped by
``refusal`` for the answers that are not a 200.
"""

from __future__ import annotations

import ssl as ssl_module
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from client.retry import Failure
from protocol import errors
from protocol.client_codec import BodyError, Format, decode_error
from protocol.codec import format_of

CONTENT_TYPES = {Format.MSGPACK: "application/msgpack", Format.JSON: "application/json"}
# Keeps an error body quoted in a message readable when it is not the API's error map.
_QUOTE_LIMIT = 200


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status, its body and the format the body is in."""

    url: str
    status: int
    body: bytes
    fmt: Format


class HttpTransport:
    """Sends requests to any node over one pooled session. Create the session with
    ``start()`` inside the running event loop; ``close()`` releases every connection."""

    def __init__(
        self,
        *,
        token: str | None,
        ssl: ssl_module.SSLContext | None,
        request_timeout_s: float,
        max_connections_per_host: int,
        fmt: Format,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if max_connections_per_host < 1:
            raise ValueError(
                f"max_connections_per_host must be >= 1, got {max_connections_per_host}"
            )
        if token is not None and not (token and all(33 <= ord(c) <= 126 for c in token)):
            raise ValueError("the auth token must be printable ASCII without spaces")
        self.fmt = fmt
        self._token = token
        self._ssl = ssl
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._max_connections_per_host = max_connections_per_host
        self._trace_configs = list(trace_configs)
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        if self._session is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=0,  # no global cap; the per-host cap is what protects each daemon
            limit_per_host=self._max_connections_per_host,
            ssl=self._ssl if self._ssl is not None else True,
        )
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            headers=headers,
            trace_configs=self._trace_configs or None,
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @property
    def closed(self) -> bool:
        return self._session is None

    async def post(self, url: str, body: bytes) -> Answer:
        """POST ``body`` in the client's format. Raises what aiohttp raises."""
        content_type = CONTENT_TYPES[self.fmt]
        return await self.request(
            "POST", url, body, {"Content-Type": content_type, "Accept": content_type}
        )

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        session = self._session
        if session is None:
            raise RuntimeError(
                "the client is closed (or was never started): use `async with "
                "ShareCoordinatorClient(...)`"
            )
        async with session.request(method, url, data=body, headers=headers) as response:
            payload = await response.read()
            fmt = format_of(response.headers.get("Content-Type")) or Format.JSON
            return Answer(url, response.status, payload, fmt)


def error_message(answer: Answer) -> tuple[int | None, str]:
    """``(error_code, error_message)`` of a non-200 answer's body (docs/api.md: every one
    has ``{"error_code", "error_message"}``); ``(None, text)`` for anything else, as
    a proxy or a server that is not sharecoord might answer."""
    try:
        body = decode_error(answer.body, answer.fmt)
    except BodyError:
        text = answer.body[:_QUOTE_LIMIT].decode("utf-8", "replace").strip()
        return None, text or "(no body)"
    return body.error_code, body.error_message


def refusal(answer: Answer) -> Failure:
    """What a non-200 answer to a request means for each entry it carried.

    400, 405, 413, 415: INVALID_REQUEST (42) with the server's message, final. 401:
    CLUSTER_AUTHORIZATION_FAILED (31), final. 421: NOT_COORDINATOR (16), retriable.
    5xx: the code the body names (14 or 15 from an admin call; 15 if none), retriable.
    Anything else (a 404 at an RPC's path says this is no sharecoord daemon): final.
    """
    status = answer.status
    code, message = error_message(answer)
    if status in (400, 405, 413, 415):
        return Failure(errors.INVALID_REQUEST, message, False)
    if status == 401:
        return Failure(errors.CLUSTER_AUTHORIZATION_FAILED, message, False)
    where = f"HTTP {status} from {answer.url}: {message}"
    if status == 421:
        return Failure(errors.NOT_COORDINATOR, where, True)
    if 500 <= status <= 599:
        return Failure(code if code is not None else errors.COORDINATOR_NOT_AVAILABLE, where, True)
    if status == 404:
        where += " (is this a sharecoord daemon of a matching version?)"
    return Failure(errors.UNKNOWN_SERVER_ERROR, where, False)


def make_ssl_context(
    cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None
) -> ssl_module.SSLContext:
    """A TLS context for ``ShareCoordinatorClient(ssl=...)``: verify the daemons with
    ``cafile`` (the system's CAs if None), present ``certfile``/``keyfile`` for mutual
    TLS. TLS 1.2 at least. It reads files: build it before the event loop runs, or
    through ``asyncio.to_thread``."""
    if keyfile is not None and certfile is None:
        raise ValueError("a client key was given without a client certificate")
    context = ssl_module.create_default_context(ssl_module.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl_module.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    return context
