"""Turns for the background folds of lazily loaded partitions (server/runtime.py). A
module of its own: its context managers are generators, which mypyc does not compile,
and the runtime is in the compiled mode (server/native.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator


class BackgroundFolds:
    """Turns for the background folds of lazily loaded partitions
    (``PartitionRuntime._fold_loaded``): one slice per turn of the event loop node-wide
    (a fold holds its turn until the loop has served everyone else once), and none while
    any partition loads, so the folds take what the loads leave (readiness waits for the
    loads, not for the folds)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._loads = 0
        self._no_loads = asyncio.Event()
        self._no_loads.set()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Held while a partition loads."""
        self._loads += 1
        self._no_loads.clear()
        try:
            yield
        finally:
            self._loads -= 1
            if not self._loads:
                self._no_loads.set()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """One slice of a fold: once no partition loads, and no other fold holds one."""
        while True:
            await self._no_loads.wait()
            await self._lock.acquire()
            if not self._loads:
                break
            self._lock.release()  # a load began meanwhile: it goes first
        try:
            yield
        finally:
            self._lock.release()
