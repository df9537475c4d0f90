"""What the cluster looks like (docs/api.md#admin-endpoints, ``GET /v1/admin/cluster``,
and ``sharecoord cluster status``): the leaders and nodes tables as one answer, the
partitions without a live leader first, and the table a person reads of it.

Both the endpoint (from the node's leadership) and the command (from the tables
directly, no daemon needed) build the same ``ClusterStatus`` here, from the rows
``persistence.postgres.leases`` reads. A node is live while its last heartbeat is
younger than its own lease (as its heartbeat says; the reader's for a node of an older
release), the rule by which the nodes share out the partitions (server/leadership.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING

from protocol.messages import ClusterNode, ClusterStatus, PartitionLeader

if TYPE_CHECKING:
    from persistence.postgres.leases import Lease, NodeRow


def cluster_status(
    leases: Sequence[Lease], nodes: Sequence[NodeRow], lease_ms: int
) -> ClusterStatus:
    """The answer, partitions without a live leader first (then by number)."""
    partitions = [
        PartitionLeader(
            lease.state_partition,
            lease.node_id,
            lease.epoch,
            _timestamp(lease.lease_expiry),
            None if lease.remaining_ms is None else round(lease.remaining_ms, 1),
            lease.live,
        )
        for lease in sorted(leases, key=lambda lease: (lease.live, lease.state_partition))
    ]
    return ClusterStatus(
        lease_ms,
        sum(not p.live for p in partitions),
        partitions,
        [
            ClusterNode(
                node.node_id,
                node.http_listener,
                node.kafka_listener,
                _timestamp(node.last_heartbeat) or "",
                round(node.heartbeat_age_ms, 1),
                node.live(lease_ms),
            )
            for node in nodes
        ],
    )


def _timestamp(moment: datetime.datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds")


def render(status: ClusterStatus, where: str) -> str:
    """The table a person reads at 3 a.m.: a headline with the count of partitions
    without a live leader, those partitions first, then every node with the age of its
    last heartbeat."""
    total = len(status.partitions)
    unled = status.partitions_without_leader
    dead = [n for n in status.nodes if not n.live]
    lines = [
        f"{where}: {total} state partitions, "
        + (f"{unled} WITHOUT A LIVE LEADER" if unled else "every one led")
        + f"; {len(status.nodes) - len(dead)} of {len(status.nodes)} nodes live"
        + f" (lease {status.lease_ms} ms)",
        "",
        _table(
            ("PARTITION", "LEADER", "EPOCH", "LEASE"),
            [
                (
                    str(p.state_partition),
                    _leader(p),
                    str(p.epoch),
                    _lease(p),
                )
                for p in status.partitions
            ],
        ),
        "",
        _table(
            ("NODE", "HTTP", "KAFKA", "LAST HEARTBEAT", "STATE", "LEADS"),
            [
                (
                    str(n.node_id),
                    n.http_listener or "-",
                    n.kafka_listener or "-",
                    f"{_age(n.heartbeat_age_ms)} ago",
                    "live" if n.live else "DEAD",
                    str(sum(p.live and p.node_id == n.node_id for p in status.partitions)),
                )
                for n in status.nodes
            ]
            or [("-", "no node has registered", "", "", "", "")],
        ),
    ]
    return "\n".join(lines)


def _leader(partition: PartitionLeader) -> str:
    if partition.node_id is None:
        return "-"
    return f"node {partition.node_id}" if partition.live else f"(was node {partition.node_id})"


def _lease(partition: PartitionLeader) -> str:
    left = partition.lease_remaining_ms
    if partition.live and left is not None:
        return f"live, {_age(left)} left"
    if partition.node_id is None:
        return "NO LEADER (never led)"
    if left is None:
        return "NO LEADER (released)"
    return f"NO LEADER (expired {_age(-left)} ago)"


def _age(ms: float) -> str:
    seconds = max(ms, 0.0) / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (header, *rows)
    )
