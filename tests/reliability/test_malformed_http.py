"""Issue #7, item 5: malformed HTTP gets the API's error body too, and no input is a 5xx.

docs/api.md#http-statuses: every answer but a 200 has an {"error_code", "error_message"}
body. aiohttp answers a request it cannot parse on its own, before the app sees it; the daemon's
connections (server/http/connection.py) give those answers the API's JSON body. Each row is
sent on a fresh connection of one daemon; at the end the daemon still runs, logged no
trace, and counted no 5xx.
"""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import pytest

from tests.harness import Api, metric_value
from tests.reliability.raw_http import Closed, RawReply, Reader, connect, exchange, request_bytes

RPC = "/v1/share-group-state/read"
JSON = {"Content-Type": "application/json"}
H = b"POST " + RPC.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

# (raw request, expected status); every answer must carry the API's error body.
MALFORMED = {
    "not http at all": (b"GARBAGE\r\n\r\n", 400),
    "binary noise": (bytes(range(256)) + b"\r\n\r\n", 400),
    "tls hello on the plain port": (bytes.fromhex("16030100a5010000a10303") + b"\0" * 40, 400),
    "http/2 preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
    "unknown http version": (b"GET /healthz HTTP/3.0\r\nHost: x\r\n\r\n", 400),
    "http/0.9 request line": (b"GET /readyz\r\n", 400),
    "http/0.9 request line, then a blank line": (b"GET /readyz\r\n\r\n", 400),
    "header without colon": (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400),
    "nul in a header": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),
    "no host header": (b"GET /healthz HTTP/1.1\r\n\r\n", 400),
    "header line too long": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
        400,
    ),
    "request line too long": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    "too many headers": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X%d: y\r\n" % i for i in range(300))
        + b"\r\n",
        400,
    ),
    "non-ascii in the query": (
        b"GET /v1/admin/state?group_id=\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        400,
    ),
    "negative content-length": (H + b"Content-Length: -1\r\n\r\n{}", 400),
    "two content-lengths": (H + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    "content-length overflow": (H + b"Content-Length: 99999999999999999999999999\r\n\r\n", 400),
    "chunked and content-length": (
        H + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    "bad chunk size": (H + b"Transfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n", 400),
    "chunk longer than said": (
        H + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n0\r\n\r\n",
        400,
    ),
    # RFC 9112 §6.1: a transfer coding the server does not implement is 501...
    "a transfer coding before chunked": (
        H + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        501,
    ),
    # ... and one without chunked last leaves no way to find the body's end: 400.
    "a transfer coding without chunked": (
        H + b"Transfer-Encoding: gzip\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        400,
    ),
    # ... and one that names no coding at all is malformed: 400.
    "an empty transfer-encoding": (
        H + b"Transfer-Encoding: \t\r\nContent-Length: 2\r\n\r\n{}",
        400,
    ),
    "a transfer-encoding of commas": (
        H + b"Transfer-Encoding: , ,\r\nContent-Length: 2\r\n\r\n{}",
        400,
    ),
    "unknown expectation on an rpc": (H + b"Expect: 999-foo\r\nContent-Length: 2\r\n\r\n{}", 417),
    "unknown expectation elsewhere": (
        b"GET /no/such/path HTTP/1.1\r\nHost: x\r\nExpect: nonsense\r\n\r\n",
        417,
    ),
}


@pytest.fixture
async def daemon(spawn, tmp_path):
    return await spawn(tmp_path / "data", "--request-timeout-s", "2")


async def no_bug_was_logged(daemon, session: aiohttp.ClientSession) -> None:
    assert daemon.process.poll() is None, "the daemon died"
    metrics = await Api(session, daemon.url).metrics()
    # (503 is /readyz while loading, counted before the test began.)
    assert metric_value(metrics, "sharecoord_http_error_responses_total", status="500") == 0
    stderr = await asyncio.to_thread(daemon.stderr_text)
    assert "Traceback" not in stderr, stderr
    assert "unhandled" not in stderr.lower(), stderr


async def test_malformed_http_is_answered_with_the_api_error_body(daemon, session):
    for name, (raw, status) in MALFORMED.items():
        reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, raw)
        assert reply.status == status, (name, reply)
        error = reply.error_body()
        assert set(error) == {"error_code", "error_message"}, (name, error)
        assert error["error_code"] == 42, (name, error)
        assert error["error_message"], name
    await no_bug_was_logged(daemon, session)


REFUSED_AND_CLOSED = (
    b"GET /readyz\r\n",
    b"GET /readyz\r\n\r\n",
    H + b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    H + b"Transfer-Encoding: identity, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
)


