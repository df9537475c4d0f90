"""The log's upkeep under a serving daemon (docs/semantics.md §A pruning and compaction,
§A.1 point 12, docs/design.md#compaction-and-its-swap).

* Compaction: output staged the way the Spark job stages it (one ShareSnapshot per live
  key of the sealed segments, with its fencing maxima) is committed by
  ``POST /v1/admin/compaction/commit``; the state is the same before, after, after more
  writes and after a restart.
* Pruning: with a snapshot on every write the prune job deletes sealed segments below
  the mark; the log start offset moves and the state stays the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random

from persistence import list_segments, partition_dir, write_staged
from persistence.history import (
    HistoryConfig,
    SegmentExport,
    fingerprint,
    resolve_dir,
    write_declaration,
    write_marker,
)
from persistence.segments import fingerprint_segment
from protocol.records import ShareSnapshot
from server.tools import iter_records
from tests.harness import (
    TOPIC,
    AcknowledgedGroup,
    body,
    next_write,
    part,
    partitions_in,
    read_entry,
    run_cli,
    series,
    wait_until,
)
from tests.persistence.log_helpers import fold_sealed

NUM_PARTITIONS = 2
P = 1  # the state partition whose log is compacted or pruned
GROUP = "upkeep"
KEYS = partitions_in(P, NUM_PARTITIONS, group_id=GROUP, count=6)


def stage_compaction(data_dir: str, partition: int) -> str:
    """Fold the sealed segments of a partition into one snapshot per key at the offset
    of the key's last record (a tombstone stays a tombstone), and stage it."""
    directory = partition_dir(data_dir, partition)
    assert len(list_segments(directory)) >= 3, "needs two sealed segments"
    base, frames, replaced = fold_sealed(directory)
    write_staged(directory, base, frames, replaced)
    return f"{partition}/{base}"


async def every_state(api, keys) -> dict[int, dict | None]:
    return {k: await api.state(GROUP, TOPIC, k) for k in keys}


async def some_writes(api, model: AcknowledgedGroup, rng: random.Random, rounds: int) -> None:
    for _ in range(rounds):
        writes = {k: next_write(rng, k, model.exact(k)) for k in model.keys}
        entries = [entry for entry, _ in writes.values()]
        assert set(await api.codes("write", body(GROUP, (TOPIC, entries)))) == {0}
        for k, (_, expected) in writes.items():
            model.acknowledge(k, expected)


async def partition_status(api, partition: int) -> dict:
    listing = await api.request("GET", "/v1/admin/partitions")
    return listing.body["partitions"][partition]


async def log_start(api, partition: int) -> int:
    return (await partition_status(api, partition))["log_start_offset"]


async def test_staged_compaction_is_committed_by_the_admin_endpoint(serve, fmt):
    flags = {
        "partitions": NUM_PARTITIONS,
        "segment_bytes": 1024,
        "compaction_commit_interval_ms": 600_000,
        "prune_interval_ms": 600_000,
    }
    served = await serve(**flags)
    api = served.api(fmt)
    rng = random.Random(11)
    live = KEYS[:-1]
    model = AcknowledgedGroup(GROUP, live)
    assert set(await api.codes("initialize", AcknowledgedGroup(GROUP, KEYS).init_body())) == {0}
    await some_writes(api, model, rng, 15)
    # A leader epoch recorded by a read, and a key deleted: both must survive the fold.
    assert await api.codes("read", body(GROUP, (TOPIC, [read_entry(live[0], 7)]))) == [0]
    assert await api.codes("delete", body(GROUP, (TOPIC, [part(KEYS[-1])]))) == [0]
    await some_writes(api, model, rng, 5)
    before = await every_state(api, KEYS)
    assert before[live[0]]["fencing"]["leader_epoch"] == 7
    segments_before = (await partition_status(api, P))["segments"]

    data_dir = served.config.data_dir
    name = await asyncio.to_thread(stage_compaction, data_dir, P)
    reply = await api.request(
        "POST", "/v1/admin/compaction/commit", headers={"Accept": f"application/{fmt}"}
    )
    assert reply.status == 200
    assert reply.body == {"committed": [name], "stale": []}
    status = await partition_status(api, P)
    assert status["segments"] < segments_before
    assert status["status"] == "active"
    # Nothing changed in memory, and it keeps serving on top of the swapped log.
    assert await every_state(api, KEYS) == before
    await some_writes(api, model, rng, 5)
    await model.check(api)
    after = await every_state(api, KEYS)
    # A restart replays the compacted log: the same state, fencing maxima included.
    await served.server.close()
    again = await serve(data_dir=data_dir, **flags)
    assert await every_state(again.api(fmt), KEYS) == after
    await again.server.close()
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout


async def test_pruning_moves_the_log_start_and_keeps_the_state(serve):
    flags = {
        "partitions": NUM_PARTITIONS,
        "segment_bytes": 1024,
        "prune_interval_ms": 50,
        # Every write a snapshot: the prune mark follows the writes.
        "snapshot_update_records_per_snapshot": 0,
    }
    served = await serve(**flags)
    api = served.api("msgpack")
    rng = random.Random(12)
    model = AcknowledgedGroup(GROUP, KEYS)
    assert set(await api.codes("initialize", model.init_body())) == {0}
    await some_writes(api, model, rng, 20)
    await wait_until(lambda: log_start(api, P), "the prune job to prune")
    await model.check(api)
    # The log start moves inside the prune (in its thread); the metric is set when the
    # job resumes on the loop a moment later.
    pruned = ("sharecoord_last_pruned_offset", frozenset({("partition", str(P))}))
    await wait_until(
        api.metrics, f"{pruned} on /metrics", until=lambda text: pruned in series(text)
    )
    before = await every_state(api, KEYS)
    await served.server.close()
    again = await serve(data_dir=served.config.data_dir, **flags)
    assert await every_state(again.api("msgpack"), KEYS) == before


