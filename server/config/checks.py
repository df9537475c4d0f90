"""The checks of ``serve``'s settings that go together (``load_serve_config``), each a
one-line ``ConfigError``: a node's address against its cluster file, and the
PostgreSQL store's settings against the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from persistence.store_uri import is_postgres_uri, masked
from server.cluster import ClusterMap
from server.config.engine import ConfigError
from server.config.parsers import parse_listen


def check_state_store(values: dict[str, Any], where: Callable[[str], str]) -> None:
    """A state store URI names PostgreSQL (shown masked when it does not), and what
    has no meaning on it yet is not asked for with it. A cluster file is allowed with
    it: there it says which node should lead what when it is live (a preference, never
    a safety rule; server/leadership.py)."""
    uri = values["state_store"]
    if uri is None:
        return
    if not is_postgres_uri(uri):
        raise ConfigError(
            f"{where('state_store')} = {masked(uri)} is not a PostgreSQL URI: give "
            "postgresql://USER@HOST:PORT/DATABASE, or leave it unset for the data directory"
        )
    if values["topic_catalog"]:
        raise ConfigError(
            f"{where('topic_catalog')} is on, and the topic catalog is kept in the data "
            "directory only: it is not there yet on the PostgreSQL store"
        )
    if values["state_store_timeout_ms"] >= values["write_timeout_ms"]:
        raise ConfigError(
            f"{where('state_store_timeout_ms')} = {values['state_store_timeout_ms']} must be "
            f"below {where('write_timeout_ms')} = {values['write_timeout_ms']}: a statement "
            "that hangs must be given up before the answer is due"
        )


def check_node_address(
    cluster_map: ClusterMap,
    node_id: int,
    port: int,
    advertised: str | None,
    cluster_file: str,
    where: Callable[[str], str],
) -> None:
    """With a cluster file, the node's entry is where clients reach it: a listen port
    that differs sends them to nobody, unless --advertised-listener says that the
    entry's address is mapped to this one (a NAT or container port mapping)."""
    node = cluster_map.node(node_id)
    entry = f"{node.host}:{node.port}"
    if advertised is not None:
        if parse_listen(advertised) != (node.host, node.port):
            raise ConfigError(
                f"{where('advertised_listener')} = {advertised} disagrees with node {node_id}'s "
                f"entry {entry} in cluster file {cluster_file}; with a cluster file, that "
                "entry is what find-coordinator answers: give it, or leave this unset"
            )
        return
    if port != node.port:
        raise ConfigError(
            f"{where('listen')} has port {port}, but cluster file {cluster_file} says node "
            f"{node_id} is reached at {entry}: give --listen HOST:{node.port} (behind a port "
            f"mapping, add --advertised-listener {entry})"
        )
