"""The static cluster map: which node owns which state partitions
(docs/design.md#growing-past-one-machine; docs/api.md#the-cluster-file and
docs/api.md#find-coordinator).

State partitions are the unit of ownership. A cluster file names every node and the
state partitions it owns; each state partition has exactly one owner::

    num_partitions = 50
    [[node]]
    id = 0
    host = "10.0.0.1"
    port = 9095
    partitions = ["0-24"]        # ints or "a-b" ranges
    [[node]]
    id = 1
    host = "10.0.0.2"
    port = 9095
    partitions = ["25-49"]

A node may also name ``kafka_port``, the port of its Kafka listener (``--kafka-listener``)
on the same host: the Kafka listener's FindCoordinator answers with it. A node without
one is answered 15 (COORDINATOR_NOT_AVAILABLE) to a Kafka client that asks for it.

With no cluster file the node is alone and owns everything (``ClusterMap.single``).
No I/O here but ``load_cluster`` reading the file.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from persistence.ownership import Assignment
from protocol import errors
from protocol.messages import CoordinatorResult
from protocol.routing import parse_coordinator_key, partition_for

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")
_INT32_MAX = 2**31 - 1
# The most state partitions a data directory or a cluster may have (``--partitions``
# documents why). Checked before anything is sized by the count: a map of owners, a
# runtime per partition.
MAX_PARTITIONS = 10_000
_FILE_KEYS = frozenset({"num_partitions", "node"})
_NODE_KEYS = frozenset({"id", "host", "port", "partitions"})
_OPTIONAL_NODE_KEYS = frozenset({"kafka_port"})


class ClusterError(ValueError):
    """A cluster file or cluster map that cannot be used; the message says why."""


@dataclass(frozen=True)
class Node:
    """One daemon: its id, the address clients reach it at, and its state partitions."""

    id: int
    host: str
    port: int
    partitions: frozenset[int]
    kafka_port: int | None = None  # its Kafka listener's port, on the same host


@dataclass(frozen=True)
class ClusterMap:
    """Nodes and their state partitions; every partition ``0..num_partitions-1`` has
    exactly one owner (checked on construction)."""

    num_partitions: int
    nodes: tuple[Node, ...]
    _owners: tuple[Node, ...] = field(init=False, repr=False, compare=False)
    _by_id: dict[int, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_map(self.num_partitions, self.nodes)
        owners: list[Node | None] = [None] * self.num_partitions
        for node in self.nodes:
            for partition in node.partitions:
                owners[partition] = node
        object.__setattr__(self, "_owners", tuple(n for n in owners if n is not None))
        object.__setattr__(self, "_by_id", {node.id: node for node in self.nodes})

    @classmethod
    def single(
        cls,
        node_id: int,
        host: str,
        port: int,
        num_partitions: int,
        kafka_port: int | None = None,
    ) -> ClusterMap:
        """The map with no cluster file: one node, at the listen address, owning all."""
        node = Node(node_id, host, port, frozenset(range(num_partitions)), kafka_port)
        return cls(num_partitions, (node,))

    def owner(self, state_partition: int) -> Node:
        """The node that owns ``state_partition``."""
        if not 0 <= state_partition < self.num_partitions:
            raise ValueError(
                f"state partition {state_partition} is outside 0..{self.num_partitions - 1}"
            )
        return self._owners[state_partition]

    def node(self, node_id: int) -> Node:
        """The node with id ``node_id``; ``KeyError`` naming the known ids if none."""
        try:
            return self._by_id[node_id]
        except KeyError:
            known = ", ".join(str(i) for i in sorted(self._by_id))
            raise KeyError(f"no node with id {node_id} in the cluster (ids: {known})") from None

    def owned_by(self, node_id: int) -> frozenset[int]:
        """The state partitions node ``node_id`` owns."""
        return self.node(node_id).partitions

    def fingerprint(self) -> str:
        """Names this map's assignment of partitions to nodes (not the addresses: a node
        that moves to another host keeps its partitions): what a data directory records
        of the map it ran with (persistence/ownership.py)."""
        owners = [node.id for node in self._owners]
        text = json.dumps({"num_partitions": self.num_partitions, "owners": owners})
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def assignment(self, node_id: int) -> Assignment:
        """What node ``node_id`` opens its data directory with."""
        self.node(node_id)  # KeyError for a node not in the map
        owners = tuple(node.id for node in self._owners)
        return Assignment(node_id, self.fingerprint(), owners)


def load_cluster(path: str) -> ClusterMap:
    """Read and check a cluster file; ``ClusterError`` names the file and the problem."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise ClusterError(f"cluster file {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ClusterError(f"cluster file {path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # tomllib decodes before it parses
        raise ClusterError(
            f"cluster file {path}: not valid TOML: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc
    try:
        return _parse_cluster(document)
    except ClusterError as exc:
        raise ClusterError(f"cluster file {path}: {exc}") from None


def check_partition_count(cluster: ClusterMap, partitions: int) -> None:
    """Refuse a cluster map whose ``num_partitions`` differs from ``--partitions``: the
    keys would hash to different state partitions on different nodes."""
    if cluster.num_partitions != partitions:
        raise ClusterError(
            f"the cluster file says num_partitions = {cluster.num_partitions} but "
            f"--partitions is {partitions}; they must be equal (give --partitions "
            f"{cluster.num_partitions}, or fix the cluster file)"
        )


def find_coordinator(cluster: ClusterMap, keys: list[str]) -> list[CoordinatorResult]:
    """Answer ``POST /v1/find-coordinator``: one result per key, in order. A key that
    does not parse (docs/semantics.md §1.2) gets 42 with ``-1``/``""`` for the rest."""
    results = []
    for key in keys:
        try:
            group_id, topic_id, partition = parse_coordinator_key(key)
        except ValueError as exc:
            results.append(
                CoordinatorResult(
                    key=key,
                    state_partition=-1,
                    node_id=-1,
                    host="",
                    port=-1,
                    error_code=errors.INVALID_REQUEST,
                    error_message=f"Invalid coordinator key {key!r}: {exc}.",
                )
            )
            continue
        state_partition = partition_for(group_id, topic_id, partition, cluster.num_partitions)
        owner = cluster.owner(state_partition)
        results.append(
            CoordinatorResult(key, state_partition, owner.id, owner.host, owner.port, 0, None)
        )
    return results


def format_partitions(partitions: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``"0-2, 5, 7-8"``."""
    spans: list[list[int]] = []
    for p in sorted(set(partitions)):
        if spans and spans[-1][1] == p - 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# --- checking --------------------------------------------------------------------------


def _parse_cluster(document: dict[str, Any]) -> ClusterMap:
    unknown = sorted(set(document) - _FILE_KEYS)
    if unknown:
        raise ClusterError(
            f"unknown top-level key(s) {', '.join(unknown)} (allowed: num_partitions, [[node]])"
        )
    if "num_partitions" not in document:
        raise ClusterError("num_partitions is missing")
    num_partitions = document["num_partitions"]
    if not _is_int(num_partitions) or not 1 <= num_partitions <= MAX_PARTITIONS:
        raise ClusterError(
            f"num_partitions must be an integer 1..{MAX_PARTITIONS}, got {num_partitions!r}"
        )
    tables = document.get("node")
    if not isinstance(tables, list) or not tables:
        raise ClusterError("no [[node]] tables: a cluster has at least one node")
    nodes = tuple(_parse_node(i, table, num_partitions) for i, table in enumerate(tables))
    return ClusterMap(num_partitions, nodes)


def _parse_node(index: int, table: Any, num_partitions: int) -> Node:
    where = f"[[node]] #{index + 1}"
    if not isinstance(table, dict):
        raise ClusterError(f"{where} is not a table")
    unknown = sorted(set(table) - _NODE_KEYS - _OPTIONAL_NODE_KEYS)
    missing = sorted(_NODE_KEYS - set(table))
    if unknown:
        raise ClusterError(
            f"{where}: unknown key(s) {', '.join(unknown)} "
            "(allowed: id, host, port, partitions, kafka_port)"
        )
    if missing:
        raise ClusterError(f"{where}: missing key(s) {', '.join(missing)}")
    node_id, host, port, entries = table["id"], table["host"], table["port"], table["partitions"]
    if not _is_int(node_id) or not 0 <= node_id <= _INT32_MAX:
        raise ClusterError(f"{where}: id must be an integer 0..{_INT32_MAX}, got {node_id!r}")
    where = f"node {node_id}"
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
        raise ClusterError(f"{where}: host must be a non-empty host name or address, got {host!r}")
    if not _is_int(port) or not 1 <= port <= 65535:
        raise ClusterError(f"{where}: port must be an integer 1..65535, got {port!r}")
    kafka_port = table.get("kafka_port")
    if kafka_port is not None and (not _is_int(kafka_port) or not 1 <= kafka_port <= 65535):
        raise ClusterError(f"{where}: kafka_port must be an integer 1..65535, got {kafka_port!r}")
    if kafka_port == port:
        raise ClusterError(f"{where}: kafka_port and port are both {port}; they must differ")
    if not isinstance(entries, list):
        raise ClusterError(f'{where}: partitions must be a list of ints or "a-b" ranges')
    owned: set[int] = set()
    repeated: set[int] = set()
    for entry in entries:
        span = _parse_entry(where, entry, num_partitions)
        repeated.update(owned.intersection(span))
        owned.update(span)
    if repeated:
        raise ClusterError(
            f"{where} lists partition(s) {format_partitions(repeated)} more than once"
        )
    return Node(node_id, host, port, frozenset(owned), kafka_port)


def _parse_entry(where: str, entry: Any, num_partitions: int) -> range:
    last = num_partitions - 1
    if _is_int(entry):
        if not 0 <= entry <= last:
            raise ClusterError(f"{where}: partition {entry} is outside 0..{last}")
        return range(entry, entry + 1)
    if isinstance(entry, str):
        match = _RANGE.fullmatch(entry)
        if match is None:
            raise ClusterError(
                f'{where}: partition entry {entry!r} is not a range "a-b" (write a single '
                "partition as an integer)"
            )
        first, end = int(match[1]), int(match[2])
        if first > end:
            raise ClusterError(f"{where}: range {entry!r} is reversed ({first} > {end})")
        if end > last:
            raise ClusterError(f"{where}: range {entry!r} goes past the last partition {last}")
        return range(first, end + 1)
    raise ClusterError(
        f'{where}: partition entry {entry!r} is neither an integer nor an "a-b" range'
    )


def _check_map(num_partitions: int, nodes: tuple[Node, ...]) -> None:
    if num_partitions < 1:
        raise ClusterError(f"num_partitions must be >= 1, got {num_partitions}")
    seen_ids: set[int] = set()
    addresses: dict[tuple[str, int], int] = {}
    owner_of: dict[int, int] = {}
    doubly: dict[int, list[int]] = {}
    for node in nodes:
        if node.id in seen_ids:
            raise ClusterError(f"node id {node.id} is used by more than one node")
        seen_ids.add(node.id)
        address = (node.host, node.port)
        if address in addresses:
            raise ClusterError(
                f"nodes {addresses[address]} and {node.id} have the same address "
                f"{node.host}:{node.port}"
            )
        addresses[address] = node.id
        outside = [p for p in node.partitions if not 0 <= p < num_partitions]
        if outside:
            raise ClusterError(
                f"node {node.id} owns partition(s) {format_partitions(outside)} outside "
                f"0..{num_partitions - 1}"
            )
        for partition in node.partitions:
            if partition in owner_of:
                doubly.setdefault(partition, [owner_of[partition]]).append(node.id)
            else:
                owner_of[partition] = node.id
    problems = []
    missing = set(range(num_partitions)) - owner_of.keys()
    if missing:
        problems.append(f"partition(s) {format_partitions(missing)} owned by no node")
    by_owners: dict[tuple[int, ...], list[int]] = {}
    for partition, owners in doubly.items():
        by_owners.setdefault(tuple(owners), []).append(partition)
    for owner_ids, shared in sorted(by_owners.items(), key=lambda item: min(item[1])):
        names = " and ".join(str(i) for i in owner_ids)
        problems.append(f"partition(s) {format_partitions(shared)} owned by nodes {names}")
    if problems:
        raise ClusterError(
            "every state partition must be owned by exactly one node: " + "; ".join(problems)
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
