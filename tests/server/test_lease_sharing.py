"""How the nodes of a cluster share the state partitions out (server/leadership.py
``plan_round``), checked over whole simulated clusters: nodes join, die and come back,
with and without a cluster file that prefers a node for some partitions.

The leaders table is modelled as PostgreSQL keeps it (a claim succeeds only on an
expired lease and raises the epoch; a renewal extends every live lease of the node id; a
release ends a lease), on a simulated clock; each round every live node renews, releases
what it renewed but does not serve (an earlier run's leases), reads the table and acts
on its plan, in a random order. The round's I/O itself is checked on PostgreSQL in
test_leadership.py. What must hold once the membership
has been still for a while:

* every partition is led, by a live node, and by one node only as the nodes see it;
* a partition whose preferred node is live is led by that node;
* the other partitions are shared out evenly: every live node leads between the floor
  and the ceiling of its share of them;
* nothing moves any more (no claim, no hand-back: the sharing does not flap).
"""

from __future__ import annotations

import datetime
import math
import random
from dataclasses import dataclass, field

import pytest

from persistence.postgres.leases import Lease, NodeRow
from server.leadership import ClusterView, plan_round

LEASE_MS = 3000
TICK_MS = LEASE_MS // 3  # a round every third of the lease, as the daemon runs them
SETTLE_TICKS = 12  # rounds the membership stays still before the checks
STILL_TICKS = 4  # of those, the last ones in which nothing may move
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@dataclass
class Row:
    node: int | None = None
    epoch: int = 0
    expiry: int | None = None  # simulated milliseconds


@dataclass
class Node:
    node_id: int
    held: dict[int, int] = field(default_factory=dict)  # partition -> epoch
    expired_rounds: dict[int, int] = field(default_factory=dict)


class Cluster:
    def __init__(self, num_partitions: int, preferred: dict[int, int], rng: random.Random):
        self.num_partitions = num_partitions
        self.preferred = preferred
        self.rng = rng
        self.now = 0
        self.rows = {p: Row() for p in range(num_partitions)}
        self.heartbeats: dict[int, int] = {}
        self.nodes: dict[int, Node] = {}  # the live ones
        self.moves = 0  # claims and hand-backs so far

    def start(self, node_id: int) -> None:
        self.nodes[node_id] = Node(node_id)

    def kill(self, node_id: int) -> None:
        del self.nodes[node_id]  # its leases and heartbeat just age

    def live(self, row: Row) -> bool:
        return row.expiry is not None and row.expiry > self.now

    def view(self) -> ClusterView:
        leases = [
            Lease(
                p,
                row.node,
                row.epoch,
                None,
                self.live(row),
                None if row.expiry is None else float(row.expiry - self.now),
            )
            for p, row in sorted(self.rows.items())
        ]
        nodes = [
            NodeRow(n, None, None, _EPOCH, float(self.now - beat))
            for n, beat in sorted(self.heartbeats.items())
        ]
        return ClusterView(leases, nodes)

    def tick(self) -> None:
        order = list(self.nodes.values())
        self.rng.shuffle(order)
        for node in order:
            self.round(node)
        self.now += TICK_MS

    def round(self, node: Node) -> None:
        self.heartbeats[node.node_id] = self.now
        renewed = {}
        for p, row in self.rows.items():
            if row.node == node.node_id and self.live(row):
                row.expiry = self.now + LEASE_MS
                renewed[p] = row.epoch
        node.held = {p: e for p, e in node.held.items() if renewed.get(p) == e}
        for p in renewed.keys() - node.held.keys():  # an earlier run's: released
            self.rows[p].expiry = None
        plan = plan_round(
            node.node_id,
            self.num_partitions,
            LEASE_MS,
            self.view(),
            held=set(node.held),
            preferred=self.preferred,
            expired_rounds=node.expired_rounds,
        )
        if plan.hand_back:
            for p in plan.hand_back:
                del node.held[p]
                if self.rows[p].node == node.node_id:
                    self.rows[p].expiry = None
            self.moves += len(plan.hand_back)
            return
        node.expired_rounds = plan.expired_rounds
        for lease in plan.claims:
            row = self.rows[lease.state_partition]
            if self.live(row):
                continue  # another node was quicker
            row.node, row.epoch, row.expiry = node.node_id, row.epoch + 1, self.now + LEASE_MS
            node.held[lease.state_partition] = row.epoch
            node.expired_rounds.pop(lease.state_partition, None)
            self.moves += 1

    def settle(self) -> None:
        for _ in range(SETTLE_TICKS - STILL_TICKS):
            self.tick()
        moves = self.moves
        for _ in range(STILL_TICKS):
            self.tick()
        assert self.moves == moves, "the sharing still moves partitions after settling"

    def check(self) -> None:
        live = set(self.nodes)
        leader_of: dict[int, int] = {}
        for node in self.nodes.values():
            for p in node.held:
                assert p not in leader_of, f"partition {p} led by {leader_of[p]} and {node.node_id}"
                leader_of[p] = node.node_id
        for p, row in self.rows.items():
            assert self.live(row) and row.node in live, f"partition {p}: no live leader ({row})"
            assert leader_of.get(p) == row.node, f"partition {p}: table and nodes disagree"
        pinned = {p: n for p, n in self.preferred.items() if n in live}
        for p, n in pinned.items():
            assert leader_of[p] == n, f"partition {p} prefers live node {n}, led by {leader_of[p]}"
        shared = self.num_partitions - len(pinned)
        counts = {n: 0 for n in live}
        for p, n in leader_of.items():
            if p not in pinned:
                counts[n] += 1
        floor, ceiling = shared // len(live), math.ceil(shared / len(live))
        assert all(floor <= c <= ceiling for c in counts.values()), (
            f"{shared} partitions over {len(live)} nodes: {counts}"
        )


