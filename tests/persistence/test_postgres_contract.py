"""The seam's promises (persistence/store.py), checked on both stores alike: the local
log in a data directory and the PostgreSQL store on a real server (the session's
``postgres`` fixture, a schema per test). Each test runs the group commit over the
store, as the daemon does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from persistence import GroupCommitter, LogError, LogRecord
from persistence.store import StateStore
from protocol.loading import RawRecord
from tests.persistence.log_helpers import append_records
from tests.persistence.stores import STORES, StoreOpener, from_last_snapshot, opener
from tests.postgres import PostgresServer

PARTITIONS = 4


@pytest.fixture(params=STORES)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreOpener]:
    server: PostgresServer | None = None
    if request.param == "postgres":
        server = request.getfixturevalue("postgres")
    # Small segments: the local log seals some, so pruning has whole segments to delete.
    made = opener(request.param, str(tmp_path / "data"), server, PARTITIONS, segment_bytes=400)
    try:
        yield made
    finally:
        made.close_all()


async def commit(store: StateStore[Any], appended: dict[int, list[LogRecord]]) -> dict[int, Any]:
    """Wait, through one group committer, for every record in `appended`; the
    partitions whose commit failed, with why."""
    committer = GroupCommitter(store)
    committer.start()
    try:
        barrier = committer.wait_durable_many(
            {p: records[-1].offset for p, records in appended.items() if records}
        )
        return await barrier.future
    finally:
        await committer.close()


async def test_one_cycle_makes_every_dirty_partition_durable(stores: StoreOpener) -> None:
    store = await asyncio.to_thread(stores.open)
    cycles: list[int] = []
    committer = GroupCommitter(store, on_cycle=lambda partitions, _: cycles.append(partitions))
    committer.start()
    try:
        appended = {p: append_records(store.partition(p), 3, 10 * p) for p in (0, 1, 3)}
        barrier = committer.wait_durable_many({p: r[-1].offset for p, r in appended.items()})
        assert await barrier.future == {}
    finally:
        await committer.close()
    assert cycles == [3]  # one flush for the three partitions
    for p, records in appended.items():
        part = store.partition(p)
        assert part.durable_end_offset == part.log_end_offset == records[-1].offset + 1
        assert list(await asyncio.to_thread(lambda part=part: list(part.read()))) == records
    assert store.partition(2).durable_end_offset == 0


async def test_what_was_committed_reads_back_and_replays_after_a_restart(
    stores: StoreOpener,
) -> None:
    store = await asyncio.to_thread(stores.open)
    appended: dict[int, list[LogRecord]] = {}
    for round_ in range(3):  # several cycles, so a key's snapshots are spread over them
        batch = {p: append_records(store.partition(p), 7, 100 * p + 7 * round_) for p in (0, 2)}
        assert await commit(store, batch) == {}
        for p, records in batch.items():
            appended.setdefault(p, []).extend(records)
    await asyncio.to_thread(store.close)
    replayed: dict[int, list[LogRecord]] = {}
    again = await asyncio.to_thread(stores.open, replayed)
    for p in range(PARTITIONS):
        records = appended.get(p, [])
        part = again.partition(p)
        assert list(await asyncio.to_thread(lambda part=part: list(part.read()))) == records
        assert part.log_end_offset == part.durable_end_offset == len(records)
        # A load sees at least each key from its last snapshot on, in order, and only
        # what was appended.
        assert from_last_snapshot(replayed[p]) == from_last_snapshot(records)
        assert [r.offset for r in replayed[p]] == sorted(r.offset for r in replayed[p])
        assert set(replayed[p]) <= set(records)
    # ... and appends go on after the end.
    more = {0: append_records(again.partition(0), 2, 500)}
    assert [r.offset for r in more[0]] == [len(appended[0]), len(appended[0]) + 1]
    assert await commit(again, more) == {}


async def test_a_load_in_runs_hands_what_a_load_record_by_record_does(
    stores: StoreOpener,
) -> None:
    """A runtime loads through ``open_in_runs``: each store must hand the same records
    that way, whether it reads in runs itself or hands them one by one."""
    store = await asyncio.to_thread(stores.open)
    batch = {p: append_records(store.partition(p), 9, 10 * p) for p in (0, 2)}
    assert await commit(store, batch) == {}
    await asyncio.to_thread(store.close)
    one_by_one: dict[int, list[LogRecord]] = {}
    await asyncio.to_thread(lambda: stores.open(one_by_one).close())
    in_runs: dict[int, list[RawRecord]] = {}
    again = await asyncio.to_thread(stores.open_in_runs, in_runs)
    for p in range(PARTITIONS):
        expected = [(r.offset, r.timestamp, r.record_type, r.key, r.value) for r in one_by_one[p]]
        assert in_runs[p] == expected
        assert again.partition(p).log_end_offset == len(batch.get(p, []))


async def test_a_reset_drops_what_was_not_durable_and_appends_go_on(stores: StoreOpener) -> None:
    store = await asyncio.to_thread(stores.open)
    kept = {1: append_records(store.partition(1), 4)}
    assert await commit(store, kept) == {}
    part = store.partition(1)
    append_records(part, 3, 50)  # never committed
    part.fail(LogError("a commit failed"))
    with pytest.raises(LogError):
        part.append(0, b"k", b"v", 1)
    await asyncio.to_thread(part.reset_to_durable)
    assert part.failure is None
    assert part.log_end_offset == part.durable_end_offset == 4
    seen: list[LogRecord] = []
    await asyncio.to_thread(part.replay, seen.append)
    assert from_last_snapshot(seen) == from_last_snapshot(kept[1])
    after = {1: append_records(part, 2, 60)}
    assert after[1][0].offset == 4
    assert await commit(store, after) == {}
    assert list(await asyncio.to_thread(lambda: list(part.read()))) == kept[1] + after[1]


async def test_a_batch_taken_before_a_reset_is_never_written(stores: StoreOpener) -> None:
    store = await asyncio.to_thread(stores.open)
    part = store.partition(0)
    append_records(part, 2)
    stale = part.take_pending()
    assert stale is not None
    part.fail(LogError("a commit failed"))
    await asyncio.to_thread(part.reset_to_durable)
    result = await asyncio.to_thread(store.commit_cycle, [(0, stale)])
    assert isinstance(result.errors[0], LogError)
    assert list(await asyncio.to_thread(lambda: list(part.read()))) == []
    await asyncio.to_thread(store.close)  # nor is it found after a restart
    again = await asyncio.to_thread(stores.open)
    assert list(await asyncio.to_thread(lambda: list(again.partition(0).read()))) == []


async def test_pruning_keeps_everything_at_or_above_the_offset(stores: StoreOpener) -> None:
    store = await asyncio.to_thread(stores.open)
    part = store.partition(3)
    appended: list[LogRecord] = []
    for round_ in range(6):  # a cycle each: the local log rolls 400-byte segments
        batch = {3: append_records(part, 5, 5 * round_)}
        assert await commit(store, batch) == {}
        appended += batch[3]
    below = 17
    deleted = await asyncio.to_thread(part.prune, below)
    assert deleted  # something below was deleted
    assert 0 < part.log_start_offset <= below
    left = await asyncio.to_thread(lambda: list(part.read()))
    assert left == [r for r in appended if r.offset >= part.log_start_offset]
    await asyncio.to_thread(store.close)
    again = await asyncio.to_thread(stores.open)
    assert again.partition(3).log_start_offset == part.log_start_offset
    assert again.partition(3).log_end_offset == len(appended)
