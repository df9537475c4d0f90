"""A daemon loading a large log (docs/api.md#health-and-metrics, error 14;
docs/semantics.md §8 on loading).

The data directory is written directly with ``persistence.StateLog`` and the record
encoders: one state partition holds a snapshot per key and a few hundred thousand
updates, so replaying it takes a while. From the first moment the port answers,
/readyz says 503 ``loading`` and an RPC to a key of that partition answers 14 in its
result, while a key of a loaded partition in the same request is served. If this
machine loads faster than the test can look, the log is made bigger and the test tried
again: nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from persistence import StateLog
from protocol.records import ShareKey, ShareSnapshot, ShareUpdate, encode_key, encode_value
from protocol.state_batch import StateBatch
from tests.harness import (
    TOPIC,
    Api,
    Daemon,
    body,
    partitions_in,
    read_entry,
    run_cli,
    wait_until,
)

NUM_PARTITIONS = 4
BIG = 2  # the state partition with the large log
GROUP = "loading"
KEYS = partitions_in(BIG, NUM_PARTITIONS, group_id=GROUP, count=50)
ELSEWHERE = partitions_in(0, NUM_PARTITIONS, group_id=GROUP)[0]  # a key of partition 0
FIRST_UPDATES = 100_000
MAX_TRIES = 6
MSG_LOADING = "The coordinator is loading and hence can't process requests."


@dataclass(frozen=True)
class BigLog:
    path: Path
    expected: dict[int, dict[str, Any]]  # key's partition -> admin state


def build_log(data_dir: Path, updates: int) -> BigLog:
    """A snapshot per key, then ``updates`` updates round-robin; each update's start
    offset is past the previous batch, so the final state is known exactly."""
    log = StateLog.open(data_dir, NUM_PARTITIONS)
    try:
        partition = log.partition(BIG)
        partition.open()
        keys = [ShareKey(GROUP, TOPIC, p) for p in KEYS]
        encoded = [encode_key(k) for k in keys]
        for key, key_bytes in zip(keys, encoded, strict=True):
            snapshot = ShareSnapshot(key, 0, 1, 0, 0, 1, 1, [], 0, 0, 1)
            partition.append(0, key_bytes, encode_value(snapshot), 1)
        expected: dict[int, dict[str, Any]] = {}
        for j in range(updates):
            i, rnd = j % len(keys), j // len(keys) + 1
            start = rnd * 10
            update = ShareUpdate(keys[i], 0, rnd, start, [StateBatch(start, start + 5, 2, 1)], j)
            partition.append(1, encoded[i], encode_value(update), 1)
            if j % 20_000 == 0:
                partition.commit()
            expected[KEYS[i]] = {
                "group_id": GROUP,
                "topic_id": TOPIC,
                "partition": KEYS[i],
                "snapshot_epoch": 0,
                "state_epoch": 1,
                "leader_epoch": rnd,
                "start_offset": start,
                "delivery_complete_count": j,
                "state_batches": [
                    {
                        "first_offset": start,
                        "last_offset": start + 5,
                        "delivery_state": 2,
                        "delivery_count": 1,
                    }
                ],
                "fencing": {"state_epoch": 1, "leader_epoch": rnd},
            }
        partition.commit()
    finally:
        log.close()
    return BigLog(data_dir, expected)


@pytest.fixture(scope="module")
def big_logs(tmp_path_factory: pytest.TempPathFactory):
    """``make(updates)``: a copy of the log with that many updates (built once each)."""
    built: dict[int, BigLog] = {}
    root = tmp_path_factory.mktemp("big-logs")
    copies = 0

    def make(updates: int) -> BigLog:
        nonlocal copies
        if updates not in built:
            built[updates] = build_log(root / f"template-{updates}", updates)
        copies += 1
        target = root / f"copy-{copies}"
        shutil.copytree(built[updates].path, target)
        return BigLog(target, built[updates].expected)

    return make


async def start_while_loading(
    spawn, big_logs, updates: int = FIRST_UPDATES
) -> tuple[Daemon, BigLog, Api, aiohttp.ClientSession, int]:
    """A daemon on a big log whose /readyz said 503 loading at its first answer;
    bigger logs until this machine is slow enough for that. Also returns the number of
    updates it took."""
    for _ in range(MAX_TRIES):
        log = await asyncio.to_thread(big_logs, updates)
        daemon = await spawn(log.path, partitions=NUM_PARTITIONS, ready=False)
        session = aiohttp.ClientSession()
        api = Api(session, daemon.url)
        ready = await api.readyz()
        if ready.status == 503:
            assert ready.body == {"status": "loading", "failed_partitions": [], "failures": []}
            return daemon, log, api, session, updates
        await session.close()
        assert await asyncio.to_thread(daemon.terminate) == 0
        updates *= 2
    pytest.fail(f"loading {updates // 2} updates was over before /readyz first answered")


async def partition_statuses(api: Api) -> list[str]:
    listing = await api.request("GET", "/v1/admin/partitions")
    assert listing.status == 200
    return [p["status"] for p in listing.body["partitions"]]


async def test_a_loading_partition_answers_14_and_readyz_503_until_loaded(spawn, big_logs):
    updates = FIRST_UPDATES
    for _ in range(MAX_TRIES):
        daemon, log, api, session, updates = await start_while_loading(spawn, big_logs, updates)
        updates *= 2  # for the next try, if there is one
        async with session:
            # The empty partitions load at once (but on a busy machine, not before the
            # first request): wait for the one of ELSEWHERE.
            statuses = await wait_until(
                partial(partition_statuses, api),
                "state partition 0 to be loaded",
                until=lambda statuses: statuses[0] != "loading",
                max_pause=0.01,
            )
            if statuses[BIG] != "loading":
                assert await asyncio.to_thread(daemon.terminate) == 0
                continue
            # Both kinds in one request: the loaded partition serves, the loading one 14.
            results = await api.results(
                "read-summary", body(GROUP, (TOPIC, [read_entry(KEYS[0]), read_entry(ELSEWHERE)]))
            )
            if results[0]["error_code"] == 0:
                # Loaded between the two requests: try again with a fresh daemon.
                assert await asyncio.to_thread(daemon.terminate) == 0
                continue
            assert results == [
                {
                    "partition": KEYS[0],
                    "error_code": 14,
                    "error_message": MSG_LOADING,
                    "state_epoch": 0,
                    "leader_epoch": 0,
                    "start_offset": 0,
                    "delivery_complete_count": -1,
                },
                {
                    "partition": ELSEWHERE,
                    "error_code": 0,
                    "error_message": None,
                    "state_epoch": 0,
                    "leader_epoch": 0,
                    "start_offset": -1,
                    "delivery_complete_count": -1,
                },
            ]
            # Every RPC answers 14 for it; admin state says so too; /readyz stays 503
            # until the partition is loaded, /healthz is fine throughout.
            assert (await api.request("GET", "/healthz")).status == 200
            codes = []
            for rpc, entry in (
                ("read", read_entry(KEYS[1], 1)),
                (
                    "write",
                    {
                        **read_entry(KEYS[1]),
                        "state_epoch": 1,
                        "start_offset": -1,
                        "state_batches": [],
                    },
                ),
                ("initialize", {"partition": KEYS[1], "state_epoch": 1, "start_offset": 0}),
                ("delete", {"partition": KEYS[1]}),
            ):
                codes.append((await api.codes(rpc, body(GROUP, (TOPIC, [entry]))))[0])
            state = await api.admin_state(GROUP, TOPIC, KEYS[1])
            ready = await api.readyz()
            if ready.status == 503:
                assert codes == [14, 14, 14, 14], codes
                assert (state.status, state.body["error_code"]) == (503, 14)
                listing = await api.request("GET", "/v1/admin/partitions")
                status = listing.body["partitions"][BIG]
                assert status["status"] == "loading"
            await api.wait_ready()
            ready = await api.readyz()
            ready_body = {"status": "ready", "failed_partitions": [], "failures": []}
            assert (ready.status, ready.body) == (200, ready_body)
            # Loaded: the state is exactly what the log says, and the partition serves.
            # (Any 14 above changed nothing.)
            for partition, expected in log.expected.items():
                assert await api.state(GROUP, TOPIC, partition) == expected
            assert (
                await api.codes("read", body(GROUP, (TOPIC, [read_entry(KEYS[0], 10**6)])))
            ) == [0]
        assert await asyncio.to_thread(daemon.terminate) == 0
        return
    pytest.fail("the big partition always finished loading between two requests")


async def replaying_big(spawn, big_logs) -> tuple[Daemon, BigLog]:
    """A daemon whose big partition is being replayed right now: the partitions before
    it in the load order are loaded (so its load has begun) and it is still loading."""
    updates = FIRST_UPDATES
    for _ in range(MAX_TRIES):
        daemon, log, api, session, updates = await start_while_loading(spawn, big_logs, updates)
        updates *= 2
        async with session:
            statuses = await wait_until(
                partial(partition_statuses, api),
                f"the state partitions before {BIG} to be loaded",
                until=lambda statuses: "loading" not in statuses[:BIG],
                max_pause=0.01,
            )
        if statuses[BIG] == "loading":
            return daemon, log
        assert await asyncio.to_thread(daemon.terminate) == 0
    pytest.fail("the big partition always finished loading before it could be seen loading")


async def test_sigterm_while_loading_stops_the_load_and_exits_0(spawn, big_logs):
    for _ in range(MAX_TRIES):
        daemon, log = await replaying_big(spawn, big_logs)
        daemon.signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait) == 0
        stderr = await asyncio.to_thread(daemon.stderr_text)
        assert "Traceback" not in stderr, stderr
        assert "state log closed" in stderr
        # The daemon did not sit out the load: it stopped replaying, and said so.
        if f"state partition {BIG}: loading stopped" in stderr:
            break
        # On a busy machine the load can end between the status seen and the signal:
        # there was nothing left to stop. Again, with a fresh daemon.
    else:
        pytest.fail(f"the big partition always finished loading before SIGTERM: {stderr}")
    # Nothing was harmed: the log verifies and a new daemon loads it all.
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(log.path))
    assert verify.returncode == 0, verify.stdout
    daemon = await spawn(log.path, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        for partition, expected in log.expected.items():
            assert await api.state(GROUP, TOPIC, partition) == expected
