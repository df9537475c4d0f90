"""``sharecoord cluster status``: every state partition's leader and every node of a
cluster on PostgreSQL, read from its tables directly (no daemon needed), as a table a
person reads or, with ``--json``, ``GET /v1/admin/cluster``'s answer
(``server.cluster_status``).

Exit codes: 0 every state partition has a live leader; 3 some have none (they are
listed first and counted); 1 the store cannot be read; 2 usage."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from persistence.store_uri import is_postgres_uri, masked
from protocol.messages import ClusterStatus
from server.commands import preflight
from server.commands.common import EXIT_FAILURE, EXIT_OK, add_command, needs_a_command, refuse, say
from server.config import CLUSTER_STATUS_SETTINGS, ConfigError, load_settings

# Some state partition has no live leader: distinct from 1 (the store could not be read).
EXIT_UNLED = 3


def add_commands(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="see a cluster on PostgreSQL")
    commands = cluster.add_subparsers(title="cluster commands", metavar="COMMAND")
    add_command(
        commands,
        "status",
        run_status,
        CLUSTER_STATUS_SETTINGS,
        help="every state partition's leader and every node's heartbeat; exit 3 if some "
        "partition has no live leader",
        description="Read the cluster's leaders and nodes tables from its PostgreSQL store "
        "(no daemon needed): partitions without a live leader first, then each node with "
        "the age of its last heartbeat.",
    )
    cluster.set_defaults(command=needs_a_command(cluster, ["status"]), prog=cluster.prog)


def run_status(args: argparse.Namespace) -> int:
    from msgspec import json

    from persistence.errors import LogError
    from server.cluster_status import render

    values = load_settings(CLUSTER_STATUS_SETTINGS, args)
    uri, schema = values["state_store"], values["state_store_schema"]
    if not is_postgres_uri(uri):
        raise ConfigError(
            f"--state-store {masked(uri)} is not a PostgreSQL URI: give the "
            "postgresql://USER@HOST:PORT/DATABASE the cluster's nodes were given"
        )
    refuse(preflight.postgres_driver_problem())
    try:
        status = read_cluster_status(
            uri, schema, lease_ms=values["lease_ms"], timeout_ms=values["state_store_timeout_ms"]
        )
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    except ClusterUnreadable as exc:
        say(args.prog, str(exc))
        return EXIT_FAILURE
    if values["json"]:
        sys.stdout.write(json.encode(status).decode() + "\n")
    else:
        print(render(status, f"cluster on {masked(uri)}, schema {schema}"))
    return EXIT_UNLED if status.partitions_without_leader else EXIT_OK


class ClusterUnreadable(Exception):
    """The store could not be read (unreachable, or no cluster in that schema): one
    line, the password masked."""


def read_cluster_status(uri: str, schema: str, *, lease_ms: int, timeout_ms: int) -> ClusterStatus:
    """The leaders and nodes tables read directly (blocking; no daemon needed). Raises
    ``ClusterUnreadable``; ``LogError`` for a URI libpq cannot parse."""
    import psycopg

    from persistence.errors import StoreUnavailableError
    from persistence.postgres import Tables, list_leases, list_nodes
    from persistence.postgres.connection import check_uri, connect, unavailable
    from server.cluster_status import cluster_status

    check_uri(uri)
    tables = Tables(schema)
    try:
        with connect(uri, timeout_ms=timeout_ms) as conn:
            found = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                (f"{schema}.sharecoord_leaders", f"{schema}.sharecoord_nodes"),
            ).fetchone()
            if not (found and found[0]):
                raise ClusterUnreadable(
                    f"PostgreSQL store {masked(uri)}: schema {schema} holds no sharecoord "
                    "tables: no node has started on it (or give its --state-store-schema)"
                )
            leases, nodes = list_leases(conn, tables), list_nodes(conn, tables)
    except StoreUnavailableError as exc:
        raise ClusterUnreadable(str(exc)) from None
    except psycopg.Error as exc:
        raise ClusterUnreadable(str(unavailable(exc, uri, "reading the leases"))) from None
    return cluster_status(leases, nodes, lease_ms)
