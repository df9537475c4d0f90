"""Long work leaves the event loop (server/runtime.py, server/service.py, server/offload.py).

A write entry whose merge would hold the loop runs its rule, record and merge on the
offload thread; its state partition is taken meanwhile, so what comes after it there
waits its turn, in order, while the other partitions are served. A request with many
entries lets others run between them. The offload here is held by the test until it
lets it go: no timing is measured, only what was answered when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import server.service
from protocol.state_batch import StateBatch
from server.offload import Offload
from server.runtime import OFFLOAD_BATCHES
from tests.harness import TOPIC, batch, body, init_entry, part, partitions_in, write_entry
from tests.protocol.batch_shapes import staircase
from tests.protocol.kafka_reference_combiner import reference_combine

T = TypeVar("T")
GROUP = "long-work"
PARTITIONS = 4


class HeldOffload(Offload):
    """Runs each job on the offload thread only once the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.jobs = 0

    async def __call__(self, work: Callable[[], T]) -> T:
        self.jobs += 1
        self.started.set()
        await self.go.wait()
        return await super().__call__(work)


def staircase_entry(partition: int, n: int) -> dict[str, Any]:
    return write_entry(partition, *(as_json(b) for b in staircase(n)))


def as_json(b: StateBatch) -> dict[str, int]:
    return batch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)


def held_runtimes(served: Any) -> HeldOffload:
    offload = HeldOffload()
    for runtime in served.node.service.runtimes.values():
        runtime._offload = offload
    return offload


async def settled() -> None:
    """Let every task that can run, run (the loop has nothing ready after a few turns)."""
    for _ in range(20):
        await asyncio.sleep(0)  # a turn of the loop, not a wait: no time passes


async def test_a_long_write_leaves_the_loop_and_its_partition_waits_in_order(serve):
    served = await serve(partitions=PARTITIONS)
    api = served.api("msgpack")
    # Two share-partitions of state partition 0, one of state partition 1.
    first, second = partitions_in(0, PARTITIONS, group_id=GROUP, count=2)
    (elsewhere,) = partitions_in(1, PARTITIONS, group_id=GROUP)
    inits = [init_entry(p) for p in (first, second, elsewhere)]
    assert await api.codes("initialize", body(GROUP, (TOPIC, inits))) == [0, 0, 0]
    offload = held_runtimes(served)

    n = 2 * OFFLOAD_BATCHES
    long_write = asyncio.create_task(
        api.codes("write", body(GROUP, (TOPIC, [staircase_entry(first, n)])))
    )
    await asyncio.wait_for(offload.started.wait(), 60)
    # The same key again, then another key of the same state partition: both wait.
    after_on_key = asyncio.create_task(
        api.codes("write", body(GROUP, (TOPIC, [write_entry(first, batch(0, 0, 2, 9))])))
    )
    same_partition = asyncio.create_task(
        api.codes("write", body(GROUP, (TOPIC, [write_entry(second, batch(5, 6, 2, 1))])))
    )
    # Another state partition is served while the long write is held.
    short = body(GROUP, (TOPIC, [write_entry(elsewhere, batch(1, 1))]))
    assert await api.codes("write", short) == [0]
    assert await api.codes("read-summary", body(GROUP, (TOPIC, [part(elsewhere)]))) == [0]
    await settled()
    assert not long_write.done()
    assert not after_on_key.done()
    assert not same_partition.done()
    assert offload.jobs == 1

    offload.go.set()
    assert await long_write == [0]
    assert await after_on_key == [0]
    assert await same_partition == [0]
    # The later write to the key came after the long one: [0, 0] at count 9 wins over
    # the staircase's [0, n] at count n only because it was merged into its result.
    expected = reference_combine(staircase(n), [], -1)
    expected = reference_combine(expected, [StateBatch(0, 0, 2, 9)], -1)
    state = await api.state(GROUP, TOPIC, first)
    assert state is not None
    got = [
        StateBatch(b["first_offset"], b["last_offset"], b["delivery_state"], b["delivery_count"])
        for b in state["state_batches"]
    ]
    assert got == expected


