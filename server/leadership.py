"""Leadership by leases, on the PostgreSQL store (docs/design.md#cluster-mode): which
state partitions this node serves, and for how long it may.

Every node of a cluster runs one ``Leadership``. A round, every third of ``lease_ms``
(sooner when another node's lease is about to expire):

1. heartbeat this node's row (where it listens, HTTP and Kafka), renew every lease it
   holds in one statement, and read the leases and the nodes (one connection);
2. a partition the renewal did not return (expired, or claimed by another node) is
   dropped at once; the others may be served until ``sent + lease_ms`` less a margin
   for the drift of the clocks, by this node's monotonic clock measured from when the
   renewal was *sent*: PostgreSQL set the lease's expiry later than that, so the node
   stops before the lease can have expired;
3. with a cluster file (the *preference*: who should lead what; it never decides
   safety), a partition whose preferred node is live belongs to that node: another
   node holding it hands it back (it stops serving it, then releases it), and only the
   preferred node claims it while it is expired (as long as it stays live; a partition
   still expired two rounds later is claimed by anyone, as below);
4. the other partitions are shared out by count, with share = ceil(partitions / live
   nodes) and floor = partitions // live nodes: while another live node holds less
   than the floor, a node claims expired partitions up to the floor only, and a node
   holding more than the floor hands the excess back (it stops serving it, then
   releases it); otherwise a node claims up to the share, and hands back what it holds
   beyond it. A claim raises the epoch in the same statement. A partition still
   expired two rounds later is claimed by anyone beyond these bounds (nobody else took
   it). So every live node ends between the floor and the share, with no node held
   below the floor by others claiming first (tests/server/test_lease_sharing.py).

A claimed partition is handed to the ``PartitionHost`` (the node), which builds its
runtime and loads it from PostgreSQL (it answers 14 meanwhile); a dropped one leaves the
host at once, its in-memory state with it, and answers 16 from then on. A deadline passed
between two rounds (PostgreSQL away) drops the partition as well: ``may_serve`` says so
to every request before the drop has even run. Safety never rests on these clocks: every
commit checks the epoch (persistence/postgres/store.py), and a commit refused by it
drops the partition too (``lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import Protocol

from persistence.errors import NotLeaderError, StoreUnavailableError
from persistence.postgres import PostgresStore, leases
from persistence.postgres.leases import Lease, NodeRow
from protocol import errors
from protocol.messages import CoordinatorResult
from protocol.routing import parse_coordinator_key, partition_for
from server.cluster import format_partitions

_log = logging.getLogger("sharecoord.leadership")

# A node stops serving a partition this share of the lease before it could have expired
# (clock drift between it and PostgreSQL), and at least this many milliseconds before.
DRIFT_SHARE = 0.1
MIN_DRIFT_MS = 100
# After another node's lease expires, a round starts this much later (PostgreSQL must see
# it expired too).
AFTER_EXPIRY_S = 0.02
# A round that left expired partitions to nodes short of their share looks again this
# much later (they claim in the rounds the same expiry started).
SOON_S = 0.25
# A round that fails says so once per this many seconds.
WARN_EVERY_S = 10.0


class PartitionHost(Protocol):
    """What serves the partitions this node leads (``server.node.Node``)."""

    def adopt(self, partition: int) -> None:
        """Build the partition's runtime and start loading it; it serves once loaded."""
        ...

    async def drop(self, partition: int) -> None:
        """Stop serving the partition now: its runtime and in-memory state go."""
        ...

    def adopting(self) -> bool:
        """Whether an adopted partition is still loading."""
        ...


@dataclass
class _Held:
    epoch: int
    serve_until: float  # monotonic


@dataclass
class ClusterView:
    """The leaders and nodes tables as one round read them."""

    leases: list[Lease] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)


