"""A failing disk under a running daemon (docs/semantics.md §A, "write or fsync failure";
docs/design.md#recovery).

The daemon runs with ``SHARECOORD_FAILPOINTS`` naming a control file; a fault is armed for
one state partition's directory (its files' writes, or their fsyncs at a checkpoint) or
for the journal, while writes go to keys of that partition and of the others. A failing
partition stops and answers 15 alone, the others go on in the same request; once the
fault is cleared the partition repairs itself from the journal and serves again. A
failing journal fails every entry of the commit it carried. Every acknowledged write is
visible exactly while no write answered 15 ever is — also after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    Api,
    body,
    next_write,
    partitions_in,
    read_entry,
    run_cli,
    wait_until,
)

NUM_PARTITIONS = 4
FAULTY = 1
GROUP = "faults"
MSG_NOT_AVAILABLE = "Share coordinator is not available."

FAULTS = {
    "fsync EIO": {"op": "fsync", "errno": "EIO"},
    "write ENOSPC": {"op": "write", "errno": "ENOSPC"},
    "short write": {"op": "write", "errno": "EIO", "short_write": True},
}


def _write_control(path: Path, faults: list[dict[str, Any]]) -> None:
    # Replaced atomically: the daemon never reads half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"faults": faults}))
    os.replace(tmp, path)


async def arm(path: Path, **rule: Any) -> None:
    await asyncio.to_thread(_write_control, path, [rule])


async def clear(path: Path) -> None:
    await asyncio.to_thread(_write_control, path, [])


def keys_by_partition() -> dict[int, list[int]]:
    return {
        p: partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=3) for p in range(NUM_PARTITIONS)
    }


async def write(
    api: Api, model: AcknowledgedGroup, rng: random.Random, keys: list[int]
) -> dict[int, int]:
    """One write request for ``keys``; the model learns what was acknowledged. Returns
    each key's error code."""
    writes = {key: next_write(rng, key, model.exact(key)) for key in keys}
    results = await api.results("write", body(GROUP, (TOPIC, [e for e, _ in writes.values()])))
    codes = {}
    for (key, (_, expected)), result in zip(writes.items(), results, strict=True):
        assert result["partition"] == key
        codes[key] = result["error_code"]
        if result["error_code"] == 0:
            model.acknowledge(key, expected)
            assert result["error_message"] is None
        else:
            assert result["error_code"] == 15, result
            assert result["error_message"] == MSG_NOT_AVAILABLE
    return codes


# A checkpoint after every commit: a partition's fsync fault shows at once.
CHECKPOINT_EVERY_COMMIT = ("--journal-checkpoint-bytes", "1")


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_failing_partition_answers_15_recovers_and_loses_or_invents_nothing(
    spawn, tmp_path, fault
):
    control = tmp_path / "failpoints.json"
    data_dir = tmp_path / "data"
    rng = random.Random(fault)
    keys = keys_by_partition()
    everything = [k for ks in keys.values() for k in ks]
    model = AcknowledgedGroup(GROUP, everything)
    env = {"SHARECOORD_FAILPOINTS": str(control)}
    daemon = await spawn(data_dir, *CHECKPOINT_EVERY_COMMIT, partitions=NUM_PARTITIONS, env=env)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert set(await api.codes("initialize", model.init_body())) == {0}
        for _ in range(3):
            assert set((await write(api, model, rng, everything)).values()) == {0}

        await arm(control, **FAULTS[fault], path_contains=f"partitions/{FAULTY}/", times=None)
        # The journal made the first write after the fault durable (answered 0); its
        # file write, or the checkpoint's fsync after it, stops the partition.
        await wait_until(
            lambda: write(api, model, rng, everything),
            "the faulty partition's writes to fail",
            until=lambda codes: {codes[k] for k in keys[FAULTY]} == {15},
        )
        # Entries of every partition in one request: the faulty one's fail alone.
        for _ in range(3):
            codes = await write(api, model, rng, everything)
            assert {codes[k] for k in keys[FAULTY]} == {15}, codes
            for p, ks in keys.items():
                if p != FAULTY:
                    assert {codes[k] for k in ks} == {0}, (p, codes)
        if fault == "fsync EIO":
            # Reloading needs an fsync too: the partition stays failed while the disk does.
            ready = await api.readyz()
            assert (ready.status, ready.body["failed_partitions"]) == (200, [FAULTY])
            listing = await api.request("GET", "/v1/admin/partitions")
            status = listing.body["partitions"][FAULTY]
            assert status["status"] == "failed"
            assert "EIO" in status["error"] or "Input/output" in status["error"]
            reply = await api.admin_state(GROUP, TOPIC, keys[FAULTY][0])
            assert (reply.status, reply.body["error_code"]) == (503, 15)

        await clear(control)
        await wait_until(
            lambda: write(api, model, rng, keys[FAULTY]),
            "the partition to recover",
            until=lambda codes: codes[keys[FAULTY][0]] == 0,
        )
        assert set((await write(api, model, rng, everything)).values()) == {0}
        ready = await api.readyz()
        ready_body = {"status": "ready", "failed_partitions": [], "failures": []}
        assert (ready.status, ready.body) == (200, ready_body)
        await model.check(api)

    # After a restart (without faults): the same.
    assert await asyncio.to_thread(daemon.terminate) == 0
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        await model.check(Api(session, daemon.url))
    assert not model.uncertain()
    assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_a_single_failed_fsync_is_followed_by_recovery_on_its_own(spawn, tmp_path):
    """``times: 1``: one fsync fails, the partition reloads by itself and serves again;
    the write that failed is not there, the ones before and after are."""
    control = tmp_path / "failpoints.json"
    rng = random.Random(3)
    keys = keys_by_partition()
    model = AcknowledgedGroup(GROUP, keys[FAULTY])
    daemon = await spawn(
        tmp_path / "data",
        *CHECKPOINT_EVERY_COMMIT,
        partitions=NUM_PARTITIONS,
        env={"SHARECOORD_FAILPOINTS": str(control)},
    )
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
        await write(api, model, rng, keys[FAULTY])
        # The checkpoint's fsync fails, and so do the first two reloads' (it backs off).
        await arm(control, op="fsync", errno="EIO", path_contains=f"partitions/{FAULTY}/", times=3)
        seen: set[int] = set()

        async def failed_and_recovered() -> bool:
            codes = set((await write(api, model, rng, keys[FAULTY])).values())
            seen.update(codes)
            return 15 in seen and codes == {0}

        await wait_until(
            failed_and_recovered, "the partition to fail and recover on its own", max_pause=0.02
        )
        await model.check(api)


