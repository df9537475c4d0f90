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
import re
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from persistence.errors import LogError, StoreUnavailableError

MASK = "***"
# Safety net for a server that does not answer a connection attempt at all.
DEFAULT_CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "sharecoord"
# Idle connections the pool keeps (replay, prune and the leases; the commit has its own).
POOL_IDLE = 4

_URI_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:@/?#]*):[^@/?#]*@", re.IGNORECASE)
_WORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def masked(uri: str) -> str:
    """The URI with its password, if any, replaced by ***."""
    uri = _URI_PASSWORD.sub(rf"\1:{MASK}@", uri)
    return _WORD_PASSWORD.sub(rf"\g<1>{MASK}", uri)


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


def connect(uri: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A new connection (StoreUnavailableError if none can be had)."""
    given = conninfo_to_dict(uri)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = DEFAULT_CONNECT_TIMEOUT_S
    if "application_name" not in given:
        extra["application_name"] = APPLICATION_NAME
    try:
        return psycopg.connect(uri, autocommit=autocommit, **extra)
    except psycopg.Error as exc:
        raise unavailable(exc, uri, "cannot connect") from None


def is_usable(conn: psycopg.Connection[Any]) -> bool:
    """Open, and between transactions (a connection a statement broke is dropped)."""
    return not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE


class Pool:
    """Connections for the threads that replay, prune and run lease statements: one is
    taken for a block and given back if it is still usable, else closed; up to
    ``POOL_IDLE`` wait idle."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
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
            conn = connect(self.uri)
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
