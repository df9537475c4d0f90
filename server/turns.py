"""Who runs when: the order of a connection's requests (``InOrder``, ``Place``), an
entry's turn on a state partition that another holds (``execute_in_turn``, ``run_job``),
and the write timeout of every request waiting for durability (``Deadlines``). The
service (server/service.py) uses them; the Kafka listener keeps an ``InOrder`` per
connection.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

from persistence import PartitionFailedError
from protocol import errors
from protocol.messages import AnyPartitionResult, Rpc
from protocol.records import Record, ShareKey
from protocol.shard import ShareCoordinatorShard
from server.runtime import PartitionRuntime, Status


class Deadlines:
    """The write timeout of every request waiting for durability, kept by one task
    instead of a timer per request (arming and cancelling a timer took ~2 us on uvloop,
    a few percent of a small write's CPU). Every wait has the same
    timeout, so the queue is in deadline order: the sweep, a few times per timeout,
    drops the answered waits at its head and settles the expired ones with no failure,
    which leaves the barrier's ``pending`` saying which partitions did not make it. A
    wait ends between its timeout and a quarter of it (at most 100 ms) later."""

    def __init__(self, timeout_s: float, clock: Callable[[], float]) -> None:
        self.timeout_s = timeout_s
        self.sweep_every_s = min(timeout_s / 4, 0.1)
        self._clock = clock
        self._waits: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()

    def add(self, future: asyncio.Future[Any]) -> None:
        self._waits.append((self._clock() + self.timeout_s, future))

    def sweep(self) -> None:
        now = self._clock()
        waits = self._waits
        while waits:
            deadline, future = waits[0]
            if not future.done():
                if deadline > now:
                    return
                future.set_result({})
            waits.popleft()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every_s)
            self.sweep()


class InOrder:
    """The requests of one connection, run in the order they came (Kafka runs a
    connection's requests one after the other): each takes a ``Place`` when it comes,
    and ``handle`` runs its entries once the one before has run its own."""

    __slots__ = ("_last", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # (asyncio.get_running_loop() is ~140 ns a call on 3.11)
        self._last: asyncio.Future[None] | None = None

    def enter(self) -> Place:
        executed = self._loop.create_future()
        place = Place(self._last, executed)
        self._last = executed
        return place


class Place:
    """One request's place in an ``InOrder``."""

    __slots__ = ("_before", "executed")

    def __init__(self, before: asyncio.Future[None] | None, executed: asyncio.Future[None]) -> None:
        self._before = before
        self.executed = executed

    def waits_for(self) -> asyncio.Future[None] | None:
        """What to await before this request runs its entries: the one before it
        having run its own; None when it may run them now (no coroutine to await)."""
        before = self._before
        if before is None or before.done():
            return None
        return before

    def leave(self) -> None:
        """Let the next request run (also when this one failed or never ran)."""
        if not self.executed.done():
            self.executed.set_result(None)


class Inactive(Exception):
    """An entry found its partition not active when its turn came (``code``)."""

    def __init__(self, code: int) -> None:
        self.code = code


def inactive_code(runtime: PartitionRuntime) -> int:
    if runtime.status is Status.LOADING:
        return errors.COORDINATOR_LOAD_IN_PROGRESS
    return errors.COORDINATOR_NOT_AVAILABLE


async def execute_in_turn(
    runtime: PartitionRuntime, rpc: Rpc, key: ShareKey, entry: Any
) -> AnyPartitionResult:
    """One entry on a partition that is taken, or that this entry takes for long work:
    after everyone before it, off the loop when it is long."""
    await runtime.turn()
    try:
        if runtime.status is not Status.ACTIVE:
            raise Inactive(inactive_code(runtime))
        if runtime.is_long(rpc, key, entry):
            return await runtime.execute_offloaded(rpc, key, entry)
        return runtime.execute(rpc, key, entry)
    finally:
        runtime.release()


async def run_job(
    runtime: PartitionRuntime, job: Callable[[ShareCoordinatorShard], list[Record]]
) -> int:
    """A maintenance job on a partition, in its turn if the partition is taken (an
    offloaded write must not find its key changed under it)."""
    if not runtime.held:
        return runtime.run_job(job)
    await runtime.turn()
    try:
        if runtime.status is not Status.ACTIVE:  # it failed while the job waited
            raise PartitionFailedError(runtime.partition, None)
        return runtime.run_job(job)
    finally:
        runtime.release()
