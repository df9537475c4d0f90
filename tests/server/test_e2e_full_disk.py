"""A daemon started on a really full disk (docs/operations.md#a-full-disk).

The data directory lives on a small tmpfs filled to ENOSPC by a filler file
(tests/fullfs.py): nothing is injected. A daemon restarted on it loads what is on disk,
answers reads (every acknowledged key reads back as acknowledged), answers writes 15,
says so on /readyz and /metrics, and creates no file (no empty temporary file either).
Once the filler is deleted it writes again by itself, and nothing acknowledged is lost.
Two ways to get there: a clean stop before the disk filled, and a SIGKILL after it
filled under writes (then the files lack what only the journal holds, and recovery has
work to do that needs the space).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from server.runtime import READS_SERVED
from tests.fullfs import FullFilesystem, full_filesystem, listing, no_temporary_files
from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    Daemons,
    body,
    metric_value,
    next_write,
    partitions_in,
    read_entry,
    run_cli,
    wait_until,
)

NUM_PARTITIONS = 4
GROUP = "full"
# Small segments, so that a few writes meet the full disk; a write timeout no busy
# machine reaches, so that every 15 is the disk's (a timed-out write may still land).
FLAGS = (
    "--journal-segment-bytes",
    "65536",
    "--segment-bytes",
    "4096",
    "--write-timeout-ms",
    "60000",
)


def the_keys() -> list[int]:
    return [
        key
        for p in range(NUM_PARTITIONS)
        for key in partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=2)
    ]


async def write_keys(
    api: Api, model: AcknowledgedGroup, rng: random.Random, keys: list[int]
) -> list[int]:
    """One write per key, in one request; the model learns what was acknowledged."""
    writes = {key: next_write(rng, key, model.exact(key)) for key in keys}
    codes = await api.codes("write", body(GROUP, (TOPIC, [e for e, _ in writes.values()])))
    for (key, (_, expected)), code in zip(writes.items(), codes, strict=True):
        if code == 0:
            model.acknowledge(key, expected)
    return codes


async def reads_served_everywhere(api: Api, partitions: int = NUM_PARTITIONS) -> None:
    """Wait until every partition says it serves reads (a partition whose write failed
    a moment ago may still be reading what is on disk)."""

    def served(failures: list[dict[str, Any]]) -> bool:
        return len(failures) == partitions and all(READS_SERVED in f["error"] for f in failures)

    async def failures() -> list[dict[str, Any]]:
        return (await api.readyz()).body["failures"]  # type: ignore[no-any-return]

    await wait_until(failures, "every partition to serve reads", until=served)


async def served_on_a_full_disk(api: Api, model: AcknowledgedGroup, rng: random.Random) -> None:
    """Reads answered from what is on disk, writes 15, and the daemon says why."""
    await model.check(api)  # every acknowledged key reads back as acknowledged
    keys = model.keys
    reads = await api.results("read", body(GROUP, (TOPIC, [read_entry(k) for k in keys])))
    for key, result in zip(keys, reads, strict=True):
        assert result["error_code"] == 0, result
        expected = model.exact(key)
        batches = tuple(tuple(b.values()) for b in result["state_batches"])
        assert (result["start_offset"], batches) == (
            expected.start_offset,
            expected.state_batches,
        )
    summaries = await api.codes(
        "read-summary", body(GROUP, (TOPIC, [{"partition": k} for k in keys]))
    )
    assert set(summaries) == {0}
    assert set(await write_keys(api, model, rng, keys)) == {15}
    assert set(await api.codes("initialize", model.init_body())) == {15}
    ready = await api.readyz()
    assert ready.status == 200, ready.body
    assert ready.body["failed_partitions"] == list(range(NUM_PARTITIONS)), ready.body
    for failure in ready.body["failures"]:
        assert READS_SERVED in failure["error"], failure
    metrics = await api.metrics()
    for p in range(NUM_PARTITIONS):
        assert (
            metric_value(metrics, "sharecoord_partition_status", partition=str(p), status="failed")
            == 1
        )


async def writes_again(api: Api, model: AcknowledgedGroup, rng: random.Random) -> None:
    """After the filler is deleted: writes are taken again, by themselves."""
    keys = model.keys
    await wait_until(
        lambda: write_keys(api, model, rng, keys),
        "a write of every key to be taken",
        until=lambda codes: set(codes) == {0},
    )
    ready = await api.readyz()
    assert ready.body["failed_partitions"] == [], ready.body
    await model.check(api)


async def no_trace_and_a_clean_log(daemons: Daemons, data_dir: Path) -> None:
    for daemon in daemons:
        stderr = await asyncio.to_thread(daemon.stderr_text)
        assert "Traceback" not in stderr, stderr
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_a_restart_on_a_full_disk_serves_reads_and_writes_once_space_returns(
    spawn: Any, daemons: Daemons, full_disk: FullFilesystem
) -> None:
    rng = random.Random(3)
    model = AcknowledgedGroup(GROUP, the_keys())
    data_dir = full_disk.path / "data"
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert set(await api.codes("initialize", model.init_body())) == {0}
        for _ in range(5):
            assert set(await write_keys(api, model, rng, model.keys)) == {0}
    assert await asyncio.to_thread(daemon.terminate) == 0
    before = await asyncio.to_thread(listing, data_dir)
    await asyncio.to_thread(full_disk.fill)

    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        await served_on_a_full_disk(Api(session, daemon.url), model, rng)
    # A stop on the full disk is a clean one (its last checkpoint waits for the next
    # start), and so is the start after it.
    assert await asyncio.to_thread(daemon.terminate) == 0
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        await served_on_a_full_disk(api, model, rng)
        # Nothing made at start: the same files, the same sizes (the PID aside).
        after = await asyncio.to_thread(listing, data_dir)
        no_temporary_files(after)
        assert {f: s for f, s in after.items() if f != "LOCK"} == {
            f: s for f, s in before.items() if f != "LOCK"
        }
        await asyncio.to_thread(full_disk.free)
        await writes_again(api, model, rng)
    assert await asyncio.to_thread(daemon.terminate) == 0
    await no_trace_and_a_clean_log(daemons, data_dir)


async def test_a_daemon_killed_on_a_full_disk_restarts_serving_what_it_acknowledged(
    spawn: Any, daemons: Daemons, full_disk: FullFilesystem
) -> None:
    """The disk fills under writes (the journal takes some still, the partitions' files
    do not), and the daemon goes on answering reads; SIGKILL; the restart on the
    still-full disk has frames to bring from the journal into the files, which needs
    space, and serves the reads meanwhile."""
    rng = random.Random(4)
    model = AcknowledgedGroup(GROUP, the_keys())
    data_dir = full_disk.path / "data"
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert set(await api.codes("initialize", model.init_body())) == {0}
        await asyncio.to_thread(full_disk.fill)
        acknowledged_when_full = 0

        async def write_every_key() -> list[int]:
            nonlocal acknowledged_when_full
            codes = await write_keys(api, model, rng, model.keys)
            acknowledged_when_full += codes.count(0)
            return codes

        # Until every partition failed: acknowledged writes are in the journal only.
        await wait_until(
            write_every_key, "every write to fail", until=lambda codes: set(codes) == {15}
        )
        assert acknowledged_when_full > 0
        # The disk filled under the running daemon: its reads go on all the same.
        await reads_served_everywhere(api)
        await served_on_a_full_disk(api, model, rng)
    os.kill(daemon.pid, signal.SIGKILL)
    assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL

    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    stderr = await asyncio.to_thread(daemon.stderr_text)
    assert "not caught up with the journal" in stderr, stderr  # recovery had work
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        await served_on_a_full_disk(api, model, rng)
        no_temporary_files(await asyncio.to_thread(listing, data_dir))
        await asyncio.to_thread(full_disk.free)
        await writes_again(api, model, rng)
    assert await asyncio.to_thread(daemon.terminate) == 0
    await no_trace_and_a_clean_log(daemons, data_dir)


def test_the_full_filesystem_helper_really_refuses_writes(tmp_path: Path) -> None:
    mount = tmp_path / "fs"
    mount.mkdir()
    with full_filesystem(mount, 1024 * 1024) as disk:
        assert disk.fill() > 0
        probe = disk.path / "probe"
        with pytest.raises(OSError, match="No space left on device"):
            probe.write_bytes(b"x" * 8192)
        disk.free()
        probe.write_bytes(b"x" * 8192)