async def test_a_job_waits_for_a_long_write_on_its_partition(serve):
    served = await serve(partitions=PARTITIONS)
    api = served.api("msgpack")
    (first,) = partitions_in(0, PARTITIONS, group_id=GROUP)
    assert await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(first)]))) == [0]
    offload = held_runtimes(served)
    service = served.node.service
    long_write = asyncio.create_task(
        api.codes("write", body(GROUP, (TOPIC, [staircase_entry(first, 2 * OFFLOAD_BATCHES)])))
    )
    await asyncio.wait_for(offload.started.wait(), 60)
    # Expiring the group would tombstone the key; it must not run before the write it
    # would otherwise slip under.
    expiry = asyncio.create_task(
        server.service.run_job(
            service.runtimes[0], lambda shard: shard.expire_groups(frozenset({GROUP}))
        )
    )
    await settled()
    assert not expiry.done()
    offload.go.set()
    assert await long_write == [0]
    assert await expiry == 1
    assert await api.state(GROUP, TOPIC, first) is None


async def test_long_writes_answer_as_short_ones_would(serve):
    """The offloaded path gives the same state as the loop's path: the same write, once
    just over the line and once, split in two, under it."""
    served = await serve(partitions=PARTITIONS)
    api = served.api("json")
    a, b = partitions_in(2, PARTITIONS, group_id=GROUP, count=2)
    assert await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(a), init_entry(b)]))) == [
        0,
        0,
    ]
    batches = [as_json(x) for x in staircase(OFFLOAD_BATCHES + 1)]
    half = len(batches) // 2
    assert await api.codes("write", body(GROUP, (TOPIC, [write_entry(a, *batches)]))) == [0]
    assert await api.codes("write", body(GROUP, (TOPIC, [write_entry(b, *batches[:half])]))) == [0]
    assert await api.codes("write", body(GROUP, (TOPIC, [write_entry(b, *batches[half:])]))) == [0]
    state_a = await api.state(GROUP, TOPIC, a)
    assert state_a is not None
    one = [StateBatch(**x) for x in state_a["state_batches"]]
    assert one == reference_combine([StateBatch(**x) for x in batches], [], -1)
    state_b = await api.state(GROUP, TOPIC, b)
    assert state_b is not None
    two = reference_combine(
        reference_combine([StateBatch(**x) for x in batches[:half]], [], -1),
        reference_combine([StateBatch(**x) for x in batches[half:]], [], -1),
        -1,
    )
    assert [StateBatch(**x) for x in state_b["state_batches"]] == two


async def test_a_request_of_many_entries_lets_others_run_between_them(serve, monkeypatch):
    served = await serve(partitions=PARTITIONS)
    api = served.api("msgpack")
    monkeypatch.setattr(server.service, "SLICE_S", 0.0)  # yield before every entry
    many = body(GROUP, (TOPIC, [part(p) for p in range(2_000)]))
    big = asyncio.create_task(api.codes("read-summary", many))
    small = asyncio.create_task(api.codes("read-summary", body(GROUP, (TOPIC, [part(0)]))))
    done, _ = await asyncio.wait({big, small}, return_when=asyncio.FIRST_COMPLETED)
    assert small in done and big not in done
    assert await big == [0] * 2_000


@pytest.mark.parametrize("entries", [1, 3])
async def test_long_entries_in_one_request_keep_their_order(serve, entries):
    """Duplicates of a long entry run one after the other: each sees the one before."""
    served = await serve(partitions=PARTITIONS)
    api = served.api("msgpack")
    (first,) = partitions_in(3, PARTITIONS, group_id=GROUP)
    assert await api.codes("initialize", body(GROUP, (TOPIC, [init_entry(first)]))) == [0]
    entry = staircase_entry(first, OFFLOAD_BATCHES + 10)
    assert await api.codes("write", body(GROUP, (TOPIC, [entry] * entries))) == [0] * entries
    expected: list[StateBatch] = []
    for _ in range(entries):
        expected = reference_combine(
            expected, reference_combine(staircase(OFFLOAD_BATCHES + 10), [], -1), -1
        )
    state = await api.state(GROUP, TOPIC, first)
    assert state is not None
    assert [StateBatch(**x) for x in state["state_batches"]] == expected
