"""The daemon harness against a real ``sharecoord serve``: a config becomes the flags, the
start waits for readiness, a restart finds the same port, a daemon that cannot start
says why, and what it printed is kept."""

from __future__ import annotations

import asyncio
import json
import signal
import stat
from pathlib import Path

import aiohttp
import pytest

from tests.harness import Api, DaemonExited, Daemons, Spawn, metric_value
from tests.kafka_client import kafka_address


async def test_a_started_daemon_is_ready_and_comes_back_on_its_port(
    daemons: Daemons, tmp_path: Path
) -> None:
    daemon = daemons.make(tmp_path / "data", "--log-format", "json", partitions=3)
    await asyncio.to_thread(daemon.start)
    assert await asyncio.to_thread(daemon.readyz) == 200  # ready once start returned
    assert json.loads(daemon.stdout_lines[0])["msg"] == "listening"
    url = daemon.url
    async with aiohttp.ClientSession() as session:
        text = await Api(session, url).metrics()
    assert metric_value(text, "sharecoord_partition_status", partition="2", status="active")
    assert metric_value(text, "sharecoord_partition_status", partition="3", status="active") == 0

    assert await asyncio.to_thread(daemon.kill) == -signal.SIGKILL
    await asyncio.to_thread(daemon.start)
    assert daemon.url == url  # the same port: its clients find it where it was
    assert await asyncio.to_thread(daemon.terminate) == 0
    stderr = await asyncio.to_thread(daemon.stderr_text)
    said = [json.loads(line)["msg"] for line in stderr.splitlines()]
    assert said.count("stopped") == 1  # one clean stop, and both starts' lines kept


async def test_a_token_and_a_kafka_listener_come_from_the_config(
    spawn: Spawn, tmp_path: Path
) -> None:
    daemon = await spawn(tmp_path / "data", token="s3cr3t", kafka_listener="127.0.0.1:0")
    assert daemon.token_file is not None
    mode = (await asyncio.to_thread(daemon.token_file.stat)).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert kafka_address(daemon.stdout_lines)[0] == "127.0.0.1"
    async with aiohttp.ClientSession() as session:
        admin = "/v1/admin/partitions"
        assert (await Api(session, daemon.url).request("GET", admin)).status == 401
        assert (await Api(session, daemon.url, token="s3cr3t").request("GET", admin)).status == 200


async def test_a_daemon_that_cannot_start_says_why(spawn: Spawn, tmp_path: Path) -> None:
    with pytest.raises(DaemonExited) as info:
        await spawn(tmp_path / "data", "--no-such-flag")
    assert info.value.code == 2
    assert "--no-such-flag" in info.value.stderr
