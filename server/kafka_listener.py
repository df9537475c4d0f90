"""The Kafka listener (``--kafka-listener``): Kafka's binary protocol on its own socket,
on the daemon's event loop, in front of the same service, runtimes and group commit as
HTTP (docs/api.md#the-kafka-listener).

One ``KafkaConnection`` (an ``asyncio.Protocol``) per client:

* Framing: a 4-byte size, then that many bytes. A size above ``--max-body-bytes`` (or
  below the smallest header) closes the connection before a byte of the body is kept;
  the buffer never holds more than the frame being read and what one read brought
  after it.
* Order: requests are handled as they arrive, several at once if the client pipelines
  them (Kafka's own persister keeps one in flight per connection); answers are written
  in request order. At most ``MAX_IN_FLIGHT`` requests wait per connection: then the
  connection is not read until answers go out.
* Deadlines, as on HTTP (``--request-timeout-s``): a connection that sends no whole
  request within it (idle, or a frame that does not complete) is closed, unless it is
  waiting for our answers; one that does not take its answers within it is cut off.
* Anything Kafka would close the connection for closes it (``kafka_handlers``); the
  daemon logs it at debug and serves everyone else.

TLS, from the first byte, uses the HTTP listener's context (``--tls-cert``,
``--tls-key``, ``--tls-client-ca``).

``KafkaListener.stop`` is the shutdown: stop accepting, stop reading, let the answers in
flight finish within ``--shutdown-timeout-s``, then close every connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
from typing import Any, cast

from server.config import ServeConfig, parse_listen
from server.http import Coordinator
from server.kafka_auth import KafkaAuth, SaslSession
from server.kafka_handlers import CloseConnection, KafkaApi
from server.metrics import ShareCoordinatorMetrics

_log = logging.getLogger("sharecoord.kafka")

MAX_IN_FLIGHT = 32
_MIN_FRAME = 8  # api key, version, correlation id: no request is shorter


class KafkaConnection(asyncio.Protocol):
    def __init__(self, listener: KafkaListener) -> None:
        self._listener = listener
        self._api = listener.api
        self._loop = asyncio.get_running_loop()
        self._max_frame = listener.max_frame
        self._timeout = listener.timeout
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._session = SaslSession(listener.api.auth)
        # Answers in request order: bytes ready to go, or futures of them.
        self._pending: collections.deque[bytes | asyncio.Future[bytes]] = collections.deque()
        self._closing = False
        self._eof = False
        self._reading_paused = False
        self._write_paused_at: float | None = None
        self._last_progress = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, yet behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._listener.connections.add(self)
        self._listener.metrics.kafka_connections.inc()
        self._last_progress = self._loop.time()
        self._timer = self._loop.call_later(self._timeout, self._check_deadlines)
        if self._listener.stopping:
            self.close("shutdown")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._listener.connections.discard(self)
        self._listener.metrics.kafka_connections.dec()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._buf += data
        self._process()

    def _process(self) -> None:
        """Dispatch the whole frames in the buffer, while fewer than MAX_IN_FLIGHT wait:
        beyond that the connection is not read, and the rest waits in the buffer."""
        buf = self._buf
        while len(buf) >= 4 and len(self._pending) < MAX_IN_FLIGHT:
            size = int.from_bytes(buf[:4], "big", signed=True)
            if size > self._max_frame:
                self.close("too_large", f"a frame of {size} bytes, over --max-body-bytes")
                return
            if size < _MIN_FRAME:
                self.close("malformed", f"a frame of {size} bytes")
                return
            if len(buf) < 4 + size:
                break
            frame = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            self._last_progress = self._loop.time()
            self._dispatch(frame)
            if self._closing:
                return
        if len(self._pending) >= MAX_IN_FLIGHT:
            self._pause_reading()
        elif self._eof and not self._pending:
            self.close(None)  # the client is done sending, and everything is answered

    def eof_received(self) -> bool | None:
        # The client is done sending: answer what it asked, then close (keep the
        # transport open for writing until then).
        self._eof = True
        if not self._pending:
            self._process()
        return True

    def pause_writing(self) -> None:
        self._write_paused_at = self._loop.time()
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused_at = None
        self._last_progress = self._loop.time()
        self._maybe_resume_reading()

    # --- requests -----------------------------------------------------------------------

    def _dispatch(self, frame: bytes) -> None:
        try:
            answer = self._api.handle(frame, self._session)
        except CloseConnection as exc:
            if exc.answer is not None:
                self._send(exc.answer)
            self.close(exc.reason, str(exc))
            return
        if isinstance(answer, bytes):
            self._send(answer)
            return
        task = asyncio.ensure_future(answer)
        self._listener.in_flight += 1
        self._pending.append(task)
        task.add_done_callback(self._answered)

    def _send(self, answer: bytes) -> None:
        if self._pending:
            self._pending.append(answer)
        elif self._transport is not None and not self._transport.is_closing():
            self._transport.write(answer)

    def _answered(self, task: asyncio.Future[bytes]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here: a connection closed meanwhile never asks
        listener = self._listener
        listener.in_flight -= 1
        if listener.stopping:
            listener.drained += 0 if task.cancelled() else 1
        pending = self._pending
        transport = self._transport
        while pending:
            head = pending[0]
            if isinstance(head, bytes):
                answer = head
            elif not head.done():
                break
            elif head.cancelled() or head.exception() is not None:
                pending.clear()
                self.close("internal", "a request failed")
                return
            else:
                answer = head.result()
            pending.popleft()
            if transport is not None and not transport.is_closing():
                transport.write(answer)
        self._last_progress = self._loop.time()
        if not pending:
            listener.idle.set()
        if self._closing or listener.stopping:
            return
        if self._buf or self._eof:
            self._process()  # frames that waited for room, or the end after a half-close
        self._maybe_resume_reading()

    # --- flow control and deadlines -----------------------------------------------------

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
            and not self._listener.stopping
            and self._write_paused_at is None
            and len(self._pending) < MAX_IN_FLIGHT
            and self._transport is not None
        ):
            self._reading_paused = False
            self._transport.resume_reading()

    def _check_deadlines(self) -> None:
        self._timer = None
        if self._transport is None or self._transport.is_closing():
            return
        now = self._loop.time()
        if self._write_paused_at is not None:
            if now - self._write_paused_at >= self._timeout:
                self.abort("slow_reader", "the client did not take its answers in time")
                return
            due = self._write_paused_at + self._timeout
        elif self._pending:
            due = now + self._timeout  # waiting for us, not for the client
        else:
            if now - self._last_progress >= self._timeout:
                self.close("idle", "no whole request within --request-timeout-s")
                return
            due = self._last_progress + self._timeout
        self._timer = self._loop.call_at(due, self._check_deadlines)

    # --- closing ------------------------------------------------------------------------

    def pause_for_shutdown(self) -> None:
        self._pause_reading()

    def close(self, reason: str | None, message: str = "") -> None:
        """Close after what was written; answers still pending are dropped."""
        self._closing = True
        self._pending.clear()
        if reason is not None:
            self._listener.metrics.kafka_closed.labels(reason).inc()
            _log.debug("Kafka listener: closing a connection (%s): %s", reason, message)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self, reason: str, message: str) -> None:
        self._closing = True
        self._pending.clear()
        self._listener.metrics.kafka_closed.labels(reason).inc()
        _log.info("Kafka listener: %s; cut off", message)
        if self._transport is not None:
            self._transport.abort()


class KafkaListener:
    def __init__(
        self,
        api: KafkaApi,
        metrics: ShareCoordinatorMetrics,
        *,
        max_frame: int,
        timeout: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.max_frame = max_frame
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.connections: set[KafkaConnection] = set()
        self.in_flight = 0
        self.stopping = False
        self.drained = 0
        self.idle = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sock: socket.socket) -> tuple[str, int]:
        """Serve on a bound, listening socket; returns its address."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self),
            sock=sock,
            ssl=self.ssl_context,
            ssl_handshake_timeout=self.timeout if self.ssl_context else None,
        )
        sockets: Any = self._server.sockets
        bound = sockets[0].getsockname()
        self.api.advertised = (str(bound[0]), int(bound[1]))
        return self.api.advertised

    async def stop(self, timeout: float) -> tuple[int, int]:
        """Stop accepting and reading, wait for the answers in flight (at most
        ``timeout`` seconds), close every connection. Returns (drained, cut off)."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.pause_for_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.in_flight > 0 and loop.time() < deadline:
            self.idle.clear()
            try:
                await asyncio.wait_for(self.idle.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
        cut_off = self.in_flight
        for connection in list(self.connections):
            connection.close("shutdown")
        if self._server is not None:
            await self._server.wait_closed()
        return self.drained, cut_off


def bind_kafka_socket(address: str) -> socket.socket:
    """Bind and listen at ``--kafka-listener`` before anything else starts, so that an
    address in use is one line and no opened log. ``OSError`` if it cannot be bound."""
    host, port = parse_listen(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


async def start_kafka_listener(
    coordinator: Coordinator,
    config: ServeConfig,
    ssl_context: ssl.SSLContext | None,
    auth: KafkaAuth,
    sock: socket.socket,
) -> tuple[KafkaListener, str, int]:
    """Build the listener on the app's coordinator and serve on ``sock``; returns it
    with the bound host and port."""
    api = KafkaApi(
        coordinator.require_service,
        lambda: coordinator.cluster,
        coordinator.metrics,
        coordinator.limits,
        auth,
        config.node_id,
        single_node=config.cluster is None,
    )
    listener = KafkaListener(
        api,
        coordinator.metrics,
        max_frame=config.max_body_bytes,
        timeout=config.request_timeout_s,
        ssl_context=ssl_context,
    )
    bound_host, bound_port = await listener.start(sock)
    return listener, bound_host, bound_port
