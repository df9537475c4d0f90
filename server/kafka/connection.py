"""One ``KafkaConnection`` (an ``asyncio.Protocol``) per client of the Kafka listener
(``server.kafka.listener``, docs/api.md#the-kafka-listener):

* Admission: at most ``--kafka-max-connections`` are open; one more is accepted and cut
  off at once (the listener counts it, and logs at most once a second how many).
* Framing: a 4-byte size, then that many bytes. A size above the limit (or below the
  smallest header) closes the connection before a byte of the body is kept. The limit
  is ``--max-body-bytes`` once the connection has authenticated (or when SASL is off);
  before, only what a handshake needs (``KafkaAuth.handshake_frame_limit``, ~8 KiB).
  The buffer never holds more than the frame being read and what one read brought
  after it.
* Order: requests are handled as they arrive, several at once if the client pipelines
  them (Kafka's own persister keeps one in flight per connection); answers are written
  in request order. At most ``MAX_IN_FLIGHT`` requests are in flight per connection,
  from their arrival until their answer is handed to the socket: being run, waiting for
  durability, or answered but not yet written. Then the connection is not read until
  answers go out.
* Back-pressure: while the socket's write buffer is above its high-water mark
  (``pause_writing``), the connection is not read, answers wait in the queue, and no
  request it sent starts to run; ``resume_writing`` lets them go on. A client that does
  not read its answers thus holds at most one answer in the transport's buffer and
  ``MAX_IN_FLIGHT`` queued, and costs no more work.
* Deadlines, as on HTTP (``--request-timeout-s``): a connection that sends no whole
  request within it (idle, or a frame that does not complete) is closed, unless it is
  waiting for our answers; one that does not take its answers within it is cut off.
* Anything Kafka would close the connection for closes it (``server.kafka.handlers``);
  the daemon serves everyone else. A close the client caused (a frame that does not
  parse, an API or version we do not serve, a request before or a failure of
  authentication, a frame too large) is logged at info with the reason and the peer,
  throttled by the listener; the others (idle, shutdown, a bug already logged with its
  trace) at debug.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from server.kafka.auth import SaslSession
from server.kafka.handlers import CloseConnection
from server.turns import InOrder

if TYPE_CHECKING:
    from server.kafka.listener import KafkaListener

_log = logging.getLogger("sharecoord.kafka")

MAX_IN_FLIGHT = 32
_MIN_FRAME = 8  # api key, version, correlation id: no request is shorter
CLIENT_FAULTS = frozenset(
    {"malformed", "unsupported", "unauthenticated", "authentication_failed", "too_large"}
)


class _Running:
    """A request being run; ``answer`` is set once it is ready to be written."""

    __slots__ = ("answer",)

    def __init__(self) -> None:
        self.answer: bytes | None = None


class KafkaConnection(asyncio.Protocol):
    def __init__(self, listener: KafkaListener) -> None:
        self._listener = listener
        self._api = listener.api
        self._loop = asyncio.get_running_loop()
        self._max_frame = listener.max_frame
        self._handshake_frame = min(listener.max_frame, listener.api.auth.handshake_frame_limit)
        self._timeout = listener.timeout
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._session = SaslSession(listener.api.auth)
        self._order = InOrder(self._loop)  # its requests run their entries in arrival order
        # In request order, until written: answers ready to go, or requests being run.
        self._pending: collections.deque[bytes | _Running] = collections.deque()
        self._admitted = False
        self._closing = False
        self._eof = False
        self._reading_paused = False
        self._write_paused_at: float | None = None
        self._writable = asyncio.Event()  # clear while the write buffer is too full
        self._writable.set()
        self._last_progress = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._peer = "unknown"

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, yet behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._peer = _address(transport.get_extra_info("peername"))
        listener = self._listener
        if len(listener.connections) >= listener.max_connections:
            self._closing = True
            self._transport.abort()
            listener.refused()
            return
        self._admitted = True
        listener.connections.add(self)
        listener.metrics.kafka_connections.inc()
        self._last_progress = self._loop.time()
        self._timer = self._loop.call_later(self._timeout, self._check_deadlines)
        if listener.stopping:
            self.close("shutdown")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._writable.set()  # requests waiting to run see the connection is gone
        self._buf = bytearray()
        if not self._admitted:
            return
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
        """Dispatch the whole frames in the buffer while fewer than MAX_IN_FLIGHT are in
        flight and the client takes its answers; otherwise the connection is not read,
        and the rest waits in the buffer."""
        buf = self._buf
        while len(buf) >= 4 and self._has_room():
            size = int.from_bytes(buf[:4], "big", signed=True)
            if self._session.authenticated:
                if size > self._max_frame:
                    self.close("too_large", f"a frame of {size} bytes, over --max-body-bytes")
                    return
            elif size > self._handshake_frame:
                self.close(
                    "too_large",
                    f"a frame of {size} bytes before authentication "
                    f"(at most {self._handshake_frame})",
                )
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
        if not self._has_room():
            self._pause_reading()
        elif self._eof and not self._pending:
            self.close(None)  # the client is done sending, and everything is answered

    def _has_room(self) -> bool:
        return len(self._pending) < MAX_IN_FLIGHT and self._write_paused_at is None

    def eof_received(self) -> bool | None:
        # The client is done sending: answer what it asked, then close (keep the
        # transport open for writing until then).
        self._eof = True
        if not self._pending:
            self._process()
        return True

    def pause_writing(self) -> None:
        self._write_paused_at = self._loop.time()
        self._writable.clear()
        self._pause_reading()

    def resume_writing(self) -> None:
        self._write_paused_at = None
        self._last_progress = self._loop.time()
        self._flush()
        if self._write_paused_at is not None or self._closing:
            return  # what was queued filled the buffer again
        self._writable.set()
        self._resume()

    # --- requests -----------------------------------------------------------------------

    def _dispatch(self, frame: bytes) -> None:
        try:
            answer = self._api.handle(frame, self._session, self._order)
        except CloseConnection as exc:
            if exc.answer is not None and not self._pending:
                self._write(exc.answer)  # the last answer, however full the buffer
            self.close(exc.reason, str(exc))
            return
        if isinstance(answer, bytes):
            if self._pending or self._write_paused_at is not None:
                self._pending.append(answer)
            else:
                self._write(answer)
            return
        running = _Running()
        self._pending.append(running)
        self._listener.in_flight += 1
        task = self._loop.create_task(self._run(answer, running))
        task.add_done_callback(self._finished)

    async def _run(self, answer: Coroutine[Any, Any, bytes], running: _Running) -> None:
        """Run one request once the client takes its answers, and write what is ready.
        The wait is what keeps a client that does not read from costing work: without
        it every request in flight would run and pile up its answer."""
        while not self._writable.is_set():
            await self._writable.wait()
        if self._closing:
            answer.close()  # never started: nothing to undo
            return
        running.answer = await answer
        # Written here, not in a done callback: the next request's check above must
        # already see a buffer this answer filled.
        self._flush()

    def _finished(self, task: asyncio.Future[None]) -> None:
        error = None if task.cancelled() else task.exception()
        failed = task.cancelled() or error is not None
        listener = self._listener
        listener.in_flight -= 1
        if listener.stopping and not failed:
            listener.drained += 1
        if listener.in_flight == 0:
            listener.idle.set()
        if self._closing:
            return
        if isinstance(error, CloseConnection):  # a large frame, found malformed off the loop
            self.close(error.reason, str(error))
            return
        if failed:
            self.close("internal", "a request failed")
            return
        if not listener.stopping:
            self._resume()

    def _flush(self) -> None:
        """Write the answers at the head of the queue that are ready, in request order,
        until one is not or the client stops taking them."""
        pending = self._pending
        wrote = False
        while pending and self._write_paused_at is None and not self._closing:
            head = pending[0]
            if isinstance(head, bytes):
                answer = head
            elif head.answer is not None:
                answer = head.answer
            else:
                break
            pending.popleft()
            self._write(answer)  # may pause writing at once
            wrote = True
        if wrote:
            self._last_progress = self._loop.time()

    def _write(self, answer: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(answer)

    # --- flow control and deadlines -----------------------------------------------------

    def _resume(self) -> None:
        """Room again: the frames that waited for it, the end after a half-close, then
        reading."""
        if self._closing or self._listener.stopping:
            return
        if self._buf or self._eof:
            self._process()
        self._maybe_resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (
            self._reading_paused
            and not self._closing
            and not self._listener.stopping
            and self._has_room()
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
        self._drop()
        if reason is not None:
            self._listener.metrics.kafka_closed.labels(reason).inc()
            if reason in CLIENT_FAULTS:
                self._listener.closes.log(
                    "Kafka listener: connection closed",
                    reason=reason,
                    peer=self._peer,
                    # It may quote what the client sent: what UTF-8 cannot carry, escaped.
                    detail=message.encode("utf-8", "backslashreplace").decode("utf-8"),
                )
            else:
                _log.debug("Kafka listener: closing a connection (%s): %s", reason, message)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self, reason: str, message: str) -> None:
        self._drop()
        self._listener.metrics.kafka_closed.labels(reason).inc()
        _log.info("Kafka listener: %s; cut off", message)
        if self._transport is not None:
            self._transport.abort()

    def _drop(self) -> None:
        """Forget what this connection holds: the frames read, the answers queued; the
        requests waiting to run are told to give up."""
        self._closing = True
        self._pending.clear()
        self._buf = bytearray()
        self._writable.set()


def _address(peer: Any) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a socket address, as the log shows it."""
    if not isinstance(peer, tuple) or len(peer) < 2:
        return "unknown"
    host = str(peer[0])
    return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
