"""Issue #7, item 5 (d): slow clients are cut off, and the daemon serves others meanwhile.

Three kinds, each against a daemon with ``--request-timeout-s 1``: a client that sends
its request line and headers a byte at a time (slowloris), on a fresh connection and on
one that already had an answer; a client that stops half way through its body; and a
client that sends requests but never reads its answers (pipelined until its socket
buffers are full). "Cut off" is read from the daemon's own end of the TCP connection
(/proc/net/tcp): it must leave ESTABLISHED without the client doing anything. While
the slow clients hang on, a normal client's requests are answered.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import aiohttp
import pytest
from aiohttp import web

from server.http.connection import ApiAppRunner
from tests.harness import TOPIC, Api, body, init_entry, read_entry
from tests.reliability.raw_http import (
    ESTABLISHED,
    Reader,
    connect,
    request_bytes,
    server_side_states,
    wait_cut_off,
)

TIMEOUT = "1"
DEADLINE_S = 120.0  # safety nets, never timing assertions


async def served_meanwhile(api: Api, rounds: int = 20) -> None:
    """A normal client gets answers while the slow ones hang on."""
    for i in range(rounds):
        assert await api.codes("initialize", body("meanwhile", (TOPIC, [init_entry(i)]))) == [0]
        assert await api.codes("read", body("meanwhile", (TOPIC, [read_entry(i)]))) == [0]


def dribble(sock: socket.socket, data: bytes, stop: threading.Event, pause_s: float) -> None:
    """Send ``data`` a byte at a time until it is all sent, the daemon closes, or
    ``stop``; never completes a request in the time the daemon allows."""
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(pause_s)  # a slow client on purpose, not a wait


async def test_slow_headers_are_cut_off_and_others_are_served(spawn, tmp_path, figures):
    daemon = await spawn(tmp_path / "data", "--request-timeout-s", TIMEOUT)
    request = request_bytes("GET", "/healthz", headers={"X-Padding": "p" * 200})
    stop = threading.Event()
    socks = [await asyncio.to_thread(connect, daemon.host, daemon.port) for _ in range(30)]
    threads = [
        threading.Thread(target=dribble, args=(s, request, stop, 0.2), daemon=True) for s in socks
    ]
    for thread in threads:
        thread.start()
    try:
        async with aiohttp.ClientSession() as session:
            await served_meanwhile(Api(session, daemon.url))
        waited = [await asyncio.to_thread(wait_cut_off, daemon.port, s) for s in socks]
        figures.set("slowloris_connections_cut", len(waited))
        async with aiohttp.ClientSession() as session:
            await served_meanwhile(Api(session, daemon.url))
    finally:
        stop.set()
        for s in socks:
            s.close()


async def test_slow_headers_after_a_first_answer_are_cut_off(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data", "--request-timeout-s", TIMEOUT)
    sock = await asyncio.to_thread(connect, daemon.host, daemon.port)
    try:
        await asyncio.to_thread(sock.sendall, request_bytes("GET", "/healthz"))
        reply = await asyncio.to_thread(Reader(sock).answer)
        assert reply.status == 200
        stop = threading.Event()
        thread = threading.Thread(
            target=dribble, args=(sock, request_bytes("GET", "/readyz"), stop, 0.2), daemon=True
        )
        thread.start()
        await asyncio.to_thread(wait_cut_off, daemon.port, sock)
        stop.set()
    finally:
        sock.close()


async def test_a_body_that_stops_half_way_is_cut_off(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data", "--request-timeout-s", TIMEOUT)
    whole = b'{"group_id": "g", "topics": []}'
    head = request_bytes(
        "POST",
        "/v1/share-group-state/read",
        whole,
        {"Content-Type": "application/json"},
        content_length=len(whole) + 100,  # the rest never comes
    )
    socks = [await asyncio.to_thread(connect, daemon.host, daemon.port) for _ in range(10)]
    try:
        for s in socks:
            await asyncio.to_thread(s.sendall, head)
        async with aiohttp.ClientSession() as session:
            await served_meanwhile(Api(session, daemon.url))
        for s in socks:
            await asyncio.to_thread(wait_cut_off, daemon.port, s)
        # It was told why, in the API's body.
        reply = await asyncio.to_thread(Reader(socks[0]).answer)
        assert reply.status == 408
        assert reply.error_body()["error_code"] == 42
    finally:
        for s in socks:
            s.close()


def flood_without_reading(host: str, port: int) -> tuple[socket.socket, int]:
    """Pipeline requests whose answers are never read, until the socket buffers on both
    sides are full (sending blocks)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.settimeout(2.0)
    request = request_bytes("GET", "/metrics")
    sent = 0
    try:
        while True:
            sock.sendall(request)
            sent += 1
    except TimeoutError:
        pass  # both sides' buffers are full
    except (ConnectionResetError, BrokenPipeError):
        pass  # already cut off while still sending
    return sock, sent


async def test_a_client_that_never_reads_its_answers_is_cut_off(spawn, tmp_path, figures):
    daemon = await spawn(tmp_path / "data", "--request-timeout-s", TIMEOUT)
    flooders = [
        await asyncio.to_thread(flood_without_reading, daemon.host, daemon.port) for _ in range(3)
    ]
    try:
        async with aiohttp.ClientSession() as session:
            await served_meanwhile(Api(session, daemon.url))
        for sock, _ in flooders:
            await asyncio.to_thread(wait_cut_off, daemon.port, sock, DEADLINE_S)
        figures.set("unread_requests_pipelined", sum(sent for _, sent in flooders))
        async with aiohttp.ClientSession() as session:
            await served_meanwhile(Api(session, daemon.url))
    finally:
        for sock, _ in flooders:
            sock.close()


# --- the first-request deadline is ours, whatever aiohttp does -----------------------------


@pytest.fixture
async def runner_without_aiohttp_timeouts():
    """The app-less part of the daemon's server, with aiohttp's own keep-alive timer far
    away: only ApiAppRunner's first-request deadline can cut a slow client off."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = ApiAppRunner(app, request_timeout_s=0.5, keepalive_timeout=3600)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield port
    await runner.cleanup()


async def test_the_first_request_deadline_does_not_rely_on_aiohttp(
    runner_without_aiohttp_timeouts,
):
    port = runner_without_aiohttp_timeouts
    silent = await asyncio.to_thread(connect, "127.0.0.1", port)
    partial = await asyncio.to_thread(connect, "127.0.0.1", port)
    served = await asyncio.to_thread(connect, "127.0.0.1", port)
    try:
        await asyncio.to_thread(partial.sendall, b"GET /healthz HTTP/1.1\r\nHo")
        await asyncio.to_thread(served.sendall, request_bytes("GET", "/healthz"))
        assert (await asyncio.to_thread(Reader(served).answer)).status == 200
        await asyncio.to_thread(wait_cut_off, port, silent)
        await asyncio.to_thread(wait_cut_off, port, partial)
        # A connection that had its answer is aiohttp's to time out (keep-alive, here an
        # hour): the first-request deadline did not touch it.
        client_port = served.getsockname()[1]
        assert ESTABLISHED in await asyncio.to_thread(server_side_states, port, client_port)
    finally:
        for s in (silent, partial, served):
            s.close()
