"""``ShareCoordinatorClient``: what a share-partition leader uses to keep its state."""

from __future__ import annotations

import dataclasses
import random
import ssl as ssl_module
from collections.abc import Sequence
from types import TracebackType
from typing import Any, cast

import aiohttp

from client.admin import AdminCalls
from client.batching import Outcome
from client.calls import EntryCaller
from client.retry import DeadlineExceeded, Failure, RetryPolicy
from client.routing import Router, parse_bootstrap
from client.transport import HttpTransport
from client.types import ClientStats, ReadResult, ReadSummaryResult
from protocol import errors
from protocol.client_codec import Format
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
from protocol.state_batch import StateBatch


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
    and TLS failures (``aiohttp.ClientSSLError``: a certificate that does not verify)
    raise from every call, at once.

    **Retries.** 3, 14, 15 and 16 are retriable (docs/semantics.md §12, as Kafka's
    persister), and so are refused or reset connections, disconnects, timeouts and HTTP
    5xx. Only the
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
        self._admin = AdminCalls(
            self._transport,
            self._router,
            self._caller,
            self.stats,
            self._rng,
            max_keys_per_request=max_entries_per_request,
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
        """InitializeShareGroupState (docs/semantics.md §5.1); ``start_offset`` -1: not set."""
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
        """ReadShareGroupState (docs/semantics.md §5.2); a higher ``leader_epoch`` is recorded."""
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
        """WriteShareGroupState (docs/semantics.md §5.3); -1 leaves ``start_offset`` and
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
        """DeleteShareGroupState (docs/semantics.md §5.4); deleting a key with no state succeeds."""
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
        """ReadShareGroupStateSummary (docs/semantics.md §5.5); ``leader_epoch`` is ignored."""
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
        """The stored state of one share-partition, with its fencing maxima (docs/semantics.md §A.1
        point 10), from its owner; None if it has none. No fencing, no side effect."""
        self._start()
        return await self._admin.admin_state(
            group_id, topic_id, partition, self._policy(deadline_s)
        )

    async def find_coordinator(
        self, keys: Sequence[str], *, deadline_s: float | None = None
    ) -> list[CoordinatorResult]:
        """Ask a bootstrap node which node owns each coordinator key
        (``"group:topicId:partition"``, docs/semantics.md §1.2); a key that does not parse gets
        ``error_code`` 42 in its result. The client's own routing does not need this."""
        self._start()
        return await self._admin.find_coordinator(keys, self._policy(deadline_s))

    async def register_topic(
        self, topic_id: str, partition_count: int, *, deadline_s: float | None = None
    ) -> None:
        """Register (or resize) a topic in the topic catalog of every node
        (docs/semantics.md §A)."""
        self._start()
        await self._admin.register_topic(topic_id, partition_count, self._policy(deadline_s))

    async def delete_topic(self, topic_id: str, *, deadline_s: float | None = None) -> int:
        """Remove a topic from the topic catalog of every node, tombstoning all its
        share-partition state (Kafka's onTopicsDeleted); returns how many
        share-partitions were deleted in all. ``UnknownTopicOrPartition`` if no node
        had the topic registered. A node whose deletion is unfinished (a state partition
        loading or failed) answers 14 or 15 and is asked again within the deadline: the
        topic is unregistered there already, and the call returns once every node
        finished (docs/operations.md#deleting-a-topic)."""
        self._start()
        return await self._admin.delete_topic(topic_id, self._policy(deadline_s))

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


def _as_result(rpc: Rpc, outcome: Outcome, data: Any) -> Any:
    if not isinstance(outcome, Failure):
        return outcome
    partition = getattr(data, "partition", -1)
    return error_result(
        rpc, partition if type(partition) is int else -1, outcome.code, outcome.message
    )
