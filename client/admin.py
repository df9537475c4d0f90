"""The calls beside the five RPCs: admin state, find-coordinator, and the topic
catalog, which fans out to every node (docs/semantics.md §A). Each is one HTTP call per node,
retried on its own (``client.retry.call_with_retries``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from client.calls import EntryCaller
from client.retry import (
    Failure,
    RetryPolicy,
    call_with_retries,
    is_retriable_exception,
    transport_failure,
)
from client.routing import NodeAddress, Router
from client.transport import CONTENT_TYPES, Answer, HttpTransport, refusal
from client.types import ClientStats
from client.validation import check_group_id, check_topic_id
from protocol import errors
from protocol.client_codec import BodyError, decode_admin_state
from protocol.messages import AdminState, CoordinatorResult
from protocol.routing import partition_for

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
_NOT_REGISTERED = -1


class AdminCalls:
    def __init__(
        self,
        transport: HttpTransport,
        router: Router,
        caller: EntryCaller,
        stats: ClientStats,
        rng: random.Random,
        *,
        max_keys_per_request: int,
    ) -> None:
        self._transport = transport
        self._router = router
        self._caller = caller
        self._stats = stats
        self._rng = rng
        self._max_keys = max_keys_per_request

    async def admin_state(
        self, group_id: str, topic_id: str, partition: int, policy: RetryPolicy
    ) -> AdminState | None:
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
                    self._stats.not_coordinator += 1
                    self._router.forget(state_partition, owner.url)
                return failure
            try:
                return decode_admin_state(answer.body, answer.fmt)
            except BodyError as exc:
                return Failure(errors.UNKNOWN_SERVER_ERROR, f"malformed admin state: {exc}", False)

        what = f"admin state of group {group_id!r} topic {topic_id} partition {partition}"
        return await call_with_retries(what, attempt, policy, self._rng)

    async def find_coordinator(
        self, keys: Sequence[str], policy: RetryPolicy
    ) -> list[CoordinatorResult]:
        keys = list(keys)
        bootstrap = self._router.bootstrap
        turn = itertools.count()

        async def attempt(remaining: float) -> list[CoordinatorResult] | Failure:
            url = bootstrap[next(turn) % len(bootstrap)]  # each attempt asks the next one
            results: list[CoordinatorResult] = []
            for start in range(0, len(keys), self._max_keys):
                chunk = await self._caller.find(url, keys[start : start + self._max_keys])
                if isinstance(chunk, Failure):
                    return chunk
                results += chunk
            return results

        return await call_with_retries("find-coordinator", attempt, policy, self._rng)

    async def register_topic(
        self, topic_id: str, partition_count: int, policy: RetryPolicy
    ) -> None:
        canonical = _checked_topic_id(topic_id)
        body = json.dumps({"topic_id": canonical, "partition_count": partition_count}).encode()

        async def on_node(node: NodeAddress) -> Failure | None:
            answer = await self._http("PUT", f"{node.url}/v1/admin/topics", body, _JSON_HEADERS)
            if isinstance(answer, Failure):
                return answer
            return None if answer.status == 200 else refusal(answer)

        await self._on_every_node(f"register topic {topic_id}", on_node, policy)

    async def delete_topic(self, topic_id: str, policy: RetryPolicy) -> int:
        canonical = _checked_topic_id(topic_id)

        async def on_node(node: NodeAddress) -> int | Failure:
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

        counts = await self._on_every_node(f"delete topic {topic_id}", on_node, policy)
        if all(count == _NOT_REGISTERED for count in counts):
            raise errors.UnknownTopicOrPartition(
                f"topic {topic_id} is not in the topic catalog of any node"
            )
        return sum(count for count in counts if count != _NOT_REGISTERED)

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
        on_node: Callable[[NodeAddress], Awaitable[Any]],
        policy: RetryPolicy,
    ) -> list[Any]:
        """Run ``on_node`` on every node, each retried on its own, all within one
        deadline. Every node is every owner of a state partition, found by asking for
        all of them (one find-coordinator request the first time)."""
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
            what_here = f"{what} on node {node.node_id} at {node.url}"
            return await call_with_retries(what_here, lambda _: on_node(node), left, self._rng)

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
