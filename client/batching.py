"""Coalescing: concurrent calls to one node, for one RPC and one group, share a request.

Kafka's persister batches the requests of many share-partitions per coordinator; this
does the same. Calls are queued per ``(node URL, RPC, group id)``:

1. The first entry to reach an idle queue starts its sender, which waits ``linger_s``
   (with 0 it only yields once, so entries submitted in the same turn of the event loop
   still join) and then takes everything queued.
2. The sender splits what it took into chunks of at most ``max_entries`` entries and
   sends them one after the other, in queue order.
3. Whatever was queued while a request was in flight goes out as the next request
   as soon as that one is answered: one request in flight per queue, never more.
4. An entry whose caller stopped waiting (deadline, cancellation) before it was sent
   is dropped.

Results mirror the request (docs/api.md: same order, duplicates run in order), so the
sender hands each caller the result at its position. Because a queue has one request
in flight at a time and sends in queue order, calls of one RPC for one group to one
node are applied in the order they were made (until a retry re-queues one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from client.retry import Failure
from protocol.messages import AnyPartitionResult, Rpc

Outcome = AnyPartitionResult | Failure


@dataclass(slots=True)
class Pending:
    """One partition entry waiting for its result: the canonical topic id, the
    partition's request data (a ``protocol.messages`` partition type), the future."""

    topic_id: str
    entry: Any
    future: asyncio.Future[Outcome]


# Sends one chunk to a node; returns one outcome per entry, in order.
SendChunk = Callable[[str, Rpc, str, list[Pending]], Awaitable[list[Outcome]]]
QueueKey = tuple[str, Rpc, str]


@dataclass(slots=True)
class _Queue:
    pending: list[Pending] = field(default_factory=list)
    sender: asyncio.Task[None] | None = None


class Coalescer:
    def __init__(self, send: SendChunk, *, linger_s: float, max_entries: int) -> None:
        if linger_s < 0:
            raise ValueError(f"linger must be >= 0, got {linger_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries_per_request must be >= 1, got {max_entries}")
        self._send = send
        self._linger_s = linger_s
        self._max_entries = max_entries
        self._queues: dict[QueueKey, _Queue] = {}
        self._closed = False

    def submit(
        self, url: str, rpc: Rpc, group_id: str, entries: list[tuple[str, Any]]
    ) -> list[asyncio.Future[Outcome]]:
        """Queue entries ``(canonical topic id, partition data)`` for ``url``; one future
        per entry, resolved with its outcome (or the exception a send raised)."""
        if self._closed:
            raise RuntimeError("the client was closed")
        loop = asyncio.get_running_loop()
        key = (url, rpc, group_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue()
        futures: list[asyncio.Future[Outcome]] = []
        for topic_id, entry in entries:
            future: asyncio.Future[Outcome] = loop.create_future()
            queue.pending.append(Pending(topic_id, entry, future))
            futures.append(future)
        if queue.sender is None:
            queue.sender = loop.create_task(self._drain(key, queue), name=f"send-{rpc.value}")
        return futures

    async def _drain(self, key: QueueKey, queue: _Queue) -> None:
        url, rpc, group_id = key
        try:
            # linger 0 still yields once: the task starts in a later turn of the loop.
            if self._linger_s > 0:
                await asyncio.sleep(self._linger_s)
            while True:
                taken = [p for p in queue.pending if not p.future.done()]
                queue.pending = []
                if not taken:
                    return
                for start in range(0, len(taken), self._max_entries):
                    chunk = [p for p in taken[start : start + self._max_entries] if _live(p)]
                    if chunk:
                        await self._send_chunk(url, rpc, group_id, chunk)
        finally:
            queue.sender = None
            if queue.pending:
                # Only after a cancellation (close): tell whoever still waits.
                _fail_all(queue.pending, RuntimeError("the client was closed"))
                queue.pending = []
            if self._queues.get(key) is queue:
                del self._queues[key]

    async def _send_chunk(self, url: str, rpc: Rpc, group_id: str, chunk: list[Pending]) -> None:
        try:
            outcomes = await self._send(url, rpc, group_id, chunk)
        except asyncio.CancelledError:
            _fail_all(chunk, RuntimeError("the client was closed"))
            raise
        except Exception as exc:
            _fail_all(chunk, exc)
            return
        for pending, outcome in zip(chunk, outcomes, strict=True):
            if not pending.future.done():
                pending.future.set_result(outcome)

    async def close(self) -> None:
        """Stop every sender; callers still waiting get ``RuntimeError``."""
        self._closed = True
        senders = [q.sender for q in self._queues.values() if q.sender is not None]
        for sender in senders:
            sender.cancel()
        await asyncio.gather(*senders, return_exceptions=True)


def _live(pending: Pending) -> bool:
    return not pending.future.done()


def _fail_all(entries: list[Pending], exc: BaseException) -> None:
    for pending in entries:
        if not pending.future.done():
            pending.future.set_exception(exc)
            pending.future.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Outcome]) -> None:
    if not future.cancelled():
        future.exception()
