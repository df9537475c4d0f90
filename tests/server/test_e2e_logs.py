"""What a real daemon prints: in JSON mode nothing but JSON lines, the access log's
lines with their fields, and a shutdown line saying how many requests it drained.

The daemon runs as a child process with stdout and stderr in files, so every line it
ever printed is read back, not only the "listening" one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from server.config import load_serve_config
from server.http.access_log import access_log_middleware
from server.http.app import create_app
from server.node import Node
from tests.server.daemons import (
    REPO_ROOT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TOPIC,
    Api,
    body,
    child_env,
    init_entry,
    read_entry,
)

GROUP = "logs"
TEXT_LISTENING = re.compile(r"^sharecoord listening on http://127\.0\.0\.1:(\d+)$")
# A group commit waits this long for more writes: a write stays in flight that long.
LINGER_MS = 1500


@dataclass
class Child:
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    first_line: str

    def lines(self) -> tuple[list[str], list[str]]:
        return self.stdout.read_text().splitlines(), self.stderr.read_text().splitlines()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        if child.process.poll() is None:
            child.process.kill()
            child.process.wait()


def start(tmp_path: Path, *flags: str) -> Child:
    """``sharecoord serve`` with its output in files; returns once stdout has a line."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    command = [sys.executable, "-m", "server.commands.cli", "serve"]
    command += ["--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0"]
    command += ["--partitions", "4", *flags]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            cwd=REPO_ROOT,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while "\n" not in (text := out.read_text()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"no listening line; stderr: {err.read_text()}")
        time.sleep(0.02)
    return Child(process, out, err, text.splitlines()[0])


def stop(child: Child) -> int:
    child.process.send_signal(signal.SIGTERM)
    return child.process.wait(STOP_TIMEOUT_S)


async def appended(api: Api) -> int:
    reply = await api.request("GET", "/v1/admin/partitions")
    return sum(p["log_end_offset"] or 0 for p in reply.body["partitions"])


async def test_json_mode_prints_only_json_with_access_lines_and_the_drain(
    tmp_path: Path, children: list[Child]
) -> None:
    flags = ("--log-format", "json", "--access-log", "--append-linger-ms", str(LINGER_MS))
    child = await asyncio.to_thread(start, tmp_path, *flags)
    children.append(child)
    listening = json.loads(child.first_line)
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
        while await appended(api) < 2:
            assert not write.done(), write
            await asyncio.sleep(0.01)
        child.process.send_signal(signal.SIGTERM)
        assert [r["error_code"] for r in await write] == [0, 0]  # drained, not cut off
    assert await asyncio.to_thread(child.process.wait, STOP_TIMEOUT_S) == 0

    stdout, stderr = await asyncio.to_thread(child.lines)
    assert stdout == [child.first_line]  # nothing else on stdout
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
    tmp_path: Path, children: list[Child]
) -> None:
    child = await asyncio.to_thread(start, tmp_path, "--access-log")
    children.append(child)
    match = TEXT_LISTENING.match(child.first_line)
    assert match is not None, child.first_line
    async with aiohttp.ClientSession() as session:
        api = Api(session, f"http://127.0.0.1:{match[1]}")
        await api.wait_ready()
        await api.results("read", body(GROUP, (TOPIC, [read_entry(7)])))
    assert await asyncio.to_thread(stop, child) == 0
    stdout, stderr = await asyncio.to_thread(child.lines)
    assert stdout == [child.first_line]
    (line,) = [s for s in stderr if "path=/v1/share-group-state/read " in s]
    assert " INFO sharecoord.access request method=POST " in line
    assert "path=/v1/share-group-state/read status=200 entries=1 duration_ms=" in line
    (stopped,) = [s for s in stderr if "sharecoord.daemon stopped" in s]
    assert "drained=0 cut_off=0 final_commit=done" in stopped


async def test_without_the_flag_access_lines_come_at_debug_only(
    tmp_path: Path, children: list[Child]
) -> None:
    for level, expected in (("info", 0), ("debug", 1)):
        directory = tmp_path / level
        await asyncio.to_thread(directory.mkdir)
        child = await asyncio.to_thread(start, directory, "--log-level", level)
        children.append(child)
        port = TEXT_LISTENING.match(child.first_line)[1]  # type: ignore[index]
        async with aiohttp.ClientSession() as session:
            api = Api(session, f"http://127.0.0.1:{port}")
            await api.wait_ready()
            assert (await api.request("GET", "/healthz")).status == 200
        assert await asyncio.to_thread(stop, child) == 0
        _, stderr = await asyncio.to_thread(child.lines)
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
