"""One call of the five RPCs, end to end: check, route, coalesce, retry, demultiplex.

A call is a list of partition entries for one group. Each attempt routes the entries
still open to the owners of their state partitions (``client.routing``), queues them
with the entries of concurrent calls (``client.batching``), and waits for each one's
outcome until the call's deadline. Entries that end with a retriable code (3, 14, 15,
16) or a transport failure are sent again, and only they, after a backoff with full
jitter; a 16 first drops the cached owner. Everything else is final.

The outcome of each entry is a ``protocol.messages`` result (whatever its code), or a
``Failure`` when the coordinator produced none: the callers turn both into results
(errors as data) or into raised errors.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from client.batching import Coalescer, Outcome, Pending
from client.retry import (
    RETRIABLE_CODES,
    Failure,
    RetryPolicy,
    backoff_delay,
    is_retriable_exception,
    transport_failure,
)
from client.routing import Router
from client.transport import HttpTransport, refusal
from client.types import ClientStats
from client.validation import check_entry, check_group_id, check_topic_id
from protocol import errors
from protocol.client_codec import (
    BodyError,
    decode_find_coordinator_response,
    decode_response,
    encode_find_coordinator,
    encode_request,
)
from protocol.messages import (
    CoordinatorResult,
    FindCoordinatorRequest,
    Rpc,
    ShareGroupStateRequest,
    ShareGroupStateResponse,
    TopicRequest,
)
from protocol.routing import partition_for


@dataclass(frozen=True)
class Execution:
    """The outcome of every entry of a call, in order; ``attempts`` made; whether the
    deadline cut retries short."""

    outcomes: list[Outcome]
    attempts: int
    timed_out: bool


@dataclass(slots=True)
class _Entry:
    topic_id: str  # canonical
    data: Any
    state_partition: int
    sent_to: str = ""


class EntryCaller:
    def __init__(
        self,
        transport: HttpTransport,
        router: Router,
        stats: ClientStats,
        rng: random.Random,
        *,
        linger_s: float,
        max_entries_per_request: int,
        max_state_batches_per_entry: int,
        max_body_bytes: int,
    ) -> None:
        self._transport = transport
        self._router = router
        self._stats = stats
        self._rng = rng
        self._max_batches = max_state_batches_per_entry
        self._max_body_bytes = max_body_bytes
        self.coalescer = Coalescer(
            self.send_chunk, linger_s=linger_s, max_entries=max_entries_per_request
        )

    async def execute(
        self,
        rpc: Rpc,
        group_id: str,
        items: Sequence[tuple[str, Any]],
        policy: RetryPolicy,
    ) -> Execution:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.deadline_s
        outcomes: list[Outcome | None] = [None] * len(items)
        entries: dict[int, _Entry] = {}
        group_problem = check_group_id(group_id)
        for i, (topic_id, data) in enumerate(items):
            canonical, problem = (
                (None, group_problem) if group_problem else check_topic_id(topic_id)
            )
            problem = problem or check_entry(rpc, data, self._max_batches)
            if problem is not None or canonical is None:
                outcomes[i] = Failure(errors.INVALID_REQUEST, problem or "", False)
                continue
            state_partition = partition_for(
                group_id, canonical, data.partition, self._router.num_partitions
            )
            entries[i] = _Entry(canonical, data, state_partition)
        todo = list(entries)
        attempts = 0
        timed_out = False
        answered: dict[int, Outcome] = {}  # each entry's last outcome an answer gave
        while todo:
            attempts += 1
            await self._attempt(rpc, group_id, todo, entries, outcomes, deadline)
            for i in todo:
                outcome = outcomes[i]
                if outcome is not None and not _unanswered(outcome):
                    answered[i] = outcome
            retry = [i for i in todo if _retriable(outcomes[i])]
            if not retry:
                break
            for i in retry:
                outcome = outcomes[i]
                if _code(outcome) == errors.NOT_COORDINATOR:
                    self._stats.not_coordinator += 1
                    self._router.forget(entries[i].state_partition, entries[i].sent_to)
                elif isinstance(outcome, Failure) and outcome.cause is not None:
                    # The owner could not be reached (dead, or gone on leases): ask who
                    # leads now rather than knock on its door until the deadline.
                    self._router.forget(entries[i].state_partition, entries[i].sent_to)
            if policy.max_retries is not None and attempts > policy.max_retries:
                break
            delay = backoff_delay(attempts - 1, policy, self._rng)
            if loop.time() + delay >= deadline:
                timed_out = True
                break
            self._stats.retries += len(retry)
            await asyncio.sleep(delay)
            todo = retry
        # An attempt the deadline cut says less than the answer before it (say, 3: the
        # topic is not in the catalog yet), so that one is the entry's outcome.
        for i, outcome in enumerate(outcomes):
            if outcome is not None and _unanswered(outcome) and i in answered:
                outcomes[i] = answered[i]
        final = [o for o in outcomes if o is not None]
        assert len(final) == len(items)
        return Execution(final, attempts, timed_out)

    async def _attempt(
        self,
        rpc: Rpc,
        group_id: str,
        todo: list[int],
        entries: dict[int, _Entry],
        outcomes: list[Outcome | None],
        deadline: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        owners = await self._router.owners(
            {entries[i].state_partition for i in todo}, deadline - loop.time()
        )
        by_url: dict[str, list[int]] = {}
        for i in todo:
            owner = owners[entries[i].state_partition]
            if isinstance(owner, Failure):
                outcomes[i] = owner
            else:
                entries[i].sent_to = owner.url
                by_url.setdefault(owner.url, []).append(i)
        waiting: dict[asyncio.Future[Outcome], int] = {}
        for url, indices in by_url.items():
            queued = [(entries[i].topic_id, entries[i].data) for i in indices]
            futures = self.coalescer.submit(url, rpc, group_id, queued)
            for i, future in zip(indices, futures, strict=True):
                waiting[future] = i
        if not waiting:
            return
        try:
            await asyncio.wait(waiting, timeout=max(deadline - loop.time(), 0.0))
        finally:
            # Past the deadline, or the caller was cancelled: an entry not sent yet is
            # dropped from its queue; one in flight may still be applied.
            for future in waiting:
                if not future.done():
                    future.cancel()
        for future, i in waiting.items():
            if future.cancelled():
                outcomes[i] = Failure(
                    errors.COORDINATOR_NOT_AVAILABLE,
                    f"no answer from {entries[i].sent_to} within the deadline "
                    "(a write may or may not have been applied)",
                    True,
                    unanswered=True,
                )
            else:
                outcomes[i] = future.result()  # raises what is final for the whole call

    async def send_chunk(
        self, url: str, rpc: Rpc, group_id: str, chunk: list[Pending]
    ) -> list[Outcome]:
        """Send one coalesced request; one outcome per entry of ``chunk``, in order.
        A body over ``max_body_bytes`` is halved (in order) until it fits."""
        request, positions = build_request(group_id, chunk)
        body = encode_request(request, self._transport.fmt)
        if len(body) > self._max_body_bytes and len(chunk) > 1:
            half = len(chunk) // 2
            first = await self.send_chunk(url, rpc, group_id, chunk[:half])
            return first + await self.send_chunk(url, rpc, group_id, chunk[half:])
        self._stats.requests += 1
        self._stats.entries_sent += len(chunk)
        try:
            answer = await self._transport.post(f"{url}/v1/share-group-state/{rpc.value}", body)
        except Exception as exc:
            if not is_retriable_exception(exc):
                raise
            return [transport_failure(url, exc)] * len(chunk)
        if answer.status != 200:
            return [refusal(answer)] * len(chunk)
        try:
            response = decode_response(rpc, answer.body, answer.fmt)
        except BodyError as exc:
            failure = Failure(
                errors.UNKNOWN_SERVER_ERROR, f"malformed response from {url}: {exc}", False
            )
            return [failure] * len(chunk)
        return demultiplex(request, response, positions, url)

    async def find(self, url: str, keys: list[str]) -> list[CoordinatorResult] | Failure:
        """``POST /v1/find-coordinator`` to one node."""
        body = encode_find_coordinator(FindCoordinatorRequest(keys), self._transport.fmt)
        try:
            answer = await self._transport.post(f"{url}/v1/find-coordinator", body)
        except Exception as exc:
            if not is_retriable_exception(exc):
                raise
            return transport_failure(url, exc)
        if answer.status != 200:
            return refusal(answer)
        try:
            return decode_find_coordinator_response(answer.body, answer.fmt).coordinators
        except BodyError as exc:
            return Failure(
                errors.UNKNOWN_SERVER_ERROR,
                f"malformed find-coordinator answer from {url}: {exc}",
                False,
            )


def build_request(
    group_id: str, chunk: list[Pending]
) -> tuple[ShareGroupStateRequest[Any], list[tuple[int, int]]]:
    """The request for ``chunk``: one topic entry per topic, in order of first
    appearance, its partitions in queue order (so duplicates keep their order); and
    where each entry of the chunk sits in it, ``(topic index, partition index)``."""
    topics: list[TopicRequest[Any]] = []
    index_of: dict[str, int] = {}
    positions: list[tuple[int, int]] = []
    for pending in chunk:
        ti = index_of.get(pending.topic_id)
        if ti is None:
            ti = index_of[pending.topic_id] = len(topics)
            topics.append(TopicRequest(pending.topic_id, []))
        partitions = topics[ti].partitions
        positions.append((ti, len(partitions)))
        partitions.append(pending.entry)
    return ShareGroupStateRequest(group_id, topics), positions


def demultiplex(
    request: ShareGroupStateRequest[Any],
    response: ShareGroupStateResponse[Any],
    positions: list[tuple[int, int]],
    url: str,
) -> list[Outcome]:
    """Each entry's result, by position (docs/api.md: results mirror the request)."""
    results = response.results
    mirrored = len(results) == len(request.topics) and all(
        result.topic_id == topic.topic_id
        and [r.partition for r in result.partitions] == [p.partition for p in topic.partitions]
        for result, topic in zip(results, request.topics, strict=True)
    )
    if not mirrored:
        failure = Failure(
            errors.UNKNOWN_SERVER_ERROR,
            f"the response from {url} does not mirror its request (docs/api.md)",
            False,
        )
        return [failure] * len(positions)
    return [results[ti].partitions[pi] for ti, pi in positions]


def _retriable(outcome: Outcome | None) -> bool:
    if isinstance(outcome, Failure):
        return outcome.retriable
    return outcome is not None and outcome.error_code in RETRIABLE_CODES


def _unanswered(outcome: Outcome) -> bool:
    return isinstance(outcome, Failure) and outcome.unanswered


def _code(outcome: Outcome | None) -> int | None:
    if isinstance(outcome, Failure):
        return outcome.code
    return None if outcome is None else outcome.error_code
