"""The lease statements of the PostgreSQL store: one statement each, PostgreSQL's clock
(``clock_timestamp()``) alone deciding what has expired.

* ``claim``: take a state partition whose lease has expired (or that never had one),
  with the epoch raised by one, in the same statement: two nodes claiming at once
  cannot both get it, and the new epoch fences every commit of the old leader (the
  commit locks the partition's row and compares epochs, persistence/postgres/store.py).
* ``renew``: extend every live lease a node holds, at once; a lease that expired is
  not renewed (it must be claimed again, with a new epoch).
* ``release``: end a node's leases now (a clean hand-over: the old leader stops first,
  then the new one claims).
* ``heartbeat``: the node's row, with where it listens.
* ``list_leases``: every partition's leader, epoch and lease expiry, as PostgreSQL sees
  them, with how long each live lease has left;
* ``list_nodes``: every node's row, with how long ago it last heartbeated;
* ``live_leaders``: each partition with a live lease, and where its leader listens.

A node that could not renew must stop serving before its lease can have expired, by its
own monotonic clock measured from when it sent the renewal (the second stage's node
does that); safety never rests on it, only on the epoch every commit checks.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import psycopg

from persistence.postgres.schema import Tables


@dataclass(frozen=True)
class Lease:
    state_partition: int
    node_id: int | None
    epoch: int
    lease_expiry: datetime.datetime | None
    live: bool  # the lease has not expired, by PostgreSQL's clock
    # Milliseconds the lease has left by PostgreSQL's clock (negative once expired);
    # None without one.
    remaining_ms: float | None = None


@dataclass(frozen=True)
class NodeRow:
    node_id: int
    http_listener: str | None
    kafka_listener: str | None
    last_heartbeat: datetime.datetime
    heartbeat_age_ms: float  # by PostgreSQL's clock
    lease_ms: int | None = None  # the node's own; None from a node of an older release

    def live(self, default_lease_ms: int) -> bool:
        """Whether its last heartbeat is younger than its own lease (the reader's,
        `default_lease_ms`, for a node that did not say)."""
        return self.heartbeat_age_ms < (self.lease_ms or default_lease_ms)


@dataclass(frozen=True)
class Leader:
    """A partition's leader while its lease is live, and where it listens."""

    state_partition: int
    node_id: int
    http_listener: str | None
    kafka_listener: str | None


def claim(
    conn: psycopg.Connection[Any], tables: Tables, partition: int, node_id: int, lease_ms: int
) -> int | None:
    """Take `partition` for `node_id` if its lease expired (or it has none): its new
    epoch, or None when another lease is live."""
    row = conn.execute(
        tables.sql(
            """UPDATE {leaders}
               SET node_id = %(node)s, epoch = epoch + 1,
                   lease_expiry = clock_timestamp() + %(ms)s * interval '1 millisecond'
               WHERE state_partition = %(p)s
                 AND (lease_expiry IS NULL OR lease_expiry <= clock_timestamp())
               RETURNING epoch"""
        ),
        {"node": node_id, "ms": lease_ms, "p": partition},
    ).fetchone()
    return None if row is None else int(row[0])


def renew(
    conn: psycopg.Connection[Any], tables: Tables, node_id: int, lease_ms: int
) -> dict[int, int]:
    """Extend every live lease of `node_id` by `lease_ms` from now: {partition: epoch}
    of those renewed. A partition missing from the answer is no longer this node's."""
    rows = conn.execute(
        tables.sql(
            """UPDATE {leaders}
               SET lease_expiry = clock_timestamp() + %(ms)s * interval '1 millisecond'
               WHERE node_id = %(node)s AND lease_expiry > clock_timestamp()
               RETURNING state_partition, epoch"""
        ),
        {"node": node_id, "ms": lease_ms},
    ).fetchall()
    return {int(p): int(epoch) for p, epoch in rows}


def release(
    conn: psycopg.Connection[Any], tables: Tables, node_id: int, partitions: Collection[int]
) -> list[int]:
    """End `node_id`'s leases of `partitions` now; the partitions released. The epoch
    stays: the next claim raises it."""
    rows = conn.execute(
        tables.sql(
            """UPDATE {leaders} SET lease_expiry = NULL
               WHERE node_id = %(node)s AND state_partition = ANY(%(ps)s)
               RETURNING state_partition"""
        ),
        {"node": node_id, "ps": list(partitions)},
    ).fetchall()
    return sorted(int(p) for (p,) in rows)


def heartbeat(
    conn: psycopg.Connection[Any],
    tables: Tables,
    node_id: int,
    http_listener: str | None,
    kafka_listener: str | None,
    lease_ms: int,
) -> None:
    conn.execute(
        tables.sql(
            """INSERT INTO {nodes}
                   (node_id, http_listener, kafka_listener, last_heartbeat, lease_ms)
               VALUES (%s, %s, %s, clock_timestamp(), %s)
               ON CONFLICT (node_id) DO UPDATE SET
                   http_listener = excluded.http_listener,
                   kafka_listener = excluded.kafka_listener,
                   last_heartbeat = excluded.last_heartbeat,
                   lease_ms = excluded.lease_ms"""
        ),
        (node_id, http_listener, kafka_listener, lease_ms),
    )


def list_leases(conn: psycopg.Connection[Any], tables: Tables) -> list[Lease]:
    rows = conn.execute(
        tables.sql(
            """SELECT state_partition, node_id, epoch, lease_expiry,
                      coalesce(lease_expiry > clock_timestamp(), false),
                      extract(epoch FROM lease_expiry - clock_timestamp()) * 1000
               FROM {leaders} ORDER BY state_partition"""
        )
    ).fetchall()
    return [
        Lease(int(p), node, int(epoch), expiry, bool(live), None if left is None else float(left))
        for p, node, epoch, expiry, live, left in rows
    ]


def list_nodes(conn: psycopg.Connection[Any], tables: Tables) -> list[NodeRow]:
    rows = conn.execute(
        tables.sql(
            """SELECT node_id, http_listener, kafka_listener, last_heartbeat,
                      extract(epoch FROM clock_timestamp() - last_heartbeat) * 1000, lease_ms
               FROM {nodes} ORDER BY node_id"""
        )
    ).fetchall()
    return [
        NodeRow(int(node), http, kafka, beat, float(age), lease)
        for node, http, kafka, beat, age, lease in rows
    ]


def live_leaders(conn: psycopg.Connection[Any], tables: Tables) -> dict[int, Leader]:
    """{partition: its leader} for every partition whose lease is live now."""
    rows = conn.execute(
        tables.sql(
            """SELECT l.state_partition, l.node_id, n.http_listener, n.kafka_listener
               FROM {leaders} l LEFT JOIN {nodes} n ON n.node_id = l.node_id
               WHERE l.lease_expiry > clock_timestamp()"""
        )
    ).fetchall()
    return {int(p): Leader(int(p), int(node), http, kafka) for p, node, http, kafka in rows}
