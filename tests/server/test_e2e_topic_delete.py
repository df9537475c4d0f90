"""Deleting a topic, step by step, against real daemons (docs/api.md#admin-endpoints;
docs/semantics.md §A, "Topic catalog"; docs/operations.md#deleting-a-topic).

A delete has three steps: the catalog durably marks the topic as being deleted (its
RPCs answer 3 from then on), every share-partition of it gets a tombstone, and once the
tombstones are durable the mark goes.

* Killed (SIGKILL, a crash point of ``SHARECOORD_FAILPOINTS``) at each step, the daemon
  restarts with the topic untouched (killed before the mark was on disk) or finishes
  the deletion before ``/readyz`` says ready: then no key has state, RPCs answer 3, and
  registering the topic again starts from nothing.
* With a state partition failed, the DELETE answers 503 and the topic is unregistered
  at once; the active partitions are tombstoned, the failed one's state stays out of
  reach (15), registering the topic again is refused, and once the partition is back
  the deletion is finished: by the daemon on its own, by registering the topic again
  (which then starts from nothing) or by deleting it again.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol import errors
from server.catalog import CATALOG_FILE
from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    init_entry,
    partitions_in,
    read_entry,
    wait_until,
    write_entry,
)
from tests.server.test_e2e_faults import arm, clear

NUM_PARTITIONS = 4
FAULTY = 1
GROUP = "topic-delete"
KEYS = {p: partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=3) for p in range(NUM_PARTITIONS)}
EVERY_KEY = sorted(k for keys in KEYS.values() for k in keys)
TOPIC_PARTITIONS = max(EVERY_KEY) + 1
# No checkpoint while a test runs: the only journal writes are the test's own.
FLAGS = ("--topic-catalog", "--journal-checkpoint-interval-ms", "600000")


def read_catalog(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / CATALOG_FILE).read_text())  # type: ignore[no-any-return]


async def register_and_write(api: Api, keys: list[int]) -> None:
    assert (await api.register_topic(TOPIC, TOPIC_PARTITIONS)).status == 200
    assert set(
        await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(k, 1, 5) for k in keys])))
    ) == {0}
    writes = [write_entry(k, batch(5, 9, 2, 1), state_epoch=1, leader_epoch=2) for k in keys]
    assert set(await api.codes("write", body(GROUP, (TOPIC, writes)))) == {0}


INITIALIZES = body(GROUP, (TOPIC, [init_entry(k, 1, 0) for k in EVERY_KEY]))
READS = body(GROUP, (TOPIC, [read_entry(k, 2) for k in EVERY_KEY]))


async def expect_deleted(api: Api) -> None:
    """No key of the topic has state, its RPCs are refused, a second delete finds
    nothing; registered again, every key starts from nothing."""
    for key in EVERY_KEY:
        assert await api.state(GROUP, TOPIC, key) is None, key
    assert set(await api.codes("initialize", INITIALIZES)) == {errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert set(await api.codes("read", READS)) == {errors.INVALID_REQUEST}  # uninitialized
    reply = await api.delete_topic(TOPIC)
    assert (reply.status, reply.body["error_code"]) == (404, errors.UNKNOWN_TOPIC_OR_PARTITION)
    assert (await api.register_topic(TOPIC, TOPIC_PARTITIONS)).status == 200
    await expect_fresh(api)


async def expect_fresh(api: Api) -> None:
    """The topic is registered and no key of it has old state: reads answer
    "uninitialized", and an initialize starts from nothing."""
    assert set(await api.codes("read", READS)) == {errors.INVALID_REQUEST}
    assert set(await api.codes("initialize", INITIALIZES)) == {errors.NONE}
    for key in EVERY_KEY:
        state = await api.state(GROUP, TOPIC, key)
        assert state is not None
        assert (state["snapshot_epoch"], state["fencing"]["leader_epoch"]) == (0, 0), state


# The rule of each crash point, and whether the mark is on disk when it strikes.
CRASH_POINTS = {
    "renaming the catalog file that marks the deletion": (
        {"op": "rename", "path_contains": CATALOG_FILE},
        False,
    ),
    # The mark is on disk; no tombstone is (killed before the journal write carrying them).
    "writing the tombstones": ({"op": "write", "path_contains": "journal/"}, True),
    # The tombstones are durable; the mark is still on disk.
    "renaming the catalog file that ends the deletion": (
        {"op": "rename", "path_contains": CATALOG_FILE, "after": 1},
        True,
    ),
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
async def test_a_crash_at_each_step_of_a_delete_leaves_it_undone_or_finished(
    spawn, tmp_path, point
):
    rule, marked = CRASH_POINTS[point]
    control = tmp_path / "failpoints.json"
    data_dir = tmp_path / "data"
    env = {"SHARECOORD_FAILPOINTS": str(control)}
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS, env=env)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        await register_and_write(api, EVERY_KEY)
        await arm(control, crash=True, **rule)
        with pytest.raises(aiohttp.ClientError):
            await api.delete_topic(TOPIC)
        assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
        catalog = await asyncio.to_thread(read_catalog, data_dir)
        assert (TOPIC in catalog.get("deleting", []), TOPIC in catalog["topics"]) == (
            marked,
            not marked,
        ), catalog
        await clear(control)

        daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS, env=env)
        api = Api(session, daemon.url, "msgpack")
        # Ready: a deletion the crash left unfinished was finished before.
        catalog = await asyncio.to_thread(read_catalog, data_dir)
        assert "deleting" not in catalog, catalog
        if not marked:  # the delete never happened: every state is there; delete again
            for key in EVERY_KEY:
                assert await api.state(GROUP, TOPIC, key) is not None, key
            reply = await api.delete_topic(TOPIC)
            assert reply.body == {"error_code": 0, "deleted_share_partitions": len(EVERY_KEY)}
        await expect_deleted(api)


@pytest.mark.parametrize("finished", ["on its own", "by registering again", "by deleting again"])
async def test_a_delete_with_a_failed_partition_is_finished_once_it_is_back(
    spawn, tmp_path, finished
):
    control = tmp_path / "failpoints.json"
    env = {"SHARECOORD_FAILPOINTS": str(control)}
    # A checkpoint after every commit, so the partition's fsync fault shows at once.
    flags = ("--topic-catalog", "--journal-checkpoint-bytes", "1")
    daemon = await spawn(tmp_path / "data", *flags, partitions=NUM_PARTITIONS, env=env)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        await register_and_write(api, EVERY_KEY)
        # Reloading needs an fsync too: the partition stays failed while the fault is armed.
        await arm(
            control, op="fsync", errno="EIO", path_contains=f"partitions/{FAULTY}/", times=None
        )
        await wait_until_failed(api)

        reply = await api.delete_topic(TOPIC)
        assert (reply.status, reply.body["error_code"]) == (503, errors.COORDINATOR_NOT_AVAILABLE)
        message = reply.body["error_message"]
        assert f"state partitions [{FAULTY}]" in message and "finishes" in message, message
        # Unregistered at once: refused everywhere, tombstoned where the partition is active.
        codes = await api.codes(
            "initialize", body(GROUP, (TOPIC, [init_entry(k, 1, 0) for k in EVERY_KEY]))
        )
        for key, code in zip(EVERY_KEY, codes, strict=True):
            on_faulty = key in KEYS[FAULTY]
            assert code == (
                errors.COORDINATOR_NOT_AVAILABLE if on_faulty else errors.UNKNOWN_TOPIC_OR_PARTITION
            )
        for key in EVERY_KEY:
            if key in KEYS[FAULTY]:
                reply = await api.admin_state(GROUP, TOPIC, key)
                assert (reply.status, reply.body["error_code"]) == (
                    503,
                    errors.COORDINATOR_NOT_AVAILABLE,
                )
            else:
                assert await api.state(GROUP, TOPIC, key) is None, key
        # Registering it again would bring back the failed partition's state: refused.
        reply = await api.register_topic(TOPIC, TOPIC_PARTITIONS)
        assert (reply.status, reply.body["error_code"]) == (503, errors.COORDINATOR_NOT_AVAILABLE)

        await clear(control)
        if finished == "on its own":
            await wait_until(
                lambda: api.admin_state(GROUP, TOPIC, KEYS[FAULTY][0]),
                "the deletion to be finished",
                until=lambda reply: reply.status == 404,
            )
            await expect_deleted(api)
        elif finished == "by registering again":
            # Refused (503) until the partition is back; then it deletes, and registers.
            await wait_until(
                lambda: api.register_topic(TOPIC, TOPIC_PARTITIONS),
                "the topic to be registered again",
                until=lambda reply: reply.status == 200,
            )
            await expect_fresh(api)
        else:
            # 503 until the partition is back; 404 if the daemon finished it first.
            await wait_until(
                lambda: api.delete_topic(TOPIC),
                "the deletion to be finished",
                until=lambda reply: reply.status in (200, 404),
            )
            await expect_deleted(api)


async def wait_until_failed(api: Api) -> None:
    """Write the faulty partition's keys until its checkpoint's fsync stops it."""
    entries = [
        write_entry(k, batch(10, 12, 0, 1), state_epoch=1, leader_epoch=2) for k in KEYS[FAULTY]
    ]
    await wait_until(
        lambda: api.codes("write", body(GROUP, (TOPIC, entries))),
        "the faulty partition's writes to fail",
        until=lambda codes: set(codes) == {errors.COORDINATOR_NOT_AVAILABLE},
    )
    ready = await api.readyz()
    assert (ready.status, ready.body["failed_partitions"]) == (200, [FAULTY])
