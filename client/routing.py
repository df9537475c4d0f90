"""Which node owns which state partition (docs/semantics.md §1.2, §1.3;
docs/api.md#find-coordinator).

The client hashes every share-partition key to its state partition itself, exactly as
the daemon's service does (``partition_for`` over the raw group id and the canonical
topic id). Only the owner of a state partition comes from the daemons, and it is learned
lazily: the first call that needs partition ``p`` asks a bootstrap node (then any known
node) ``find-coordinator`` for a *probe key*, a key chosen once so that it hashes to
``p``. Asking for a probe key rather than the caller's key means any group id works,
even a blank one, which find-coordinator refuses as Kafka does (a ``:`` inside or
padding spaces it hashes as given, as the daemon routes the RPCs), and the state
partition in the answer checks that both sides count the same number of state
partitions. Lookups wanted in the same turn of the event loop share one request;
a lookup in flight is shared by everyone waiting for it. An owner is forgotten when it
answers 16 NOT_COORDINATOR or cannot be reached, and looked up again on the next attempt
(on the PostgreSQL store, a dead node's partitions move to the others).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from client.retry import RETRIABLE_CODES, Failure
from protocol import errors
from protocol.messages import CoordinatorResult
from protocol.routing import partition_for

# Any valid topic id serves for probe keys; this one is UUID (0, 0).
_PROBE_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
# Advertised hosts that say "every interface" rather than where to connect.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})

FindCoordinator = Callable[[str, list[str]], Awaitable[list[CoordinatorResult] | Failure]]


class ConfigurationError(ValueError):
    """The client's settings disagree with the daemons' (the number of state
    partitions); retrying cannot help."""


@dataclass(frozen=True, order=True)
class NodeAddress:
    """A daemon: its node id and the base URL the client reaches it at."""

    node_id: int
    url: str


def parse_bootstrap(bootstrap: str | Sequence[str], *, tls: bool) -> list[str]:
    """Base URLs (``scheme://host:port``) of the bootstrap nodes. An entry may be a URL
    or ``host:port``, which takes ``https`` when a TLS context is given."""
    entries = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
    if not entries:
        raise ValueError("at least one bootstrap URL is needed")
    urls: list[str] = []
    for entry in entries:
        text = entry.strip()
        if "://" not in text:
            text = f"{'https' if tls else 'http'}://{text}"
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bootstrap {entry!r}: expected http(s)://host:port")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"bootstrap {entry!r}: expected no path, only http(s)://host:port")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"bootstrap {entry!r}: {exc}") from None
        default_port = 443 if parts.scheme == "https" else 80
        url = node_url(parts.scheme, parts.hostname, port if port is not None else default_port)
        if url not in urls:
            urls.append(url)
    return urls


def node_url(scheme: str, host: str, port: int) -> str:
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = False
    return f"{scheme}://{f'[{host}]' if is_v6 else host}:{port}"


@functools.lru_cache(maxsize=8)
def probe_keys(num_partitions: int) -> tuple[str, ...]:
    """One coordinator key per state partition, ``keys[p]`` hashing to ``p``."""
    keys: list[str | None] = [None] * num_partitions
    missing = num_partitions
    n = 0
    while missing:
        group_id = f"sharecoord-probe-{n}"
        p = partition_for(group_id, _PROBE_TOPIC_ID, 0, num_partitions)
        if keys[p] is None:
            keys[p] = f"{group_id}:{_PROBE_TOPIC_ID}:0"
            missing -= 1
        n += 1
    return tuple(k for k in keys if k is not None)


class Router:
    """The cache of state partition -> owner, filled by find-coordinator on demand."""

    def __init__(
        self,
        bootstrap: list[str],
        num_partitions: int,
        find: FindCoordinator,
        *,
        max_keys_per_request: int,
        on_lookup: Callable[[], None] | None = None,
    ) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self.bootstrap = bootstrap
        self.num_partitions = num_partitions
        self._find = find
        self._max_keys = max_keys_per_request
        self._on_lookup = on_lookup
        self._owners: dict[int, NodeAddress] = {}
        self._nodes: dict[int, NodeAddress] = {}
        self._inflight: dict[int, asyncio.Future[NodeAddress | Failure]] = {}
        # Why the last finished lookup of a state partition found no owner: said again
        # when a later lookup runs out of time, which alone would not say why.
        self._last_failure: dict[int, Failure] = {}
        self._queued: list[int] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_bootstrap = 0

    def cached(self, state_partition: int) -> NodeAddress | None:
        return self._owners.get(state_partition)

    def forget(self, state_partition: int, url: str | None = None) -> None:
        """Drop the cached owner (it answered NOT_COORDINATOR): ask again next time.
        With ``url``, only if the cached owner is still that node (another call may
        already have learned the new one)."""
        owner = self._owners.get(state_partition)
        if owner is not None and (url is None or owner.url == url):
            del self._owners[state_partition]

    async def owners(
        self, partitions: Iterable[int], timeout: float
    ) -> dict[int, NodeAddress | Failure]:
        """The owner of each state partition, or the failure that kept it unknown
        (within ``timeout`` seconds). Raises ``ConfigurationError``."""
        found: dict[int, NodeAddress | Failure] = {}
        waits: dict[int, asyncio.Future[NodeAddress | Failure]] = {}
        for p in set(partitions):
            owner = self._owners.get(p)
            if owner is not None:
                found[p] = owner
                continue
            future = self._inflight.get(p)
            if future is None:
                future = asyncio.get_running_loop().create_future()
                self._inflight[p] = future
                if not self._queued:
                    asyncio.get_running_loop().call_soon(self._start_lookup)
                self._queued.append(p)
            waits[p] = future
        if waits:
            # asyncio.wait never cancels what it waits for: others share these futures.
            await asyncio.wait(set(waits.values()), timeout=max(timeout, 0.0))
        for p, future in waits.items():
            if future.done():
                found[p] = future.result()
            else:
                last = self._last_failure.get(p)
                found[p] = Failure(
                    errors.COORDINATOR_NOT_AVAILABLE,
                    f"no find-coordinator answer for state partition {p} within the deadline"
                    + (f" (the lookup before: {last.message})" if last is not None else ""),
                    True,
                    last.cause if last is not None else None,
                )
        return found

    def _start_lookup(self) -> None:
        partitions, self._queued = self._queued, []
        for start in range(0, len(partitions), self._max_keys):
            task = asyncio.get_running_loop().create_task(
                self._lookup(partitions[start : start + self._max_keys])
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _lookup(self, partitions: list[int]) -> None:
        try:
            outcome = await self._ask_any([probe_keys(self.num_partitions)[p] for p in partitions])
            for p, result in zip(partitions, self._read_answer(partitions, outcome), strict=True):
                self._resolve(p, result)
        except BaseException as exc:
            for p in partitions:
                self._fail(p, exc)
            if not isinstance(exc, Exception):
                raise

    async def _ask_any(self, keys: list[str]) -> tuple[str, list[CoordinatorResult]] | Failure:
        """Ask the bootstrap nodes in turn (then the known nodes) until one answers."""
        failure: Failure | None = None
        for url in self._candidates():
            if self._on_lookup is not None:
                self._on_lookup()
            outcome = await self._find(url, keys)
            if not isinstance(outcome, Failure):
                return url, outcome
            failure = outcome
            if not outcome.retriable:
                break
        assert failure is not None  # there is always at least one bootstrap URL
        return failure

    def _candidates(self) -> list[str]:
        # Start at the next bootstrap node each time, to spread lookups and skip a dead
        # node quickly; known nodes come after, in case every bootstrap node is gone.
        i = self._next_bootstrap % len(self.bootstrap)
        self._next_bootstrap += 1
        urls = self.bootstrap[i:] + self.bootstrap[:i]
        urls += [n.url for n in sorted(self._nodes.values()) if n.url not in urls]
        return urls

    def _read_answer(
        self, partitions: list[int], outcome: tuple[str, list[CoordinatorResult]] | Failure
    ) -> list[NodeAddress | Failure]:
        if isinstance(outcome, Failure):
            return [outcome] * len(partitions)
        url, results = outcome
        if len(results) != len(partitions):
            failure = Failure(
                errors.UNKNOWN_SERVER_ERROR,
                f"find-coordinator at {url} answered {len(results)} keys for "
                f"{len(partitions)} asked",
                False,
            )
            return [failure] * len(partitions)
        out: list[NodeAddress | Failure] = []
        for p, result in zip(partitions, results, strict=True):
            if result.error_code != errors.NONE:
                message = result.error_message or errors.default_message(result.error_code) or ""
                out.append(
                    Failure(result.error_code, message, result.error_code in RETRIABLE_CODES)
                )
                continue
            if result.state_partition != p:
                raise ConfigurationError(
                    f"the client counts {self.num_partitions} state partitions but the "
                    f"coordinator at {url} does not (it puts key {result.key!r} in state "
                    f"partition {result.state_partition}, not {p}): set num_partitions to "
                    "the daemons' --partitions"
                )
            out.append(self._address(url, result))
        return out

    def _address(self, answered_by: str, result: CoordinatorResult) -> NodeAddress:
        parts = urlsplit(answered_by)
        scheme = parts.scheme
        host = result.host
        if host in _WILDCARD_HOSTS:
            # A daemon listening on every interface advertises 0.0.0.0: reach it the
            # way the one that answered was reached.
            host = parts.hostname or host
        node = NodeAddress(result.node_id, node_url(scheme, host, result.port))
        self._nodes[node.node_id] = node
        return node

    def _resolve(self, p: int, result: NodeAddress | Failure) -> None:
        if isinstance(result, NodeAddress):
            self._owners[p] = result
            self._last_failure.pop(p, None)
        else:
            self._last_failure[p] = result
        future = self._inflight.pop(p, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _fail(self, p: int, exc: BaseException) -> None:
        future = self._inflight.pop(p, None)
        if future is None or future.done():
            return
        if isinstance(exc, Exception):
            future.set_exception(exc)
            # Marked as retrieved: the waiters may all have gone (deadline, cancel).
            future.add_done_callback(_retrieve)
        else:
            future.cancel()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in list(self._inflight):
            self._fail(p, RuntimeError("the client was closed"))


def _retrieve(future: asyncio.Future[NodeAddress | Failure]) -> None:
    if not future.cancelled():
        future.exception()
