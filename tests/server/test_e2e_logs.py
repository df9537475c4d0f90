"""What a real daemon prints: in JSON mode nothing but JSON lines, the access log's
lines with their fields, and a shutdown line saying how many requests it drained.

The daemon runs as a child process (tests/harness); every line it ever printed is read
back (its stdout as the harness read it, its stderr from the file), not only the
"listening" one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from server.config import load_serve_config
from server.http.access_log import access_log_middleware
from server.http.app import create_app
from server.node import Node
from tests.harness import (
    TOPIC,
    Api,
    Daemon,
    Spawn,
    body,
    init_entry,
    read_entry,
    wait_until,
)

GROUP = "logs"
TEXT_LISTENING = re.compile(r"^sharecoord listening on http://127\.0\.0\.1:(\d+)$")
# A group commit waits this long for more writes: a write stays in flight that long.
LINGER_MS = 1500


def output(daemon: Daemon) -> tuple[list[str], list[str]]:
    """Every line the daemon printed: (stdout, stderr)."""
    return list(daemon.stdout_lines), daemon.stderr_text().splitlines()


async def appended(api: Api) -> int:
    reply = await api.request("GET", "/v1/admin/partitions")
    return sum(p["log_end_offset"] or 0 for p in reply.body["partitions"])


async def test_json_mode_prints_only_json_with_access_lines_and_the_drain(
    spawn: Spawn, tmp_path: Path
) -> None:
    flags = ("--log-format", "json", "--access-log", "--append-linger-ms", str(LINGER_MS))
    daemon = await spawn(tmp_path / "data", *flags, partitions=4, ready=False)
    first_line = daemon.stdout_lines[0]
    listening = json.loads(first_line)
    assert listening["msg"] == "listening"
    url = listening["url"]
    assert url == f"http://127.0.0.1:{listening['port']}"

    reads = body(GROUP, (TOPIC, [read_entry(p) for p in range(3)]))
    async with aiohttp.ClientSession() as session:
        api = Api(session, url)
        await api.wait_ready()
        assert len(await api.results("read", reads)) == 3
        assert len(await api.with_format("msgpack").results("read", reads)) == 3
        assert (await api.post("/v1/share-group-state/read", {"topics": 5})).status == 400
        assert (await api.request("GET", "/v1/nowhere")).status == 404
        # A write waits LINGER_MS for its group commit: SIGTERM comes while it does.
        write = asyncio.ensure_future(
            api.results("initialize", body(GROUP, (TOPIC, [init_entry(0), init_entry(1)])))
        )

        async def records_appended() -> int:
            count = await appended(api)
            if count < 2:
                assert not write.done(), write
            return count

        await wait_until(
            records_appended,
            "the write's two records to be appended",
            until=lambda count: count >= 2,
            max_pause=0.01,
        )
        daemon.signal(signal.SIGTERM)
        assert [r["error_code"] for r in await write] == [0, 0]  # drained, not cut off
    assert await asyncio.to_thread(daemon.wait) == 0

    stdout, stderr = await asyncio.to_thread(output, daemon)
    assert stdout == [first_line]  # nothing else on stdout
    records = [json.loads(line) for line in stdout + stderr]  # every line is JSON
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record), record

    access = [r for r in records if r["logger"] == "sharecoord.access"]
    for r in access:
        assert r["level"] == "info"
        assert isinstance(r["duration_ms"], float) and r["duration_ms"] >= 0, r
    rpc = [r for r in access if r["path"] == "/v1/share-group-state/read"]
    assert [(r["method"], r["status"], r["entries"]) for r in rpc] == [
        ("POST", 200, 3),  # JSON
        ("POST", 200, 3),  # msgpack
        ("POST", 400, None),  # refused before any entry
    ]
    (missing,) = [r for r in access if r["path"] == "/v1/nowhere"]
    assert (missing["method"], missing["status"]) == ("GET", 404)
    assert "entries" not in missing  # not an RPC
    (initialize,) = [r for r in access if r["path"] == "/v1/share-group-state/initialize"]
    assert (initialize["status"], initialize["entries"]) == (200, 2)
    assert initialize["duration_ms"] >= LINGER_MS * 0.9

    (stopping,) = [r for r in records if r["msg"].startswith("stopping")]
    assert stopping["in_flight"] == 1
    (stopped,) = [r for r in records if r["msg"] == "stopped"]
    assert (stopped["drained"], stopped["cut_off"], stopped["final_commit"]) == (1, 0, "done")
    assert stopped is records[-1]


async def test_text_mode_keeps_the_listening_line_and_logs_access_in_text(
    spawn: Spawn, tmp_path: Path
) -> None:
    daemon = await spawn(tmp_path / "data", "--access-log", partitions=4, ready=False)
    first_line = daemon.stdout_lines[0]
    match = TEXT_LISTENING.match(first_line)
    assert match is not None, first_line
    async with aiohttp.ClientSession() as session:
        api = Api(session, f"http://127.0.0.1:{match[1]}")
        await api.wait_ready()
        await api.results("read", body(GROUP, (TOPIC, [read_entry(7)])))
    assert await asyncio.to_thread(daemon.terminate) == 0
    stdout, stderr = await asyncio.to_thread(output, daemon)
    assert stdout == [first_line]
    (line,) = [s for s in stderr if "path=/v1/share-group-state/read " in s]
    assert " INFO sharecoord.access request method=POST " in line
    assert "path=/v1/share-group-state/read status=200 entries=1 duration_ms=" in line
    (stopped,) = [s for s in stderr if "sharecoord.daemon stopped" in s]
    assert "drained=0 cut_off=0 final_commit=done" in stopped


async def test_without_the_flag_access_lines_come_at_debug_only(
    spawn: Spawn, tmp_path: Path
) -> None:
    for level, expected in (("info", 0), ("debug", 1)):
        daemon = await spawn(
            tmp_path / f"data-{level}", "--log-level", level, partitions=4, ready=False
        )
        port = TEXT_LISTENING.match(daemon.stdout_lines[0])[1]  # type: ignore[index]
        async with aiohttp.ClientSession() as session:
            api = Api(session, f"http://127.0.0.1:{port}")
            await api.wait_ready()
            assert (await api.request("GET", "/healthz")).status == 200
        assert await asyncio.to_thread(daemon.terminate) == 0
        _, stderr = await asyncio.to_thread(output, daemon)
        lines = [s for s in stderr if "sharecoord.access" in s and "path=/healthz" in s]
        assert len(lines) == expected, stderr
        if expected:
            assert " DEBUG sharecoord.access request method=GET path=/healthz " in lines[0]


# --- when off, the middleware is not there at all -------------------------------------------


def app_middlewares(**flags: str) -> list[Any]:
    config = load_serve_config(argparse.Namespace(data_dir="unused", **flags), {})
    return list(create_app(Node(config, config.cluster_map)).middlewares)


def test_the_access_log_is_not_installed_when_off() -> None:
    plain = app_middlewares()
    assert not any(m.__name__ == "access_log" for m in plain)
    assert app_middlewares(log_level="warning", access_log="true") == plain
    for flags in ({"access_log": "true"}, {"log_level": "debug"}):
        with_log = app_middlewares(**flags)
        assert with_log[0].__name__ == "access_log"  # first: it sees every answer
        assert with_log[1:] == plain


def test_the_access_log_level_follows_the_flag_and_the_log_level() -> None:
    def config(**flags: str) -> Any:
        return load_serve_config(argparse.Namespace(**flags), {})

    assert access_log_middleware(config()) is None
    assert access_log_middleware(config(access_log="false", log_level="info")) is None
    assert access_log_middleware(config(access_log="true")) is not None
    assert access_log_middleware(config(log_level="debug")) is not None


async def test_sigterm_cuts_a_request_whose_body_never_comes_and_counts_it_cut_off(spawn, tmp_path):
    """A request still waiting for its body at SIGTERM may wait forever: the shutdown
    cuts it at once (no answer, the connection closed) and counts it cut off, instead of
    waiting for it up to --shutdown-timeout-s. Both timeouts are 600 s here, so a daemon
    that waits for the body is still running at STOP_TIMEOUT_S."""
    daemon = await spawn(
        tmp_path / "data", "--shutdown-timeout-s", "600", "--request-timeout-s", "600"
    )
    reader, writer = await asyncio.open_connection(daemon.host, daemon.port)
    try:
        writer.write(
            b"POST /v1/share-group-state/read HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        # The interim answer comes from the handler's route: the request is in flight.
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b'{"group_id": "g", ')
        await writer.drain()
        daemon.signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait) == 0
        assert await reader.read() == b""  # closed without an answer
    finally:
        writer.close()
    stderr = await asyncio.to_thread(daemon.stderr_text)
    (stopping,) = [line for line in stderr.splitlines() if "sharecoord.daemon stopping" in line]
    assert "in_flight=1 bodies_cut=1" in stopping
    (stopped,) = [line for line in stderr.splitlines() if "sharecoord.daemon stopped" in line]
    assert "drained=0 cut_off=1 final_commit=done" in stopped
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("flush", ["kernel", "thread"])
async def test_the_start_says_who_flushes_the_journal(
    spawn: Spawn, tmp_path: Path, flush: str
) -> None:
    daemon = await spawn(tmp_path / "data", "--journal-flush", flush, "--log-level", "info")
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        init = body(GROUP, (TOPIC, [init_entry(0)]))
        assert await api.codes("initialize", init) == [0]
    assert await asyncio.to_thread(daemon.terminate) == 0
    _, stderr = await asyncio.to_thread(output, daemon)
    said = [line for line in stderr if "journal flush: by the kernel (Linux AIO)" in line]
    assert len(said) == (1 if flush == "kernel" else 0), stderr
    assert not [line for line in stderr if "journal flush: in the commit thread" in line]
