"""Deleting a topic while its share-partitions are initialized and written
(docs/api.md#admin-endpoints, ``DELETE /v1/admin/topics/{topic_id}``; docs/semantics.md
§A, "Topic catalog").

A daemon runs with ``--topic-catalog``. Each run deletes the topic in the middle of
writers that initialize and write random share-partitions of it as fast as they can.
Every RPC that races the delete must be ordered either before it (its state is then
tombstoned) or after it (refused). So once the DELETE has answered 200:

* every RPC sent after the 200 answers 3 (initialize) or 42 (write: the key has no
  state);
* no key of the topic has state: its admin read answers 404 and a read answers 42
  ("uninitialized");
* once the topic is registered again, no old state comes back: reads still answer 42,
  and an initialize starts from nothing (snapshot epoch 0, leader fence 0).

Before the fix the DELETE tombstoned first and unregistered last, so RPCs arriving in
between created state that outlived it: 10 to 37 keys per run.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol import errors
from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    init_entry,
    read_entry,
    write_entry,
)

TOPIC_PARTITIONS = 32
GROUPS = ("topic-delete-a", "topic-delete-b", "topic-delete-c", "topic-delete-d")
KEYS = [(group, partition) for group in GROUPS for partition in range(TOPIC_PARTITIONS)]
# Answers an RPC may get while it races the delete: applied (0), refused because the
# topic is already being deleted (3), a write of a key not initialized yet (42), or a
# commit that outlived write_timeout_ms on a busy machine (15).
RACING = {
    "initialize": {
        errors.NONE,
        errors.UNKNOWN_TOPIC_OR_PARTITION,
        errors.COORDINATOR_NOT_AVAILABLE,
    },
    "write": {
        errors.NONE,
        errors.UNKNOWN_TOPIC_OR_PARTITION,
        errors.INVALID_REQUEST,
        errors.COORDINATOR_NOT_AVAILABLE,
    },
}
# The only answers once the DELETE answered 200: the topic is unknown, and no key has state.
AFTER = {"initialize": errors.UNKNOWN_TOPIC_OR_PARTITION, "write": errors.INVALID_REQUEST}


@dataclass
class Race:
    """What the writers of one run saw."""

    writers: int
    deleted: bool = False  # the DELETE answered 200
    stopped: bool = False
    sent_before: int = 0  # RPCs sent before the 200
    sent_after: int = 0  # RPCs sent after it
    applied: int = 0  # entries answered 0
    wrong_after: list[str] = field(default_factory=list)
    busy: asyncio.Event = field(default_factory=asyncio.Event)  # enough applied to delete
    seen_after: asyncio.Event = field(default_factory=asyncio.Event)  # enough sent after

    def answered(self, rpc: str, group: str, entries: list[Any], codes: list[int], after: bool):
        partitions = [entry["partition"] for entry in entries]
        if after:
            self.sent_after += 1
            if set(codes) != {AFTER[rpc]}:
                self.wrong_after.append(f"{rpc} {group} {partitions} after the 200: {codes}")
            if self.sent_after >= 4 * self.writers:
                self.seen_after.set()
            return
        self.sent_before += 1
        assert set(codes) <= RACING[rpc], (rpc, group, partitions, codes)
        self.applied += codes.count(errors.NONE)
        if self.applied >= 8 * self.writers:
            self.busy.set()


async def writer(api: Api, rng: random.Random, race: Race) -> None:
    """Initialize a few share-partitions of one group, then write them, until stopped."""
    while not race.stopped:
        group = rng.choice(GROUPS)
        partitions = rng.sample(range(TOPIC_PARTITIONS), rng.randint(1, 3))
        start = rng.randrange(1000)
        requests = (
            ("initialize", [init_entry(p, 0, start) for p in partitions]),
            (
                "write",
                [
                    write_entry(
                        p,
                        batch(start, start + rng.randrange(50), rng.choice((0, 1, 2, 4)), 1),
                        start_offset=start,
                    )
                    for p in partitions
                ],
            ),
        )
        for rpc, entries in requests:
            after = race.deleted
            codes = await api.codes(rpc, body(group, (TOPIC, entries)))
            race.answered(rpc, group, entries, codes, after)


async def keys_with_state(api: Api) -> list[str]:
    """The keys of the topic that still have state, each with what showed it: a read
    (42 "uninitialized" if none) or the admin read (404 if none)."""
    found: dict[tuple[str, int], str] = {}
    for group in GROUPS:
        entries = [read_entry(p, 0) for p in range(TOPIC_PARTITIONS)]
        for result in await api.results("read", body(group, (TOPIC, entries))):
            if (result["error_code"], result["error_message"]) != (
                errors.INVALID_REQUEST,
                errors.MSG_READ_UNINITIALIZED,
            ):
                found[group, result["partition"]] = f"read answered {result}"
    for group, partition in KEYS:
        state = await api.state(group, TOPIC, partition)
        if state is not None:
            found.setdefault((group, partition), f"admin state {state}")
    return [f"{group}/{partition}: {shown}" for (group, partition), shown in found.items()]


async def old_states_after_registering_again(api: Api) -> list[str]:
    """Register the topic again: no key may have state, and an initialize of every key
    must start from nothing. The keys that showed old state, each with how."""
    reply = await api.register_topic(TOPIC, TOPIC_PARTITIONS)
    assert reply.status == 200, reply.body
    old = {line.partition(":")[0]: line for line in await keys_with_state(api)}
    for group in GROUPS:
        entries = [init_entry(p, 0, 0) for p in range(TOPIC_PARTITIONS)]
        assert set(await api.codes("initialize", body(group, (TOPIC, entries)))) == {0}
    for group, partition in KEYS:
        state = await api.state(group, TOPIC, partition)
        assert state is not None
        fresh = (state["snapshot_epoch"], state["fencing"]["leader_epoch"], state["state_batches"])
        if fresh != (0, 0, []):
            old.setdefault(f"{group}/{partition}", f"initialized on old state {state}")
    return list(old.values())


async def delete_under_writers(
    spawn: Any, data_dir: Path, runs: int, writers: int, seed: int, figures: Any
) -> None:
    rng = random.Random(seed)
    daemon = await spawn(data_dir, "--topic-catalog")
    problems: list[str] = []
    delete_ms: list[float] = []
    left_per_run: list[int] = []
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert (await api.register_topic(TOPIC, TOPIC_PARTITIONS)).status == 200
        for run in range(runs):
            race = Race(writers)
            tasks = [
                asyncio.create_task(writer(api, random.Random(rng.random()), race))
                for _ in range(writers)
            ]
            try:
                await race.busy.wait()
                started = time.monotonic()
                reply = await api.delete_topic(TOPIC)
                assert reply.status == 200, reply.body
                race.deleted = True
                delete_ms.append((time.monotonic() - started) * 1000)
                await race.seen_after.wait()
            finally:
                race.stopped = True
                await asyncio.gather(*tasks)
            left = await keys_with_state(api)
            old = await old_states_after_registering_again(api)
            problems += [f"run {run}: {line}" for line in race.wrong_after + left + old]
            figures.add("runs")
            figures.add("rpcs_sent_before_the_200", race.sent_before)
            figures.add("rpcs_sent_after_the_200", race.sent_after)
            figures.add("entries_applied_before_the_200", race.applied)
            figures.add("share_partitions_tombstoned", reply.body["deleted_share_partitions"])
            figures.add("rpcs_after_the_200_not_refused", len(race.wrong_after))
            figures.add("keys_with_state_after_the_200", len(left))
            left_per_run.append(len(left))
            figures.add("old_states_after_registering_again", len(old))
    figures.set("writers", writers)
    figures.set("keys_with_state_after_the_200_per_run", left_per_run)
    figures.set("delete_ms_max", round(max(delete_ms), 1))
    assert not problems, "\n".join(problems[:40]) + f"\n({len(problems)} in all)"


async def test_a_topic_delete_holds_under_concurrent_writers(spawn, tmp_path, figures):
    await delete_under_writers(spawn, tmp_path / "data", runs=2, writers=4, seed=1, figures=figures)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_a_topic_delete_holds_under_concurrent_writers_long(spawn, tmp_path, figures):
    await delete_under_writers(
        spawn, tmp_path / "data", runs=20, writers=16, seed=2, figures=figures
    )