class Leadership:
    def __init__(
        self,
        store: PostgresStore,
        host: PartitionHost,
        *,
        lease_ms: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._host = host
        self.node_id = store.node_id
        self.num_partitions = store.num_partitions
        self.lease_ms = lease_ms
        self._safe_s = (lease_ms - max(lease_ms * DRIFT_SHARE, MIN_DRIFT_MS)) / 1000
        self._monotonic = monotonic
        self._held: dict[int, _Held] = {}
        # Rounds in a row each partition was seen expired and unclaimed.
        self._expired_rounds: dict[int, int] = {}
        self.http_listener: str | None = None
        self.kafka_listener: str | None = None
        self.registered = False  # a round has heartbeated and claimed
        self.takeovers = 0  # partitions claimed from another node whose lease expired
        self.without_leader = 0  # partitions without a live lease at the last round
        self._view = ClusterView()
        # {partition: the node the cluster file prefers to lead it}; empty without one.
        self.preferred: dict[int, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._dropping: dict[int, asyncio.Task[None]] = {}
        self._last_warning = -math.inf

    # --- what the service asks --------------------------------------------------------

    def may_serve(self, partition: int) -> bool:
        """Whether this node may answer for ``partition`` now: it holds its lease and,
        by its own clock, the lease cannot have expired yet."""
        held = self._held.get(partition)
        return held is not None and self._monotonic() < held.serve_until

    @property
    def led(self) -> list[int]:
        return sorted(self._held)

    @property
    def settled(self) -> bool:
        """Registered, and every partition it leads loaded (``/readyz``)."""
        return self.registered and not self._host.adopting()

    async def find_coordinator(self, keys: list[str], kafka: bool) -> list[CoordinatorResult]:
        """Each key's leader from the leaders and nodes tables (its HTTP listener, or its
        Kafka listener's with ``kafka``); 15 for a partition without a live leader, as
        Kafka answers while a coordinator is being elected, and for every key while
        PostgreSQL cannot be asked."""
        try:
            leaders = await asyncio.to_thread(self._live_leaders)
        except (StoreUnavailableError, OSError) as exc:
            reason = f"the state store cannot be asked who leads: {exc}"
            return [_not_available(key, -1, reason) for key in keys]
        results = []
        for key in keys:
            try:
                group_id, topic_id, partition = parse_coordinator_key(key)
            except ValueError as exc:
                message = f"Invalid coordinator key {key!r}: {exc}."
                results.append(
                    CoordinatorResult(key, -1, -1, "", -1, errors.INVALID_REQUEST, message)
                )
                continue
            state_partition = partition_for(group_id, topic_id, partition, self.num_partitions)
            results.append(
                _leader_result(key, state_partition, leaders.get(state_partition), kafka)
            )
        return results

    def _live_leaders(self) -> dict[int, leases.Leader]:
        with self._store.connection("finding the leaders") as conn:
            return leases.live_leaders(conn, self._store.tables)

    async def view(self) -> ClusterView:
        """The leaders and nodes tables now (the admin endpoint)."""
        return await asyncio.to_thread(self._read_view)

    def _read_view(self) -> ClusterView:
        with self._store.connection("reading the leases") as conn:
            tables = self._store.tables
            return ClusterView(leases.list_leases(conn, tables), leases.list_nodes(conn, tables))

    # --- lifecycle --------------------------------------------------------------------

    def advertise(self, http_listener: str, kafka_listener: str | None) -> None:
        """Where this node's heartbeat says it listens."""
        self.http_listener = http_listener
        self.kafka_listener = kafka_listener

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._rounds(), name="leases"),
            loop.create_task(self._deadlines(), name="lease-deadlines"),
        ]

    async def stop(self) -> None:
        """Stop renewing and claiming (the leases stay until ``release_all``)."""
        for task in [*self._tasks, *self._dropping.values()]:
            task.cancel()
        for task in [*self._tasks, *self._dropping.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def release_all(self) -> None:
        """A clean stop (blocking; after the final commit): end every lease this node
        holds now, so that the others claim them without waiting for them to expire."""
        held, self._held = sorted(self._held), {}
        if not held:
            return
        try:
            with self._store.connection("releasing the leases") as conn:
                leases.release(conn, self._store.tables, self.node_id, held)
        except (StoreUnavailableError, OSError) as exc:
            _log.warning("leases not released (they expire on their own): %s", exc)
            return
        _log.info("released state partitions %s", format_partitions(held))

    def lost(self, partition: int, cause: BaseException) -> None:
        """A commit found the partition's epoch moved: drop it now."""
        if partition in self._held:
            _log.warning("state partition %d: %s; dropped", partition, cause)
            self._drop(partition)

    # --- rounds -----------------------------------------------------------------------

    async def _rounds(self) -> None:
        period_s = self.lease_ms / 3000
        while True:
            pause = period_s
            try:
                pause = min(pause, await self._round())
            except (StoreUnavailableError, OSError) as exc:
                now = self._monotonic()
                if now - self._last_warning >= WARN_EVERY_S:
                    self._last_warning = now
                    _log.warning("lease round failed: %s; serving until the leases run out", exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("lease round failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(pause, 0.0))

    async def _round(self) -> float:
        """One round (the module docstring); returns how soon the next should be."""
        sent = self._monotonic()
        held_epochs = {p: held.epoch for p, held in self._held.items()}
        renewed, view = await asyncio.to_thread(self._renew_and_read, held_epochs)
        for partition, held in list(self._held.items()):
            if renewed.get(partition) == held.epoch:
                held.serve_until = max(held.serve_until, sent + self._safe_s)
            else:
                _log.warning(
                    "state partition %d: lease not renewed (epoch %d is no longer this "
                    "node's); dropped",
                    partition,
                    held.epoch,
                )
                self._drop(partition)
        self._view = view
        soon = await self._balance(view)
        self.registered = True
        return min(self._next_round_in(view), SOON_S if soon else math.inf)

    def _renew_and_read(self, held: dict[int, int]) -> tuple[dict[int, int], ClusterView]:
        """Renew, and release at once what the renewal found under this node's id that
        this process does not serve: leases of an earlier run of the node (restarted
        within its lease) or of a partition it dropped when its own deadline passed
        while PostgreSQL still counted the lease live. Renewed and kept, they would stay
        this node's for good, served by nobody; released, the next claim (this node's
        or another's) takes them with a new epoch."""
        store, tables = self._store, self._store.tables
        with store.connection("renewing the leases") as conn:
            leases.heartbeat(
                conn, tables, self.node_id, self.http_listener, self.kafka_listener, self.lease_ms
            )
            renewed = leases.renew(conn, tables, self.node_id, self.lease_ms)
            stray = sorted(p for p, epoch in renewed.items() if held.get(p) != epoch)
            if stray:
                leases.release(conn, tables, self.node_id, stray)
                _log.info(
                    "released state partitions %s: leased to this node id, not served here",
                    format_partitions(stray),
                )
            view = ClusterView(leases.list_leases(conn, tables), leases.list_nodes(conn, tables))
        return {p: e for p, e in renewed.items() if p not in stray}, view

    async def _balance(self, view: ClusterView) -> bool:
        """Hand back or claim as planned; whether the next round should come soon."""
        plan = plan_round(
            self.node_id,
            self.num_partitions,
            self.lease_ms,
            view,
            held=set(self._held),
            preferred=self.preferred,
            expired_rounds=self._expired_rounds,
        )
        self.without_leader = plan.without_leader
        if plan.hand_back:
            await self._hand_back(plan.hand_back)
            return False
        self._expired_rounds = plan.expired_rounds
        claimed = 0
        for lease in plan.claims:
            claimed += await self._claim(lease)
        self.without_leader -= claimed
        return plan.soon

    async def _claim(self, lease: Lease) -> bool:
        """Whether this node got it."""
        partition = lease.state_partition
        sent = self._monotonic()
        epoch = await asyncio.to_thread(self._store.claim, partition, self.lease_ms)
        if epoch is None:
            return False  # another node was quicker
        self._expired_rounds.pop(partition, None)
        self._held[partition] = _Held(epoch, sent + self._safe_s)
        taken_over = lease.node_id is not None and lease.node_id != self.node_id
        if taken_over:
            self.takeovers += 1
        _log.info(
            "state partition %d: claimed with epoch %d%s",
            partition,
            epoch,
            f" (taken over from node {lease.node_id})" if taken_over else "",
        )
        self._host.adopt(partition)
        return True

    async def _hand_back(self, partitions: list[int]) -> None:
        """Partitions another node should lead (their preferred node is live again, or
        this node holds more than its share while another has less): a clean hand-over.
        This node stops serving them at once (``may_serve`` is false from here on), its
        runtimes close, and only then are the leases released: the other node claims
        them with a higher epoch, so nothing this node might still try to commit can
        land after the claim."""
        for partition in partitions:
            self._drop(partition)
        await asyncio.gather(*(self._dropping[p] for p in partitions if p in self._dropping))
        released = await asyncio.to_thread(self._release, partitions)
        _log.info("handed back state partitions %s", format_partitions(released))

    def _release(self, partitions: list[int]) -> list[int]:
        with self._store.connection("handing partitions back") as conn:
            return leases.release(conn, self._store.tables, self.node_id, partitions)

    def _next_round_in(self, view: ClusterView) -> float:
        """Seconds until another node's lease expires (a round then claims it)."""
        others = [
            lease.remaining_ms
            for lease in view.leases
            if lease.live and lease.node_id != self.node_id and lease.remaining_ms is not None
        ]
        return math.inf if not others else min(others) / 1000 + AFTER_EXPIRY_S

    # --- dropping ---------------------------------------------------------------------

    def _drop(self, partition: int) -> None:
        """Stop serving at once (``may_serve`` is false from now on); the runtime and
        the store's side of the partition go in a task."""
        if self._held.pop(partition, None) is None:
            return
        self._store.unlead(partition)
        task = asyncio.get_running_loop().create_task(
            self._dropped(partition), name=f"drop-partition-{partition}"
        )
        self._dropping[partition] = task

    async def _dropped(self, partition: int) -> None:
        try:
            await self._host.drop(partition)
            cause = NotLeaderError(partition, None, "not renewed, or claimed by another node")
            await asyncio.to_thread(self._store.partition(partition).abandon, cause)
        finally:
            self._dropping.pop(partition, None)

    async def _deadlines(self) -> None:
        """Drop each partition whose lease could expire before a renewal is heard of."""
        while True:
            now = self._monotonic()
            for partition, held in list(self._held.items()):
                if held.serve_until <= now:
                    _log.warning(
                        "state partition %d: its lease was not renewed in time; dropped",
                        partition,
                    )
                    self._drop(partition)
            nearest = min((h.serve_until for h in self._held.values()), default=now + 1.0)
            await asyncio.sleep(max(0.01, min(nearest - now, 1.0)))


@dataclass(frozen=True)
class Plan:
    """What one round of one node does (module docstring, steps 3 and 4): hand
    partitions back (and nothing else), or claim these expired leases, in this order."""

    hand_back: list[int]
    claims: list[Lease]
    # Rounds in a row each partition has been seen expired and unclaimed, counting this one.
    expired_rounds: dict[int, int]
    without_leader: int  # partitions without a live lease, before the claims
    # Expired partitions left for nodes short of their share: look again soon (they
    # claim in their own round, which the same expiry started), not a period later.
    soon: bool = False


def plan_round(
    node_id: int,
    num_partitions: int,
    lease_ms: int,
    view: ClusterView,
    *,
    held: Set[int],
    preferred: Mapping[int, int],
    expired_rounds: Mapping[int, int],
) -> Plan:
    """One node's decision from one round's view of the leaders and nodes tables; no
    I/O, so that the sharing out can be checked over whole simulated clusters
    (tests/server/test_lease_sharing.py)."""
    live_nodes = {n.node_id for n in view.nodes if n.live(lease_ms)}
    live_nodes.add(node_id)
    # Partitions whose preferred node is live are its own, out of the sharing.
    pinned = {p: n for p, n in preferred.items() if n in live_nodes}
    held_by: dict[int, int] = {}
    expired: list[Lease] = []
    for lease in view.leases:
        if lease.live and lease.node_id is not None:
            if lease.state_partition not in pinned:
                held_by[lease.node_id] = held_by.get(lease.node_id, 0) + 1
        elif lease.state_partition not in held:
            expired.append(lease)
    elsewhere = sorted(p for p in held if pinned.get(p, node_id) != node_id)
    if elsewhere:
        return Plan(elsewhere, [], dict(expired_rounds), len(expired))
    shared = num_partitions - len(pinned)
    share = math.ceil(shared / len(live_nodes))
    floor = shared // len(live_nodes)
    mine = sorted(p for p in held if p not in pinned)
    short = any(held_by.get(n, 0) < floor for n in live_nodes - {node_id})
    if short and len(mine) > floor:
        return Plan(mine[floor:], [], dict(expired_rounds), len(expired))
    if len(mine) > share:
        return Plan(mine[share:], [], dict(expired_rounds), len(expired))
    # Nodes start their search at different partitions: fewer claims collide.
    expired.sort(key=lambda lease: (lease.state_partition - 7 * node_id) % num_partitions)
    first = [e for e in expired if pinned.get(e.state_partition) == node_id]
    unpinned = [e for e in expired if e.state_partition not in pinned]
    # Up to the floor of the share while another node is short of it (it claims the
    # rest first), up to the ceiling otherwise.
    wanted = unpinned[: max(0, (floor if short else share) - len(mine))]
    # Beyond: what stayed expired two rounds already (nobody else took it, not even the
    # node that should have).
    taken = {e.state_partition for e in [*first, *wanted]}
    extra = [
        lease
        for lease in expired
        if lease.state_partition not in taken and expired_rounds.get(lease.state_partition, 0) >= 2
    ]
    counted = {
        lease.state_partition: expired_rounds.get(lease.state_partition, 0) + 1 for lease in expired
    }
    left = len(unpinned) > len(wanted) and len(mine) + len(wanted) < share
    return Plan([], [*first, *wanted, *extra], counted, len(expired), soon=left)


def _leader_result(
    key: str, state_partition: int, leader: leases.Leader | None, kafka: bool
) -> CoordinatorResult:
    if leader is None:
        return _not_available(
            key, state_partition, f"state partition {state_partition} has no live leader yet"
        )
    listener = leader.kafka_listener if kafka else leader.http_listener
    if listener is None:
        what = "Kafka listener" if kafka else "HTTP listener"
        return _not_available(key, state_partition, f"node {leader.node_id} advertises no {what}")
    host, _, port = listener.rpartition(":")
    return CoordinatorResult(
        key, state_partition, leader.node_id, host.strip("[]"), int(port), 0, None
    )


def _not_available(key: str, state_partition: int, reason: str) -> CoordinatorResult:
    return CoordinatorResult(
        key, state_partition, -1, "", -1, errors.COORDINATOR_NOT_AVAILABLE, reason
    )