def record_kinds(data_dir: str, partition: int) -> list[tuple[str, int, int]]:
    """(record type, create timestamp, write timestamp) of a partition's records."""
    out = []
    for _, record in iter_records(data_dir, partition):
        if isinstance(record, ShareSnapshot):
            out.append(("snapshot", record.create_timestamp, record.write_timestamp))
        else:
            out.append((type(record).__name__, 0, 0))
    return out


async def test_snapshot_cadence_follows_the_setting(serve):
    """docs/semantics.md §A.1 point 14 with N = 2: after Initialize, 3 updates then a
    snapshot; then 2 updates between snapshots (the setting reaches the shards)."""
    served = await serve(partitions=1, snapshot_update_records_per_snapshot=2)
    api = served.api()
    rng = random.Random(13)
    model = AcknowledgedGroup(GROUP, [0])
    assert await api.codes("initialize", model.init_body()) == [0]
    await some_writes(api, model, rng, 7)
    kinds = await asyncio.to_thread(record_kinds, served.config.data_dir, 0)
    assert [kind for kind, _, _ in kinds] == [
        "snapshot",
        "ShareUpdate",
        "ShareUpdate",
        "ShareUpdate",
        "snapshot",
        "ShareUpdate",
        "ShareUpdate",
        "snapshot",
    ]
    await model.check(api)
    state = await api.state(GROUP, TOPIC, 0)
    assert state is not None
    assert state["snapshot_epoch"] == 2


async def test_cold_partition_snapshots_rewrite_a_key_written_by_updates(serve):
    """docs/semantics.md §10: a key untouched for the cold interval gets a snapshot of its state,
    snapshot epoch + 1 and a new write timestamp, and nothing else changes."""
    served = await serve(partitions=1, cold_partition_snapshot_interval_ms=100)
    api = served.api()
    rng = random.Random(14)
    model = AcknowledgedGroup(GROUP, [0])
    assert await api.codes("initialize", model.init_body()) == [0]
    await some_writes(api, model, rng, 2)
    before = await api.state(GROUP, TOPIC, 0)
    assert before is not None
    # (On a slow machine a cold snapshot may already come between the initialize and
    # the writes: the one that counts is the one after them.)
    epoch = before["snapshot_epoch"]
    state = await wait_until(
        lambda: api.state(GROUP, TOPIC, 0),
        "a cold snapshot",
        until=lambda state: state["snapshot_epoch"] != epoch,  # type: ignore[index]
    )
    assert state == {**before, "snapshot_epoch": epoch + 1}
    kinds = await asyncio.to_thread(record_kinds, served.config.data_dir, 0)
    last_update = max(i for i, (kind, _, _) in enumerate(kinds) if kind == "ShareUpdate")
    cold = [(create, write) for kind, create, write in kinds[last_update:] if kind == "snapshot"]
    assert cold, kinds
    assert all(create < write for create, write in cold)


async def test_with_a_history_pruning_waits_for_the_export_of_each_segment(serve, caplog):
    """docs/design.md#the-history: a data directory that keeps a history is pruned only
    up to the first segment without an export marker; once the markers are there, the
    next round prunes."""
    flags = {
        "partitions": NUM_PARTITIONS,
        "segment_bytes": 1024,
        "prune_interval_ms": 50,
        "snapshot_update_records_per_snapshot": 0,
    }
    caplog.set_level(logging.INFO, logger="sharecoord.service")
    served = await serve(**flags)
    data_dir = str(served.config.data_dir)
    root = await asyncio.to_thread(resolve_dir, data_dir, None)
    await asyncio.to_thread(write_declaration, data_dir, HistoryConfig(root, -1))
    api = served.api("msgpack")
    rng = random.Random(14)
    model = AcknowledgedGroup(GROUP, KEYS)
    assert set(await api.codes("initialize", model.init_body())) == {0}
    await some_writes(api, model, rng, 20)
    directory = partition_dir(data_dir, P)
    sealed = (await asyncio.to_thread(list_segments, directory))[:-1]
    assert len(sealed) >= 2
    # Many prune rounds (every 50 ms) with the mark past the sealed segments: none goes.
    # Not a wait for a condition: the time those rounds take, to show that none prunes.
    await asyncio.sleep(1.0)
    assert (await partition_status(api, P))["log_start_offset"] == 0
    assert (await asyncio.to_thread(list_segments, directory))[: len(sealed)] == sealed
    # The operator hears why, once for the segment it waits on, not every round.
    held = [r.getMessage() for r in caplog.records if "pruning held back" in r.getMessage()]
    first = os.path.basename(sealed[0].path)
    assert held == [
        f"state partition {P}: pruning held back at segment {first}: the history does not "
        "hold it yet (sharecoord compact exports it)"
    ]

    def export_markers() -> None:  # what the compaction job writes last, per segment
        for segment in sealed:
            fp = fingerprint_segment(segment.path)
            name = fingerprint(os.path.basename(segment.path), fp.size, fp.last_frame_crc)
            write_marker(root, SegmentExport(P, name, None, None, records=0))

    await asyncio.to_thread(export_markers)
    await wait_until(lambda: log_start(api, P), "the exported segments to be pruned")
    await model.check(api)
