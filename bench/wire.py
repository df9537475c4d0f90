"""Just enough of PostgreSQL's and Redis's wire protocols to replay pre-built requests.

The equal-work peers are driven like wrk drives sharecoord: every request is encoded once,
before the run, into the exact bytes sent (a Bind/Execute/Sync of a prepared statement,
an FCALL in RESP), so the load generator does no encoding at all and only has to find
where each reply ends and whether it says success. The same helpers give the blocking
connections the benchmark uses to set the peers up and read their state back.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Sequence

# --- PostgreSQL (frontend/backend protocol 3.0) ------------------------------------------

PROTOCOL_3_0 = 196608
TEXT, INT4, INT8, INT4_ARRAY, INT8_ARRAY = 25, 23, 20, 1007, 1016


def pg_message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def _cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def pg_startup(user: str, database: str) -> bytes:
    body = struct.pack("!I", PROTOCOL_3_0)
    body += _cstring("user") + _cstring(user) + _cstring("database") + _cstring(database)
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def pg_prepare(statement: str, sql: str, param_types: Sequence[int]) -> bytes:
    """Parse, then Sync so the reply ends with ReadyForQuery."""
    payload = _cstring(statement) + _cstring(sql) + struct.pack("!H", len(param_types))
    payload += b"".join(struct.pack("!I", oid) for oid in param_types)
    return pg_message(b"P", payload) + pg_message(b"S", b"")


def pg_execute(statement: str, params: Sequence[str]) -> bytes:
    """Bind text parameters to a prepared statement, execute it, Sync (which commits)."""
    payload = b"\0" + _cstring(statement) + struct.pack("!HH", 0, len(params))
    for param in params:
        data = param.encode()
        payload += struct.pack("!I", len(data)) + data
    payload += struct.pack("!H", 0)  # text results
    return (
        pg_message(b"B", payload)
        + pg_message(b"E", b"\0" + struct.pack("!I", 0))
        + pg_message(b"S", b"")
    )


def pg_query(sql: str) -> bytes:
    return pg_message(b"Q", _cstring(sql))


def pg_array(values: Sequence[int]) -> str:
    """An int[] or bigint[] parameter in text form."""
    return "{" + ",".join(map(str, values)) + "}"


def pg_parse_array(text: str) -> list[int]:
    inner = text.strip("{}")
    return [int(v) for v in inner.split(",")] if inner else []


def pg_reply_end(buf: bytes | bytearray, start: int = 0) -> int | None:
    """Where the reply starting at `start` ends: just past its ReadyForQuery message;
    None while it is incomplete."""
    at = start
    while at + 5 <= len(buf):
        end = at + 1 + int.from_bytes(buf[at + 1 : at + 5], "big")
        if end > len(buf):
            return None
        if buf[at] == ord("Z"):
            return end
        at = end
    return None


def pg_messages(reply: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    at = 0
    while at < len(reply):
        end = at + 1 + int.from_bytes(reply[at + 1 : at + 5], "big")
        out.append((reply[at : at + 1], reply[at + 5 : end]))
        at = end
    return out


def pg_error(reply: bytes) -> str | None:
    """The text of the reply's ErrorResponse, if it has one."""
    for kind, body in pg_messages(reply):
        if kind == b"E":
            fields = {f[:1]: f[1:].decode(errors="replace") for f in body.split(b"\0") if f}
            return f"{fields.get(b'C', '?')}: {fields.get(b'M', '?')}"
    return None


def pg_rows(reply: bytes) -> list[list[str | None]]:
    """The text values of every DataRow in a reply."""
    rows = []
    for kind, body in pg_messages(reply):
        if kind != b"D":
            continue
        row: list[str | None] = []
        at = 2
        for _ in range(int.from_bytes(body[:2], "big")):
            size = int.from_bytes(body[at : at + 4], "big", signed=True)
            at += 4
            if size < 0:
                row.append(None)
            else:
                row.append(body[at : at + size].decode())
                at += size
        rows.append(row)
    return rows