def refused_then_closed(host: str, port: int, raw: bytes) -> RawReply:
    """The answer to ``raw``, sent with a valid request after it; asserts that the
    connection closes after the answer, the valid request never answered."""
    valid = request_bytes("GET", "/healthz")
    with connect(host, port) as sock:
        sock.sendall(raw + valid)
        reader = Reader(sock)
        reply = reader.answer()
        with pytest.raises(Closed):
            reader.answer()
    return reply


async def test_http_0_9_and_transfer_codings_but_chunked_are_refused_and_the_connection_closed(
    daemon, session
):
    for raw in REFUSED_AND_CLOSED:
        reply = await asyncio.to_thread(refused_then_closed, daemon.host, daemon.port, raw)
        assert reply.status in (400, 501), (raw, reply)
        assert reply.error_body()["error_code"] == 42, (raw, reply)
        # Alone, each is refused for what it is.
        reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, raw)
        why = "HTTP/0.9 is not supported" if reply.status == 400 else "Transfer-Encoding '"
        assert why in reply.error_body()["error_message"], (raw, reply)
    # Chunked alone, in any case, is what it always was.
    chunked = H + b"Transfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, chunked)
    assert reply.status == 400 and "group_id" in reply.error_body()["error_message"], reply
    await no_bug_was_logged(daemon, session)


async def test_an_expectation_failure_answers_in_the_requests_format(daemon):
    raw = request_bytes(
        "POST",
        RPC,
        b"\x80",
        {"Content-Type": "application/msgpack", "Expect": "nonsense"},
    )
    reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, raw)
    assert (reply.status, reply.content_type) == (417, "application/msgpack")
    assert reply.error_body()["error_code"] == 42


# --- bodies aiohttp cannot decode, bodies that never finish -------------------------------

COMPRESSED = {
    "gzip": ({"Content-Encoding": "gzip"}, gzip.compress(b'{"group_id": "g", "topics": []}')),
    "gzip that is not gzip": ({"Content-Encoding": "gzip"}, b"{}"),
    "deflate that is not deflate": ({"Content-Encoding": "deflate"}, b"abcde"),
    "gzip cut short": ({"Content-Encoding": "gzip"}, gzip.compress(b'{"group_id": "g"}')[:12]),
    "br": ({"Content-Encoding": "br"}, b"\x0b\x02\x80{}\x03"),
    "a coding nobody knows": ({"Content-Encoding": "zip, gzip"}, b"{}"),
}
ROUTES = {
    ("POST", RPC): 415,  # reads bodies
    ("POST", "/v1/find-coordinator"): 415,
    ("GET", "/v1/admin/partitions"): 200,  # reads none: the body is left alone
    ("POST", "/no/such/route"): 404,
    ("POST", "/healthz"): 405,
}


async def test_a_compressed_body_is_refused_with_415_and_never_decompressed(daemon, session):
    """docs/api.md's bodies are msgpack or JSON as they are: a Content-Encoding is refused, and
    aiohttp does not decompress bodies (one that nobody read and that did not decompress
    was logged by aiohttp, with a trace, as an unhandled exception)."""
    for name, (headers, payload) in COMPRESSED.items():
        for (method, path), status in ROUTES.items():
            raw = request_bytes(method, path, payload, {**JSON, **headers})
            reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, raw)
            assert reply.status == status, (name, path, reply)
            if status != 200:
                assert reply.error_body()["error_code"] in (3, 42), (name, path, reply)
    identity = request_bytes(
        "POST", RPC, b'{"group_id": "g", "topics": []}', {**JSON, "Content-Encoding": "identity"}
    )
    assert (await asyncio.to_thread(exchange, daemon.host, daemon.port, identity)).status == 200
    await no_bug_was_logged(daemon, session)


def send_half_and_close(host: str, port: int) -> None:
    with connect(host, port) as sock:
        sock.sendall(request_bytes("POST", RPC, b'{"gro', JSON, content_length=100))


async def test_a_client_that_leaves_mid_body_is_no_bug(daemon, session):
    for _ in range(5):
        await asyncio.to_thread(send_half_and_close, daemon.host, daemon.port)
    api = Api(session, daemon.url)
    assert (await api.request("GET", "/healthz")).status == 200
    await no_bug_was_logged(daemon, session)


async def test_a_405_names_the_methods_the_route_allows(daemon):
    """RFC 9110: a 405 carries Allow (schemathesis's unsupported-method check found it
    missing: the error body replaced aiohttp's answer and dropped its headers)."""
    for method, path, allowed in (
        ("TRACE", RPC, {"POST"}),
        ("GET", "/v1/admin/topics", {"PUT"}),
        ("POST", "/healthz", {"GET", "HEAD"}),
    ):
        reply = await asyncio.to_thread(
            exchange, daemon.host, daemon.port, request_bytes(method, path)
        )
        assert reply.status == 405, (method, path, reply)
        assert {m.strip() for m in reply.headers["allow"].split(",")} == allowed, reply.headers
        assert reply.error_body()["error_code"] == 42
