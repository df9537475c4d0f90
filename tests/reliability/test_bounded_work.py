"""One request cannot hold the daemon (issue #21).

A write entry of 10,000 state batches in each adversarial shape of
tests/protocol/batch_shapes.py (the staircase an adversarial review used held the event
loop for 240 s and took 5 GiB) goes to a real daemon, while a prober sends a read-summary
of another share group, on a state partition of its own, without pause and times each
answer. Each write must be answered
within a second, with exactly the state Kafka's walk gives; no read-summary may wait
100 ms; the daemon's resident set may not grow by 100 MB over the whole run. The same for
a request of 5,000 entries and for a 10,000-batch write over a 10,000-batch state.

In `make test`: every shape at 2,000 batches, checked for the state only (no timing).

The bounds are the daemon's, not the machine's: on a machine other processes keep busy
(CI's is shared), a write's answer and a read-summary's wait also hold time when the
daemon was ready to run and the OS ran others. So a write is held to its daemon's CPU
time (what it costs: one second, all threads), and each read-summary's wait to what is
left once the run-queue delays the kernel counted for the daemon's event loop thread and
for the prober are taken out (tests/reliability/prober.py). The wall-clock figures are
printed beside them; on a quiet machine the two agree.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
import pytest

from protocol.batches import combine_state_batches
from protocol.routing import partition_for
from protocol.state_batch import StateBatch
from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    child_env,
    init_entry,
    metric_value,
    write_entry,
)
from tests.protocol.batch_shapes import SHAPES, disjoint_over_stored, stored_alternating
from tests.reliability.test_memory_bounded import rss_kib

GROUP = "bounded-work"
NUM_PARTITIONS = 16


def bystander(long_keys: int) -> str:
    """A group whose share-partition 0 lives on a state partition that none of the long
    writes' keys does: a state partition runs its operations in order, so a read there
    rightly waits behind a long write; the bound is on everyone else."""
    taken = {partition_for(GROUP, TOPIC, p, NUM_PARTITIONS) for p in range(long_keys)}
    return next(
        name
        for name in (f"bystander-{i}" for i in range(1000))
        if partition_for(name, TOPIC, 0, NUM_PARTITIONS) not in taken
    )


PROBE_GROUP = bystander(len(SHAPES) + 1)
ANSWER_S = 1.0
PROBE_WAIT_S = 0.100
LAG = "sharecoord_event_loop_lag_seconds"


def cpu_s(pid: int) -> float:
    """A process's CPU time so far, all threads, user and system (seconds)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def loop_held(api: Api) -> tuple[float, float]:
    """How many times the daemon's event loop was held past 100 ms, and in all."""
    text = await api.metrics()
    return (
        metric_value(text, f"{LAG}_count") - metric_value(text, f"{LAG}_bucket", le="0.1"),
        metric_value(text, f"{LAG}_count"),
    )


RSS_GROWTH_MIB = 100


def as_json(batches: list[StateBatch]) -> list[dict[str, int]]:
    return [
        batch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in batches
    ]


def stored(state: dict[str, Any] | None) -> list[StateBatch]:
    assert state is not None
    return [StateBatch(**b) for b in state["state_batches"]]


class Prober:
    """tests/reliability/prober.py in a child process: read-summaries of another group,
    one after the other, each timed on its own clock."""

    def __init__(self, url: str, daemon_pid: int) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.prober",
                url,
                PROBE_GROUP,
                TOPIC,
                "0",
                str(daemon_pid),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "probing"
        self.waits: list[float] = []
        self.net_waits: list[float] = []  # without the time the OS ran others

    def stop(self) -> None:
        out, _ = self.process.communicate(timeout=120)
        assert self.process.returncode == 0, out
        waits = json.loads(out.strip().splitlines()[-1])
        self.waits = [wait for wait, _ in waits]
        self.net_waits = [max(0.0, wait - starved) for wait, starved in waits]


async def timed_write(api: Api, pid: int, request: dict[str, Any]) -> tuple[float, float]:
    """The write's answer time and the daemon's CPU time for it (seconds)."""
    cpu = await asyncio.to_thread(cpu_s, pid)  # (a file read: off the test's loop)
    started = time.perf_counter()
    codes = await api.codes("write", request)
    took = time.perf_counter() - started
    cost = await asyncio.to_thread(cpu_s, pid) - cpu
    assert set(codes) == {0}, codes
    return took, cost


