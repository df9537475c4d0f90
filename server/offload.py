"""The node's offload thread: CPU work that would hold the event loop for more than a few
milliseconds runs here, one job at a time (a long write's rule and merge, the decoding of
a large body).

One thread, not a pool: Python runs one thread at a time, and the event loop then competes
with this one alone, so it gets the interpreter back within one switch interval
(``sys.getswitchinterval()``, 5 ms) however much work is queued here. The loop keeps
answering health checks and the other clients; the work itself gets what the loop leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

T = TypeVar("T")

# A request body larger than this is decoded and checked on the offload thread (about
# 15 us per KiB of msgpack or JSON with the edge checks: ~2 ms at this size).
OFFLOAD_BODY_BYTES = 128 * 1024


class Offload:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sharecoord-offload")

    async def __call__(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        """Wait for the job that runs, if any (blocking: call it off the loop)."""
        self._executor.shutdown(wait=True, cancel_futures=True)


# How often the loop's lag is sampled: a timer every 10 ms (~0.1% of a core).
LAG_SAMPLE_S = 0.01


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


async def watch_loop_lag(lag: Observer, every_s: float = LAG_SAMPLE_S) -> None:
    """Observe, for ever, how late the loop runs a timer due every ``every_s``: what
    anything that held the loop cost everyone else (``sharecoord_event_loop_lag_seconds``)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + every_s
        await asyncio.sleep(every_s)
        lag.observe(max(0.0, loop.time() - due))
