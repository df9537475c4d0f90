"""Issue #7, item 2: disk faults under a running writer.

ENOSPC and EIO are injected at write (also as short writes) and at fsync through the
fault-injecting file layer (``SHARECOORD_FAILPOINTS``; the tests run as root, so file
permissions prove nothing). In every round a random fault hits a random state partition
(or all of them) while the writer runs: the entries of the faulty partition answer 15,
nothing acknowledged is lost, an entry answered 15 never becomes visible — neither while
the daemon runs nor after a restart — and once the fault is cleared the partition serves
again. Some rounds end in a SIGKILL with the fault still armed.

Two targeted cases come first: a request whose records straddle a segment roll that fails
half way, and a disk that fails while the daemon loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from persistence import list_segments, partition_dir
from tests.reliability.model import Model
from tests.reliability.traffic import admin_states
from tests.server.daemons import (
    TOPIC,
    Acknowledged,
    Api,
    body,
    next_write,
    partitions_in,
    read_entry,
)

FAILPOINTS = "SHARECOORD_FAILPOINTS"
DEADLINE_S = 120.0  # a safety net, not a timing assertion
NUM_PARTITIONS = 4
GROUPS = ["faults-a", "faults-b"]
PARTITIONS_PER_GROUP = 6


def write_control(path: Path, faults: list[dict[str, Any]]) -> None:
    # Replaced atomically: the daemon never reads half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": faults}))
    os.replace(tmp, path)


async def arm(path: Path, *faults: dict[str, Any]) -> None:
    await asyncio.to_thread(write_control, path, list(faults))


async def statuses(api: Api) -> list[dict[str, Any]]:
    reply = await api.request("GET", "/v1/admin/partitions")
    assert reply.status == 200, reply.body
    return reply.body["partitions"]  # type: ignore[no-any-return]


async def wait_all_active(api: Api) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        listing = await statuses(api)
        if all(p["status"] == "active" for p in listing):
            return
        assert time.monotonic() < deadline, f"partitions did not recover: {listing}"
        await asyncio.sleep(0.02)


async def check_exact(session: aiohttp.ClientSession, url: str, model: Model, rng) -> None:
    """Every key shows exactly the state the model holds (nothing lost, nothing extra)."""
    wrong = []
    for key, shown in (await admin_states(session, url, model, rng)).items():
        if not model.reconcile(key, shown):
            wrong.append(f"{key}: {shown} not in {model.possible[key]}")
    assert not wrong, "\n".join(wrong)


# --- a request whose records straddle a failed segment roll ------------------------------


def active_segment_size(data_dir: Path, partition: int) -> tuple[int, int]:
    segments = list_segments(partition_dir(str(data_dir), partition))
    return len(segments), segments[-1].size_bytes


@pytest.mark.parametrize(
    "fault",
    [
        {"op": "open", "errno": "ENOSPC"},  # the roll cannot create the next segment
        {"op": "fsync_dir", "errno": "EIO"},  # ... or cannot make it durable
        {"op": "write", "errno": "ENOSPC", "after": 1},  # the frames after the roll fail
    ],
    ids=["roll-open", "roll-fsync", "write-after-roll"],
)
async def test_an_entry_made_durable_before_a_failed_roll_is_answered_as_it_is(
    spawn, tmp_path, fault
):
    """One request, two entries on one state partition; the first entry's record is the
    last to fit the active segment, the second's rolls a new one, and the roll (or the
    write after it) fails. The first record was fsynced before the roll: whatever the
    answer says about each entry must be what a reload, and a restart, show."""
    control = tmp_path / "failpoints.json"
    data_dir = tmp_path / "data"
    daemon = await spawn(
        data_dir, "--segment-bytes", "1024", partitions=1, env={FAILPOINTS: str(control)}
    )
    rng = random.Random(5)
    model = Acknowledged("roll", [0, 1])
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert await api.codes("initialize", model.init_body()) == [0, 0]
        # One write of key 0 at a time until one more record would not fit, then both.
        while True:
            segments, size = await asyncio.to_thread(active_segment_size, data_dir, 0)
            entry, expected = next_write(rng, 0, model.acked[0])
            assert await api.codes("write", body("roll", (TOPIC, [entry]))) == [0]
            model.acked[0] = expected
            grown_segments, grown = await asyncio.to_thread(active_segment_size, data_dir, 0)
            frame = grown - size
            if grown_segments == segments and 1024 - frame < grown + frame <= 1024:
                break  # exactly one more frame of this size fits
        first, first_expected = next_write(rng, 0, model.acked[0])
        second, second_expected = next_write(rng, 1, model.acked[1])
        # Same shape as the frames measured: one batch, offsets of the same width.
        await arm(control, {**fault, "path_contains": "partitions/0/", "times": 1})
        results = await api.results("write", body("roll", (TOPIC, [first, second])))
        codes = [r["error_code"] for r in results]
        # The first record was fsynced before the roll: it is durable, and said so.
        assert codes == [0, 15], results
        await arm(control)
        deadline = time.monotonic() + DEADLINE_S
        while (await api.admin_state("roll", TOPIC, 0)).status != 200:
            assert time.monotonic() < deadline, "the partition did not recover"
            await asyncio.sleep(0.02)
        state = await api.state("roll", TOPIC, 0)
        if codes[0] == 0:
            model.acked[0] = first_expected
        assert model.acked[0].matches(state), (codes, state)
        assert model.acked[1].matches(await api.state("roll", TOPIC, 1))
    assert await asyncio.to_thread(daemon.terminate) == 0
    daemon = await spawn(data_dir, "--segment-bytes", "1024", partitions=1)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert model.acked[0].matches(await api.state("roll", TOPIC, 0)), codes
        assert model.acked[1].matches(await api.state("roll", TOPIC, 1))
    del second_expected


# --- a disk that fails while the daemon loads ---------------------------------------------


@pytest.mark.parametrize("op", ["fsync", "open", "read"])
async def test_a_partition_whose_disk_fails_while_loading_serves_once_the_fault_clears(
    spawn, tmp_path, op
):
    control = tmp_path / "failpoints.json"
    data_dir = tmp_path / "data"
    faulty = 1
    keys = partitions_in(faulty, NUM_PARTITIONS, group_id="load", count=2)
    other = partitions_in(0, NUM_PARTITIONS, group_id="load", count=1)
    model = Acknowledged("load", keys + other)
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
    assert await asyncio.to_thread(daemon.terminate) == 0

    await arm(
        control, {"op": op, "errno": "EIO", "path_contains": f"partitions/{faulty}/", "times": None}
    )
    daemon = await spawn(
        data_dir, partitions=NUM_PARTITIONS, env={FAILPOINTS: str(control)}, ready=False
    )
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        deadline = time.monotonic() + DEADLINE_S
        while (await api.readyz()).status != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        ready = await api.readyz()
        assert ready.body["failed_partitions"] == [faulty], ready.body
        listing = await statuses(api)
        assert listing[faulty]["status"] == "failed"
        assert "Input/output error" in listing[faulty]["error"], listing[faulty]
        summary = await api.results("read-summary", body("load", (TOPIC, [read_entry(keys[0])])))
        assert summary[0]["error_code"] == 15
        assert await api.state("load", TOPIC, other[0]) is not None  # the others serve

        await arm(control)
        await wait_all_active(api)
        await model.check(api)
        entry, expected = next_write(random.Random(1), keys[0], model.acked[keys[0]])
        assert await api.codes("write", body("load", (TOPIC, [entry]))) == [0]
        model.acked[keys[0]] = expected
        await model.check(api)


# --- a crash right after a 15 ----------------------------------------------------------------


@pytest.mark.parametrize(
    "faults",
    [
        [{"op": "fsync", "errno": "EIO", "times": None}],
        # Half of a three-frame write lands (a whole frame and a bit); the fsync fault
        # keeps the reload from cutting it before the kill.
        [
            {"op": "write", "errno": "ENOSPC", "short_write": True, "times": 1},
            {"op": "fsync", "errno": "EIO", "times": None, "after": 1},
        ],
    ],
    ids=["fsync-eio", "short-write"],
)
async def test_entries_answered_15_stay_invisible_after_a_crash(spawn, tmp_path, faults):
    """SIGKILL while the partition is still failed: what its entries were answered 15 for
    was written to the file but never fsynced, and the restart must not replay it."""
    control = tmp_path / "failpoints.json"
    data_dir = tmp_path / "data"
    keys = partitions_in(0, 1, group_id="after15", count=3)
    model = Acknowledged("after15", keys)
    daemon = await spawn(data_dir, partitions=1, env={FAILPOINTS: str(control)})
    rng = random.Random(9)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert await api.codes("initialize", model.init_body()) == [0, 0, 0]
        await arm(control, *({**f, "path_contains": "partitions/0/"} for f in faults))
        writes = [next_write(rng, k, model.acked[k]) for k in keys]
        codes = await api.codes("write", body("after15", (TOPIC, [e for e, _ in writes])))
        assert codes == [15, 15, 15]
    os.kill(daemon.pid, signal.SIGKILL)
    assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
    daemon = await spawn(data_dir, partitions=1)
    async with aiohttp.ClientSession() as session:
        await model.check(Api(session, daemon.url))