def pg_reply_ok(reply: bytes) -> bool:
    """A write's reply says success: no error, and every error code it returned is 0
    (one int, or an int[] with one per entry)."""
    rows = pg_rows(reply)
    if pg_error(reply) is not None or len(rows) != 1 or len(rows[0]) != 1:
        return False
    value = rows[0][0]
    return value is not None and all(code == "0" for code in value.strip("{}").split(","))


# --- Redis (RESP2) ------------------------------------------------------------------------


class RespError(Exception):
    """An error reply."""


RespValue = int | bytes | None | list["RespValue"] | RespError


def resp_command(*args: str | int | bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def resp_parse(buf: bytes | bytearray, start: int = 0) -> tuple[RespValue, int] | None:
    """The reply starting at `start` and where it ends; None while incomplete."""
    line_end = buf.find(b"\r\n", start)
    if line_end < 0:
        return None
    kind, line = buf[start : start + 1], bytes(buf[start + 1 : line_end])
    after = line_end + 2
    if kind == b":":
        return int(line), after
    if kind == b"+":
        return line, after
    if kind == b"-":
        return RespError(line.decode(errors="replace")), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if after + size + 2 > len(buf):
            return None
        return bytes(buf[after : after + size]), after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items: list[RespValue] = []
        for _ in range(count):
            parsed = resp_parse(buf, after)
            if parsed is None:
                return None
            item, after = parsed
            items.append(item)
        return items, after
    raise ValueError(f"not a RESP reply: {bytes(buf[start : start + 20])!r}")


def resp_reply_end(buf: bytes | bytearray, start: int = 0) -> int | None:
    parsed = resp_parse(buf, start)
    return None if parsed is None else parsed[1]


def resp_reply_ok(reply: bytes) -> bool:
    """A write's reply says success: the error code 0, or an array of nothing but 0s."""
    parsed = resp_parse(reply)
    if parsed is None:
        return False
    value = parsed[0]
    if isinstance(value, list):
        return bool(value) and all(item == 0 for item in value)
    return value == 0


# --- blocking connections for setup and checks -------------------------------------------


class _Connection:
    def __init__(self, port: int, reply_end: Callable[[bytes | bytearray], int | None]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self._reply_end = reply_end

    def request(self, data: bytes) -> bytes:
        """Send one pre-built request and return its whole reply."""
        self.sock.sendall(data)
        return self.read_reply()

    def read_reply(self) -> bytes:
        while True:
            end = self._reply_end(self.buf)
            if end is not None:
                reply = bytes(self.buf[:end])
                del self.buf[:end]
                return reply
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


class PgConnection(_Connection):
    USER = "bench"
    DATABASE = "postgres"

    def __init__(self, port: int) -> None:
        super().__init__(port, pg_reply_end)
        self._checked(self.request(pg_startup(self.USER, self.DATABASE)))

    @staticmethod
    def _checked(reply: bytes) -> bytes:
        error = pg_error(reply)
        if error is not None:
            raise RuntimeError(f"PostgreSQL: {error}")
        return reply

    def query(self, sql: str) -> list[list[str | None]]:
        """Run SQL (simple query protocol) and return the text rows of its result."""
        return pg_rows(self._checked(self.request(pg_query(sql))))

    def prepare(self, statement: str, sql: str, param_types: Sequence[int]) -> None:
        self._checked(self.request(pg_prepare(statement, sql, param_types)))


class RedisConnection(_Connection):
    def __init__(self, port: int) -> None:
        super().__init__(port, resp_reply_end)

    def call(self, *args: str | int | bytes) -> RespValue:
        value = self.pipeline([resp_command(*args)])[0]
        if isinstance(value, RespError):
            raise value
        return value

    def pipeline(self, commands: Sequence[bytes]) -> list[RespValue]:
        """Send every command at once, then read as many replies."""
        self.sock.sendall(b"".join(commands))
        replies = []
        for _ in commands:
            parsed = resp_parse(self.read_reply())
            assert parsed is not None
            replies.append(parsed[0])
        return replies