async def run_shapes(spawn: Any, tmp_path: Any, n: int, figures: Any | None) -> None:
    daemon = await spawn(tmp_path / "data", "--partitions", str(NUM_PARTITIONS))
    shapes = sorted(SHAPES)
    last = len(shapes)  # the key of the leader's long write over a long state
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        assert await api.codes("initialize", body(PROBE_GROUP, (TOPIC, [init_entry(0)]))) == [0]
        inits = [init_entry(i) for i in range(last + 1)]
        assert set(await api.codes("initialize", body(GROUP, (TOPIC, inits)))) == {0}
        many = range(5_000)  # the entry limit
        assert set(
            await api.codes("initialize", body("many", (TOPIC, [init_entry(p) for p in many])))
        ) == {0}
        prober = await asyncio.to_thread(Prober, daemon.url, daemon.pid)
        rss_before = rss_kib(daemon.pid)
        took: dict[str, float] = {}
        cost: dict[str, float] = {}
        try:
            for i, name in enumerate(shapes):
                batches = SHAPES[name](n)
                entry = write_entry(i, *as_json(batches))
                took[name], cost[name] = await timed_write(
                    api, daemon.pid, body(GROUP, (TOPIC, [entry]))
                )
                assert stored(await api.state(GROUP, TOPIC, i)) == combine_state_batches(
                    batches, [], -1
                ), name
            # A leader's long write over a long state: disjoint batches over disjoint ones.
            state, over = stored_alternating(n), disjoint_over_stored(n)
            state_entry = write_entry(last, *as_json(state))
            await timed_write(api, daemon.pid, body(GROUP, (TOPIC, [state_entry])))
            entry = write_entry(last, *as_json(over))
            took["over a long state"], cost["over a long state"] = await timed_write(
                api, daemon.pid, body(GROUP, (TOPIC, [entry]))
            )
            assert stored(await api.state(GROUP, TOPIC, last)) == combine_state_batches(
                state, over, -1
            )
            entries = [write_entry(p, batch(p, p, 2, 1)) for p in many]
            took["5,000 entries"], cost["5,000 entries"] = await timed_write(
                api, daemon.pid, body("many", (TOPIC, entries))
            )
        finally:
            await asyncio.to_thread(prober.stop)
        grown_mib = (rss_kib(daemon.pid) - rss_before) / 1024
        held_long, lag_samples = await loop_held(api)
    slowest, costliest = max(took.values()), max(cost.values())
    waits, net_waits = sorted(prober.waits), sorted(prober.net_waits)
    if figures is not None:
        figures.set("shapes", len(shapes))
        figures.set("batches per write", n)
        figures.set("slowest write answer ms", round(slowest * 1000, 1))
        figures.set("slowest write", max(took, key=took.__getitem__))
        figures.set("costliest write cpu ms", round(costliest * 1000, 1))
        figures.set("costliest write", max(cost, key=cost.__getitem__))
        figures.set("read-summaries probed", len(waits))
        figures.set("probe p99 ms", round(waits[int(len(waits) * 0.99) - 1] * 1000, 1))
        figures.set("probe max ms", round(waits[-1] * 1000, 1))
        figures.set("probe max ms, run-queue waits out", round(net_waits[-1] * 1000, 1))
        figures.set("rss growth MiB", round(grown_mib, 1))
        figures.set("loop lag samples", lag_samples)
        figures.set("loop held over 100 ms", held_long)
        assert costliest <= ANSWER_S, cost
        assert net_waits[-1] < PROBE_WAIT_S, net_waits[-10:]
        assert grown_mib < RSS_GROWTH_MIB, grown_mib


async def test_every_shape_gives_kafkas_state_through_the_daemon(spawn, tmp_path):
    await run_shapes(spawn, tmp_path, 2_000, None)


@pytest.mark.slow
async def test_no_write_holds_the_daemon(spawn, tmp_path, figures):
    await run_shapes(spawn, tmp_path, 10_000, figures)
