"""HTTP/1.1 over a plain socket, for requests no well-behaved client would send, and a
look at the daemon's side of a TCP connection through /proc/net/tcp.

Everything here blocks: sync tests call it directly, async tests through a thread.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from tests.harness import wait_until_blocking

MEDIA_JSON = "application/json"
MEDIA_MSGPACK = "application/msgpack"
ESTABLISHED = "01"


@dataclass
class RawReply:
    status: int
    headers: dict[str, str]  # lower-case names; the last of repeated headers
    body: bytes
    version: str = "HTTP/1.1"
    interim: list[int] = field(default_factory=list)  # 1xx answers before this one

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def error_body(self) -> dict[str, Any]:
        """The API's error body, decoded by the answer's Content-Type (which must be one
        of the API's two)."""
        if self.content_type == MEDIA_JSON:
            decoded = json.loads(self.body)
        elif self.content_type == MEDIA_MSGPACK:
            decoded = msgpack.unpackb(self.body, raw=False)
        else:
            raise AssertionError(f"a {self.status} answer in {self.content_type!r}: {self.body!r}")
        return decoded  # type: ignore[no-any-return]


class Closed(Exception):
    """The connection ended before a whole answer arrived."""


class Reader:
    """Answers, one after another, from one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Closed(self.buffer[:200])
        self.buffer += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self._more()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._more()
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def answer(self, *, head: bool = False) -> RawReply:
        interim = []
        while True:
            status_line = self._line()
            version, status, *_ = status_line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while line := self._line():
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if 100 <= int(status) < 200:
                interim.append(int(status))
                continue
            break
        if head or int(status) in (204, 304):
            body = b""
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exactly(size)
                self._exactly(2)
        else:  # until the connection closes
            try:
                while True:
                    self._more()
            except Closed:
                pass
            body, self.buffer = self.buffer, b""
        return RawReply(int(status), headers, body, version, interim)


def connect(host: str, port: int, timeout: float = 30.0) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def exchange(
    host: str, port: int, data: bytes, *, timeout: float = 30.0, head: bool = False
) -> RawReply:
    """Send ``data`` on a new connection and read one answer."""
    with connect(host, port, timeout) as sock:
        sock.sendall(data)
        return Reader(sock).answer(head=head)


def request_bytes(
    method: str,
    target: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    chunks: list[int] | None = None,
    content_length: int | None = None,
) -> bytes:
    """A request. ``chunks``: send the body chunked, cut at these sizes; else with a
    Content-Length (``content_length`` may lie)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: sharecoord"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if chunks is not None:
        lines.append("Transfer-Encoding: chunked")
        payload = b""
        at = 0
        for size in [*chunks, len(body)]:
            piece = body[at : at + size]
            at += len(piece)
            if piece:
                payload += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        payload += b"0\r\n\r\n"
    else:
        declared = len(body) if content_length is None else content_length
        if body or method in ("POST", "PUT") or content_length is not None:
            lines.append(f"Content-Length: {declared}")
        payload = body
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    return head + payload


# --- the daemon's side of a connection ----------------------------------------------------


def _sockets(path: str) -> list[tuple[int, int, str]]:
    out = []
    try:
        with open(path) as table:
            rows = table.read().splitlines()[1:]
    except FileNotFoundError:
        return out
    for row in rows:
        fields = row.split()
        local, remote, state = fields[1], fields[2], fields[3]
        out.append((int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), state))
    return out


def server_side_states(server_port: int, client_port: int) -> list[str]:
    """TCP states (kernel hex codes, "01" = ESTABLISHED) of the daemon's end of the
    connection from ``client_port``."""
    return [
        state
        for path in ("/proc/net/tcp", "/proc/net/tcp6")
        for local, remote, state in _sockets(path)
        if local == server_port and remote == client_port
    ]


def wait_cut_off(server_port: int, sock: socket.socket, deadline_s: float = 120.0) -> float:
    """Wait, without reading or writing a byte, until the daemon has closed its end of
    ``sock``'s connection; returns how long that took (a figure, never asserted)."""
    client_port = sock.getsockname()[1]
    started = time.monotonic()
    wait_until_blocking(
        lambda: ESTABLISHED not in server_side_states(server_port, client_port),
        "the daemon to cut the client off",
        timeout=deadline_s,
        max_pause=0.05,
    )
    return time.monotonic() - started