@pytest.mark.parametrize("seed", range(40))
def test_nodes_joining_and_dying_share_the_partitions_out_evenly(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Cluster(rng.choice([1, 7, 16, 50]), {}, rng)
    ids = list(range(1, 6))
    for node_id in rng.sample(ids, rng.randint(1, 3)):
        cluster.start(node_id)
    for _ in range(6):
        cluster.settle()
        cluster.check()
        stopped = [n for n in ids if n not in cluster.nodes]
        if rng.random() < 0.2:  # SIGKILL and restart at once: its leases still live
            restarted = rng.choice(sorted(cluster.nodes))
            cluster.kill(restarted)
            cluster.start(restarted)
        elif len(cluster.nodes) > 1 and (not stopped or rng.random() < 0.5):
            cluster.kill(rng.choice(sorted(cluster.nodes)))
        else:
            cluster.start(rng.choice(stopped))


@pytest.mark.parametrize("seed", range(40))
def test_preferred_partitions_go_home_and_leave_while_their_node_is_away(seed: int) -> None:
    rng = random.Random(1000 + seed)
    num_partitions = rng.choice([4, 16, 50])
    ids = [1, 2, 3]
    preferred = {p: rng.choice(ids) for p in rng.sample(range(num_partitions), num_partitions // 2)}
    cluster = Cluster(num_partitions, preferred, rng)
    for node_id in ids:
        cluster.start(node_id)
    for _ in range(6):
        cluster.settle()
        cluster.check()
        stopped = [n for n in ids if n not in cluster.nodes]
        if len(cluster.nodes) > 1 and (not stopped or rng.random() < 0.5):
            cluster.kill(rng.choice(sorted(cluster.nodes)))
        else:
            cluster.start(rng.choice(stopped))


def test_a_node_alone_leads_everything_even_what_prefers_a_dead_node() -> None:
    cluster = Cluster(8, {0: 2, 1: 2}, random.Random(0))
    cluster.start(1)
    cluster.settle()
    cluster.check()
    assert sorted(cluster.nodes[1].held) == list(range(8))
    cluster.start(2)  # the preferred node comes: its partitions go home, nothing else
    cluster.settle()
    cluster.check()
    assert sorted(cluster.nodes[2].held)[:2] == [0, 1]
