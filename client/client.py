"""``ShareCoordinatorClient``: what a share-partition leader uses to keep its state."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlencode

import aiohttp

from client.batching import Outcome
from client.calls import EntryCaller
from client.retry import (
    DeadlineExceeded,
    Failure,
    RetryPolicy,
    call_with_retries,
    is_retriable_exception,
    transport_failure,
)
from client.routing import NodeAddress, Router, parse_bootstrap
from client.transport import CONTENT_TYPES, Answer, HttpTransport, refusal
from client.types import ClientStats, ReadResult, ReadSummaryResult
from client.validation import check_group_id, check_topic_id
from protocol import errors
from protocol.batches import StateBatch
from protocol.client_codec import BodyError, Format, decode_admin_state
from protocol.messages import (
    AdminState,
    CoordinatorResult,
    DeletePartition,
    InitializePartition,
    PartitionResult,
    ReadPartition,
    ReadPartitionResult,
    ReadSummaryPartition,
    ReadSummaryPartitionResult,
    Rpc,
    WritePartition,
    error_result,
)
from protocol.routing import partition_for

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_NOT_REGISTERED = -1


class ShareCoordinatorClient:
    """An asyncio client of one sharecoord deployment (one daemon, or a cluster).

    ``bootstrap`` names one or more daemons (``http://host:port``, or ``host:port``);
    the client finds the owner of every state partition through them. Use it as
    ``async with ShareCoordinatorClient(...) as client:`` (or call ``close()``); it
    keeps one pooled HTTP session, at most ``max_connections_per_host`` connections to
    each daemon.

    **Errors.** The per-partition calls (``initialize``, ``read``, ``write``,
    ``delete``, ``read_summary``) raise the typed Kafka error of ``protocol.errors``
    when the share-partition fails after retries: ``FencedLeaderEpoch`` (74),
    ``FencedStateEpoch`` (124), ``InvalidRequest`` (42: an uninitialized share-partition,
    a bad entry, or HTTP 400 with the daemon's message), ``ClusterAuthorizationFailed``
    (31, HTTP 401)... If retriable failures last until the deadline they raise
    ``DeadlineExceeded`` (a ``TimeoutError``; ``last_error`` holds the typed error).
    The ``*_many`` calls return one ``protocol.messages`` result per entry instead, in
    the order given, with ``error_code`` and ``error_message`` (errors as data); an entry
    the daemon never answered ends with 15 COORDINATOR_NOT_AVAILABLE and a message
    saying why. ``ConfigurationError`` (``num_partitions`` differs from the daemons')
    and TLS failures raise from every call.

    **Retries.** 3, 14, 15 and 16 are retriable (SPEC §12, as Kafka's persister), and so
    are refused or reset connections, disconnects, timeouts and HTTP 5xx. Only the
    failed entries are sent again, after exponential backoff with full jitter
    (``retry_backoff_ms`` doubling up to ``retry_backoff_max_ms``), within the call's
    deadline (``deadline_s``, per call or the client's default) and at most
    ``max_retries`` times (None: until the deadline). A 16 drops the cached owner first.

    **At least once.** Like Kafka's persister, the client re-sends a write whose answer
    was lost (a timeout, a dropped connection): such a write may have been applied,
    and is then applied again. Writes carry absolute state (start offset, batches with
    their delivery counts), so applying one twice in a row is harmless, but a re-sent
    write that lands after a newer write for the same share-partition would roll it
    back: keep at most one write in flight per share-partition (a leader awaits each
    write). A call that raises ``DeadlineExceeded`` may or may not have been applied.

    **Coalescing.** Concurrent calls of one RPC for one group to one daemon share a
    request (after ``linger_ms``; 0 sends at once but still merges what queues up while
    a request is in flight), split at ``max_entries_per_request`` entries and
    ``max_body_bytes``: keep both at or below the daemons' limits.

    ``format`` picks the wire format (msgpack, or JSON for debugging); ``trace_configs``
    are handed to the aiohttp session (request tracing, metrics); ``rng`` drives the
    backoff jitter.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        num_partitions: int = 50,
        linger_ms: float = 1.0,
        request_timeout_s: float = 30.0,
        deadline_s: float = 60.0,
        max_retries: int | None = None,
        retry_backoff_ms: float = 50.0,
        retry_backoff_max_ms: float = 2000.0,
        max_entries_per_request: int = 5000,
        max_state_batches_per_entry: int = 10000,
        max_body_bytes: int = 4 * 1024 * 1024,
        max_connections_per_host: int = 10,
        format: Format = Format.MSGPACK,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.stats = ClientStats()
        self._retry = RetryPolicy(
            deadline_s, max_retries, retry_backoff_ms / 1000, retry_backoff_max_ms / 1000
        )
        self._rng = rng if rng is not None else random.Random()
        self._max_entries = max_entries_per_request
        self._transport = HttpTransport(
            token=token,
            ssl=ssl,
            request_timeout_s=request_timeout_s,
            max_connections_per_host=max_connections_per_host,
            fmt=format,
            trace_configs=trace_configs,
        )
        self._router = Router(
            parse_bootstrap(bootstrap, tls=ssl is not None),
            num_partitions,
            self._find,
            max_keys_per_request=max_entries_per_request,
            on_lookup=self._count_lookup,
        )
        self._caller = EntryCaller(
            self._transport,
            self._router,
            self.stats,
            self._rng,
            linger_s=linger_ms / 1000,
            max_entries_per_request=max_entries_per_request,
            max_state_batches_per_entry=max_state_batches_per_entry,
            max_body_bytes=max_body_bytes,
        )
        self._closed = False

    async def __aenter__(self) -> ShareCoordinatorClient:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop sending, fail the calls still waiting, close every connection."""
        self._closed = True
        await self._caller.coalescer.close()
        await self._router.close()
        await self._transport.close()

    # --- one share-partition per call (errors raise) ----------------------------------

    async def initialize(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        *,
        state_epoch: int,
        start_offset: int,
        deadline_s: float | None = None,
    ) -> None:
        """InitializeShareGroupState (SPEC §5.1); ``start_offset`` -1: not set."""
        entry = InitializePartition(partition, state_epoch, start_offset)
        await self._one(Rpc.INITIALIZE, group_id, topic_id, entry, deadline_s)

    async def read(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        *,
        leader_epoch: int,
        deadline_s: float | None = None,
    ) -> ReadResult:
        """ReadShareGroupState (SPEC §5.2); a higher ``leader_epoch`` is recorded."""
        entry = ReadPartition(partition, leader_epoch)
        result = await self._one(Rpc.READ, group_id, topic_id, entry, deadline_s)
        return ReadResult.of(result)

    async def write(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        *,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        state_batches: Sequence[StateBatch],
        delivery_complete_count: int = -1,
        deadline_s: float | None = None,
    ) -> None:
        """WriteShareGroupState (SPEC §5.3); -1 leaves ``start_offset`` and
        ``delivery_complete_count`` as they are. At least once: see the class doc."""
        entry = WritePartition(
            partition,
            state_epoch,
            leader_epoch,
            start_offset,
            list(state_batches),
            delivery_complete_count,
        )
        await self._one(Rpc.WRITE, group_id, topic_id, entry, deadline_s)

    async def delete(
        self, group_id: str, topic_id: str, partition: int, *, deadline_s: float | None = None
    ) -> None:
        """DeleteShareGroupState (SPEC §5.4); deleting a key with no state succeeds."""
        await self._one(Rpc.DELETE, group_id, topic_id, DeletePartition(partition), deadline_s)

    async def read_summary(
        self,
        group_id: str,
        topic_id: str,
        partition: int,
        *,
        leader_epoch: int = -1,
        deadline_s: float | None = None,
    ) -> ReadSummaryResult:
        """ReadShareGroupStateSummary (SPEC §5.5); ``leader_epoch`` is ignored."""
        entry = ReadSummaryPartition(partition, leader_epoch)
        result = await self._one(Rpc.READ_SUMMARY, group_id, topic_id, entry, deadline_s)
        return ReadSummaryResult.of(result)

    # --- many share-partitions of one group per call (errors as data) -----------------
    # Each entry is (topic_id, partition data); the results come in the same order.

    async def initialize_many(
        self,
        group_id: str,
        entries: Sequence[tuple[str, InitializePartition]],
        *,
        deadline_s: float | None = None,
    ) -> list[PartitionResult]:
        return cast(
            list[PartitionResult], await self._many(Rpc.INITIALIZE, group_id, entries, deadline_s)
        )

    async def read_many(
        self,
        group_id: str,
        entries: Sequence[tuple[str, ReadPartition]],
        *,
        deadline_s: float | None = None,
    ) -> list[ReadPartitionResult]:
        return cast(
            list[ReadPartitionResult], await self._many(Rpc.READ, group_id, entries, deadline_s)
        )

    async def write_many(
        self,
        group_id: str,
        entries: Sequence[tuple[str, WritePartition]],
        *,
        deadline_s: float | None = None,
    ) -> list[PartitionResult]:
        return cast(
            list[PartitionResult], await self._many(Rpc.WRITE, group_id, entries, deadline_s)
        )

    async def delete_many(
        self,
        group_id: str,
        entries: Sequence[tuple[str, DeletePartition]],
        *,
        deadline_s: float | None = None,
    ) -> list[PartitionResult]:
        return cast(
            list[PartitionResult], await self._many(Rpc.DELETE, group_id, entries, deadline_s)
        )

    async def read_summary_many(
        self,
        group_id: str,
        entries: Sequence[tuple[str, ReadSummaryPartition]],
        *,
        deadline_s: float | None = None,
    ) -> list[ReadSummaryPartitionResult]:
        results = await self._many(Rpc.READ_SUMMARY, group_id, entries, deadline_s)
        return cast(list[ReadSummaryPartitionResult], results)

    # --- admin and discovery -----------------------------------------------------------

    async def admin_state(
        self, group_id: str, topic_id: str, partition: int, *, deadline_s: float | None = None
    ) -> AdminState | None:
        """The stored state of one share-partition, with its fencing maxima (SPEC §A.1
        point 10), from its owner; None if it has none. No fencing, no side effect."""
        self._start()
        canonical, problem = check_topic_id(topic_id)
        problem = check_group_id(group_id) or problem
        if problem is None and (type(partition) is not int or not 0 <= partition < 2**31):
            problem = f"partition: expected an int32 >= 0, got {partition!r}"
        if problem is not None or canonical is None:
            raise errors.InvalidRequest(problem)
        num_partitions = self._router.num_partitions
        state_partition = partition_for(group_id, canonical, partition, num_partitions)
        query = urlencode({"group_id": group_id, "topic_id": topic_id, "partition": partition})
        accept = {"Accept": CONTENT_TYPES[self._transport.fmt]}

        async def attempt(remaining: float) -> AdminState | Failure | None:
            owner = (await self._router.owners([state_partition], remaining))[state_partition]
            if isinstance(owner, Failure):
                return owner
            answer = await self._http("GET", f"{owner.url}/v1/admin/state?{query}", None, accept)
            if isinstance(answer, Failure):
                return answer
            if answer.status == 404:
                return None
            if answer.status != 200:
                failure = refusal(answer)
                if failure.code == errors.NOT_COORDINATOR:
                    self.stats.not_coordinator += 1
                    self._router.forget(state_partition, owner.url)
                return failure
            try:
                return decode_admin_state(answer.body, answer.fmt)
            except BodyError as exc:
                return Failure(errors.UNKNOWN_SERVER_ERROR, f"malformed admin state: {exc}", False)

        what = f"admin state of group {group_id!r} topic {topic_id} partition {partition}"
        return await call_with_retries(what, attempt, self._policy(deadline_s), self._rng)

    async def find_coordinator(
        self, keys: Sequence[str], *, deadline_s: float | None = None
    ) -> list[CoordinatorResult]:
        """Ask a bootstrap node which node owns each coordinator key
        (``"group:topicId:partition"``, SPEC §1.2); a key that does not parse gets
        ``error_code`` 42 in its result. The client's own routing does not need this."""
        self._start()
        keys = list(keys)
        bootstrap = self._router.bootstrap
        turn = itertools.count()

        async def attempt(remaining: float) -> list[CoordinatorResult] | Failure:
            url = bootstrap[next(turn) % len(bootstrap)]
            results: list[CoordinatorResult] = []
            for start in range(0, len(keys), self._max_entries):
                chunk = await self._caller.find(url, keys[start : start + self._max_entries])
                if isinstance(chunk, Failure):
                    return chunk
                results += chunk
            return results

        return await call_with_retries(
            "find-coordinator", attempt, self._policy(deadline_s), self._rng
        )

    async def register_topic(
        self, topic_id: str, partition_count: int, *, deadline_s: float | None = None
    ) -> None:
        """Register (or resize) a topic in the topic catalog of every node (SPEC §A)."""
        self._start()
        canonical = _checked_topic_id(topic_id)
        body = json.dumps({"topic_id": canonical, "partition_count": partition_count}).encode()

        async def on_node(node: NodeAddress, remaining: float) -> Failure | None:
            answer = await self._http("PUT", f"{node.url}/v1/admin/topics", body, _JSON_HEADERS)
            if isinstance(answer, Failure):
                return answer
            return None if answer.status == 200 else refusal(answer)

        await self._on_every_node(f"register topic {topic_id}", on_node, deadline_s)

    async def delete_topic(self, topic_id: str, *, deadline_s: float | None = None) -> int:
        """Remove a topic from the topic catalog of every node, tombstoning all its
        share-partition state (Kafka's onTopicsDeleted); returns how many
        share-partitions were deleted in all. ``UnknownTopicOrPartition`` if no node
        had the topic registered."""
        self._start()
        canonical = _checked_topic_id(topic_id)

        async def on_node(node: NodeAddress, remaining: float) -> int | Failure:
            url = f"{node.url}/v1/admin/topics/{canonical}"
            answer = await self._http("DELETE", url, None, _JSON_HEADERS)
            if isinstance(answer, Failure):
                return answer
            if answer.status == 404:
                return _NOT_REGISTERED
            if answer.status != 200:
                return refusal(answer)
            try:
                deleted = json.loads(answer.body)["deleted_share_partitions"]
            except (ValueError, KeyError, TypeError):
                deleted = None
            if type(deleted) is not int or deleted < 0:
                return Failure(errors.UNKNOWN_SERVER_ERROR, f"malformed answer from {url}", False)
            return deleted

        counts = await self._on_every_node(f"delete topic {topic_id}", on_node, deadline_s)
        if all(count == _NOT_REGISTERED for count in counts):
            raise errors.UnknownTopicOrPartition(
                f"topic {topic_id} is not in the topic catalog of any node"
            )
        return sum(count for count in counts if count != _NOT_REGISTERED)

    # --- internals -----------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")
        self._transport.start()

    def _policy(self, deadline_s: float | None) -> RetryPolicy:
        if deadline_s is None:
            return self._retry
        return dataclasses.replace(self._retry, deadline_s=deadline_s)

    def _count_lookup(self) -> None:
        self.stats.coordinator_lookups += 1

    async def _find(self, url: str, keys: list[str]) -> list[CoordinatorResult] | Failure:
        return await self._caller.find(url, keys)

    async def _one(
        self, rpc: Rpc, group_id: str, topic_id: str, entry: Any, deadline_s: float | None
    ) -> Any:
        self._start()
        policy = self._policy(deadline_s)
        execution = await self._caller.execute(rpc, group_id, [(topic_id, entry)], policy)
        [outcome] = execution.outcomes
        if isinstance(outcome, Failure):
            error = outcome.error()
        elif outcome.error_code == errors.NONE:
            return outcome
        else:
            error = errors.for_code(outcome.error_code)(outcome.error_message)
        if execution.timed_out:
            what = f"{rpc.value} of group {group_id!r} topic {topic_id} partition {entry.partition}"
            raise DeadlineExceeded(what, policy.deadline_s, execution.attempts, error) from error
        raise error

    async def _many(
        self,
        rpc: Rpc,
        group_id: str,
        entries: Sequence[tuple[str, Any]],
        deadline_s: float | None,
    ) -> list[Any]:
        self._start()
        execution = await self._caller.execute(rpc, group_id, entries, self._policy(deadline_s))
        return [
            _as_result(rpc, outcome, data)
            for outcome, (_, data) in zip(execution.outcomes, entries, strict=True)
        ]

    async def _http(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> Answer | Failure:
        try:
            return await self._transport.request(method, url, body, headers)
        except Exception as exc:
            if not is_retriable_exception(exc):
                raise
            return transport_failure(url, exc)

    async def _on_every_node(
        self,
        what: str,
        on_node: Callable[[NodeAddress, float], Awaitable[Any]],
        deadline_s: float | None,
    ) -> list[Any]:
        """Run ``on_node(node, seconds left)`` on every node, each retried on its own,
        all within one deadline (SPEC §A: catalog calls fan out to every node)."""
        policy = self._policy(deadline_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.deadline_s

        async def every_node(remaining: float) -> list[NodeAddress] | Failure:
            owners = await self._router.owners(range(self._router.num_partitions), remaining)
            nodes = set()
            for owner in owners.values():
                if isinstance(owner, Failure):
                    return owner
                nodes.add(owner)
            return sorted(nodes)

        nodes = await call_with_retries(f"{what}: find every node", every_node, policy, self._rng)

        async def run(node: NodeAddress) -> Any:
            left = dataclasses.replace(policy, deadline_s=max(deadline - loop.time(), 1e-3))
            return await call_with_retries(
                f"{what} on node {node.node_id} at {node.url}",
                lambda remaining: on_node(node, remaining),
                left,
                self._rng,
            )

        outcomes = await asyncio.gather(*(run(n) for n in nodes), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)


def _checked_topic_id(topic_id: str) -> str:
    canonical, problem = check_topic_id(topic_id)
    if canonical is None:
        raise errors.InvalidRequest(problem)
    return canonical


def _as_result(rpc: Rpc, outcome: Outcome, data: Any) -> Any:
    if not isinstance(outcome, Failure):
        return outcome
    partition = getattr(data, "partition", -1)
    return error_result(
        rpc, partition if type(partition) is int else -1, outcome.code, outcome.message
    )
