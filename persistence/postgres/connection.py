"""Connections to the PostgreSQL store: the URI, shown masked; errors in one line; a
small pool for everything but the commit.

The URI is libpq's (a ``postgresql://`` URI or ``key=value`` words), multi-host form
included: ``postgresql://user@db1:5432,db2:5432/sharecoord?target_session_attrs=read-write``
makes every new connection try the hosts in order and keep the first that accepts
writes, so the store follows a promoted standby by reconnecting (psycopg hands the URI
to libpq as it is). A password in it, as ``user:password@`` or ``password=``, is never
shown: ``masked`` replaces it with ``***`` wherever the URI is shown (reprs, logs,
errors), and ``unavailable`` takes it out of the server's and libpq's messages too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from persistence.errors import LogError, StoreUnavailableError
from persistence.store_uri import MASK, masked

# Safety net for a server that does not answer a connection attempt at all.
DEFAULT_CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "sharecoord"
# Idle connections the pool keeps (replay, prune and the leases; the commit has its own).
POOL_IDLE = 4


def password_of(uri: str) -> str | None:
    try:
        password = conninfo_to_dict(uri).get("password")
    except psycopg.Error:
        return None
    return None if password is None else str(password)


def one_line(exc: BaseException, uri: str) -> str:
    """An error of the driver or the server as one line, the password taken out."""
    text = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    secret = password_of(uri)
    if secret:
        text = text.replace(secret, MASK)
    return masked(text) or type(exc).__name__


def unavailable(exc: BaseException, uri: str, doing: str) -> StoreUnavailableError:
    return StoreUnavailableError(f"PostgreSQL store {masked(uri)}: {doing}: {one_line(exc, uri)}")


def check_uri(uri: str) -> None:
    """Raise LogError, in one line, for a URI libpq cannot parse."""
    try:
        conninfo_to_dict(uri)
    except psycopg.ProgrammingError as exc:
        raise LogError(f"not a PostgreSQL URI: {masked(uri)}: {one_line(exc, uri)}") from None


def connect(
    uri: str, *, autocommit: bool = True, timeout_ms: int | None = None
) -> psycopg.Connection[Any]:
    """A new connection (StoreUnavailableError if none can be had). With ``timeout_ms``,
    a connection attempt and every statement on it are bounded by it on the server's
    side (``connect_timeout``, ``statement_timeout``), and a host that vanished is
    noticed by TCP (keepalives, ``tcp_user_timeout``); what the URI says itself stays."""
    given = conninfo_to_dict(uri)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        seconds = DEFAULT_CONNECT_TIMEOUT_S if timeout_ms is None else -(-timeout_ms // 1000)
        extra["connect_timeout"] = max(2, seconds)  # libpq takes less than 2 as 2
    if "application_name" not in given:
        extra["application_name"] = APPLICATION_NAME
    if timeout_ms is not None:
        keepalive_s = max(1, timeout_ms // 1000)
        for key, value in (
            ("keepalives", 1),
            ("keepalives_idle", keepalive_s),
            ("keepalives_interval", 1),
            ("keepalives_count", 3),
            ("tcp_user_timeout", timeout_ms),
        ):
            if key not in given:
                extra[key] = value
    try:
        conn = psycopg.connect(uri, autocommit=autocommit, **extra)
    except psycopg.Error as exc:
        raise unavailable(exc, uri, "cannot connect") from None
    if timeout_ms is not None:
        try:
            with conn.transaction() if not autocommit else contextlib.nullcontext():
                # A client that stopped mid-transaction (a SIGSTOPped node) must not hold
                # its row locks (a claim waits for them) beyond the timeout either.
                conn.execute(f"SET statement_timeout = {int(timeout_ms)}")
                conn.execute(f"SET idle_in_transaction_session_timeout = {int(timeout_ms)}")
        except psycopg.Error as exc:
            conn.close()
            raise unavailable(exc, uri, "cannot connect") from None
    return conn


class Watchdog:
    """Cuts a connection whose block runs past its deadline: a server that stopped
    answering (SIGSTOPped, or a host frozen behind a live TCP stack) enforces no
    ``statement_timeout`` and answers no cancel, so the block's own thread would wait
    for ever. One thread watches every guarded block; cutting shuts the socket down
    under libpq, whose wait then fails at once (the connection is dropped afterwards)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # guard id -> (deadline, fd)
        self._fired: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def guard(
        self, conn: psycopg.Connection[Any], timeout_s: float, uri: str, doing: str
    ) -> Iterator[None]:
        """Run the block; cut ``conn`` if it is still running ``timeout_s`` from now, and
        then raise StoreUnavailableError saying so."""
        if conn.closed:
            yield
            return
        guard_id = next(self._ids)
        with self._lock:
            self._armed[guard_id] = (time.monotonic() + timeout_s, conn.pgconn.socket)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="sharecoord-pg-watchdog", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        try:
            yield
        except psycopg.Error:
            if self._disarm(guard_id):
                raise StoreUnavailableError(
                    f"PostgreSQL store {masked(uri)}: {doing}: no answer within "
                    f"{timeout_s * 1000:.0f} ms; the connection was cut"
                ) from None
            raise
        except BaseException:
            self._disarm(guard_id)
            raise
        self._disarm(guard_id)

    def _disarm(self, guard_id: int) -> bool:
        """Whether the block was cut."""
        with self._lock:
            self._armed.pop(guard_id, None)
            if guard_id in self._fired:
                self._fired.discard(guard_id)
                return True
            return False

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                due = [g for g, (deadline, _) in self._armed.items() if deadline <= now]
                for guard_id in due:
                    _, fd = self._armed.pop(guard_id)
                    self._fired.add(guard_id)
                    _cut(fd)  # under the lock: the connection is still open
                nearest = min((d for d, _ in self._armed.values()), default=None)
                self._lock.wait(None if nearest is None else max(0.0, nearest - now))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()


def _cut(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def is_usable(conn: psycopg.Connection[Any]) -> bool:
    """Open, and between transactions (a connection a statement broke is dropped)."""
    return not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE


class Pool:
    """Connections for the threads that replay, prune and run lease statements: one is
    taken for a block and given back if it is still usable, else closed; up to
    ``POOL_IDLE`` wait idle."""

    def __init__(self, uri: str, timeout_ms: int | None = None) -> None:
        self.uri = uri
        self.timeout_ms = timeout_ms
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection for the block; a driver error in it becomes one
        StoreUnavailableError line saying what was being done."""
        with self._lock:
            if self._closed:
                raise LogError(f"PostgreSQL store {masked(self.uri)} is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = connect(self.uri, timeout_ms=self.timeout_ms)
        try:
            yield conn
        except psycopg.Error as exc:
            conn.close()
            raise unavailable(exc, self.uri, doing) from None
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if is_usable(conn) and not self._closed and len(self._idle) < POOL_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