async def test_no_answer_reveals_what_a_failed_fsync_did_not_make_durable(spawn, tmp_path):
    """In one read request, a read that records a higher leader epoch and then a read
    with a lower one: the second is fenced (74) by the first's record, which is not
    durable yet. When the journal fsync carrying that record fails, neither answer may
    show it: both are 15. And concurrent readers of a key whose write is failing see
    the old state or 15, never the write."""
    control = tmp_path / "failpoints.json"
    rng = random.Random(4)
    keys = keys_by_partition()
    key, other = keys[FAULTY][0], keys[0][0]
    model = AcknowledgedGroup(GROUP, [key, other])
    daemon = await spawn(
        tmp_path / "data", partitions=NUM_PARTITIONS, env={"SHARECOORD_FAILPOINTS": str(control)}
    )
    fault = {"op": "fdatasync", "errno": "EIO", "path_contains": "journal/"}
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        assert set(await api.codes("initialize", model.init_body())) == {0}
        await write(api, model, rng, [key, other])

        await arm(control, **fault, times=None)
        reads = [read_entry(key, 5), read_entry(key, 4), read_entry(other, 5), read_entry(other, 4)]
        results = await api.results("read", body(GROUP, (TOPIC, reads)))
        # Both leader-epoch records shared the failed journal record: every answer that
        # saw one is 15, the fenced ones included.
        assert [r["error_code"] for r in results] == [15, 15, 15, 15]
        assert all(r["state_batches"] == [] for r in results)
        await clear(control)
        await wait_recovered(api, key)
        await wait_recovered(api, other)
        state = await api.state(GROUP, TOPIC, key)
        assert state is not None
        assert state["fencing"]["leader_epoch"] == 0  # the failed record is not there

        for attempt in range(3):
            await arm(control, **fault, times=None)
            entry, failing = next_write(rng, key, model.exact(key))
            writing = asyncio.ensure_future(api.results("write", body(GROUP, (TOPIC, [entry]))))
            readers = [
                api.results("read-summary", body(GROUP, (TOPIC, [read_entry(key)])))
                for _ in range(20)
            ] + [api.admin_state(GROUP, TOPIC, key) for _ in range(10)]
            answers = await asyncio.gather(*readers)
            assert (await writing)[0]["error_code"] == 15
            for answer in answers:
                if isinstance(answer, list):
                    summary = answer[0]
                    if summary["error_code"] == 0:
                        assert summary["start_offset"] == model.exact(key).start_offset, attempt
                    else:
                        assert summary["error_code"] == 15
                elif answer.status == 200:
                    assert model.exact(key).matches(answer.body), attempt
                    assert not failing.matches(answer.body)
                else:
                    assert (answer.status, answer.body["error_code"]) == (503, 15)
            await clear(control)
            await wait_recovered(api, key)
        await model.check(api)


async def wait_recovered(api: Api, key: int) -> None:
    async def summary_code() -> int:
        summary = await api.results("read-summary", body(GROUP, (TOPIC, [read_entry(key)])))
        assert summary[0]["error_code"] in (0, 15), summary
        return summary[0]["error_code"]  # type: ignore[no-any-return]

    await wait_until(summary_code, f"the partition of key {key} to recover", until=lambda c: c == 0)
