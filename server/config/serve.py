"""The settings of ``sharecoord serve``: ``ServeConfig``'s fields are their
declarations (name and type from the field, the rest from ``setting``), and
``load_serve_config`` resolves them, checks the ones that go together and loads the
cluster map.

Names follow Kafka's where Kafka has the same setting
(``share.coordinator.snapshot.update.records.per.snapshot`` →
``snapshot_update_records_per_snapshot``). A new setting is one field here: its flag,
environment variable and file key follow from the name, and ``make docs`` writes it into
docs/operations.md#settings, the synopsis of docs/api.md#cli and, with a Kafka
counterpart, docs/semantics.md §11.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, MAX_RECORDS_PER_SNAPSHOT
from protocol.shard import DEFAULT_MAX_STATE_BATCHES
from protocol.widths import DEFAULT_MAX_GROUP_ID_BYTES
from server.cluster import (
    MAX_PARTITIONS,
    ClusterError,
    ClusterMap,
    check_partition_count,
    load_cluster,
)
from server.config.checks import check_node_address, check_state_store
from server.config.engine import (
    ConfigError,
    Kafka,
    command,
    config_file_of,
    resolve_with_sources,
    setting,
    settings_of,
)
from server.config.parsers import (
    INT32_MAX,
    WILDCARD_HOSTS,
    advertised_address,
    advertised_host,
    at_least,
    between,
    listen_address,
    minus_one_or_positive,
    non_empty,
    one_of,
    parse_bool,
    parse_float,
    parse_int,
    parse_listen,
    parse_optional_path,
    parse_optional_text,
    parse_path,
    parse_text,
    parse_word,
    positive,
    postgres_schema_name,
)

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


def _int(
    default: int,
    check: Callable[[Any], None],
    *,
    doc: str,
    meaning: str,
    kafka: Kafka | None = None,
) -> int:
    return setting(default, parse_int, check, doc=doc, meaning=meaning, kafka=kafka, metavar="N")


def _ms(default: int, *, doc: str, meaning: str, kafka: Kafka | None = None) -> int:
    return _int(default, at_least(1), doc=doc, meaning=meaning, kafka=kafka)


def _seconds(default: float, check: Callable[[Any], None], *, doc: str, meaning: str) -> float:
    return setting(default, parse_float, check, doc=doc, meaning=meaning, metavar="SECONDS")


def _file(*, doc: str, meaning: str) -> str | None:
    doc += " An empty value means not set."
    return setting(None, parse_optional_path, doc=doc, meaning=meaning, metavar="FILE")


def _switch(*, doc: str, meaning: str) -> bool:
    """A boolean, off by default: ``--name`` / ``--no-name``."""
    return setting(False, parse_bool, doc=doc, meaning=meaning)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """The resolved settings of ``sharecoord serve``, one attribute per setting, plus
    ``host``/``port`` from ``listen`` and the cluster map (from ``--cluster``, or this
    node alone at the listen address)."""

    data_dir: str = setting(
        "./data",
        parse_path,
        non_empty,
        doc="Directory of the state log (one subdirectory per state partition).",
        meaning="the data directory",
        metavar="DIR",
    )
    state_store: str | None = setting(
        None,
        parse_optional_text,
        doc="Where the state lives: not set, the data directory (--data-dir); a PostgreSQL "
        "URI (postgresql://USER@HOST:PORT/DB, libpq's multi-host form included, e.g. "
        "postgresql://u@db1:5432,db2:5432/db?target_session_attrs=read-write), the "
        "PostgreSQL store: every node started on it with its own --node-id is a node of "
        "one cluster, which leads state partitions by leases (needs the postgres extra: "
        "pip install 'sharecoord[postgres]'). Its password is never shown. An empty value "
        "means not set.",
        meaning="not set: the data directory; a `postgresql://` URI: the PostgreSQL store, "
        "every node on it one node of a cluster ([operations.md](operations.md#running-on-"
        "postgresql)); its password is never shown",
        metavar="URI",
    )
    state_store_schema: str = setting(
        "public",
        parse_text,
        postgres_schema_name,
        doc="The PostgreSQL schema of the store's tables (each named sharecoord_*): lower-case "
        "letters, digits and _. Every node of one cluster names the same one.",
        meaning="the PostgreSQL schema of the store's `sharecoord_*` tables",
        metavar="NAME",
    )
    lease_ms: int = _int(
        5000,
        at_least(300),
        doc="On the PostgreSQL store: how long a node's lease on a state partition lasts. "
        "It renews its leases every third of this; a node that could not renew stops "
        "serving them before they can have expired, and another node takes them over "
        "once they have (PostgreSQL's clock decides).",
        meaning="on the PostgreSQL store: a node's lease on a state partition; renewed every "
        "third of it, taken over by another node once expired (at least 300)",
    )
    state_store_timeout_ms: int = _int(
        2000,
        at_least(100),
        doc="On the PostgreSQL store: the most a statement or a connection attempt may take "
        "before it is given up (the server's statement_timeout, and a cut of the connection "
        "for a server that answers nothing). Below write_timeout_ms, so that an "
        "unreachable server makes writes answer 15 in time.",
        meaning="on the PostgreSQL store: the most a statement or a connection attempt may "
        "take; below `write_timeout_ms`",
    )
    listen: str = setting(
        "127.0.0.1:9095",
        parse_text,
        listen_address,
        doc="Address to serve HTTP on: HOST:PORT, or [IPV6]:PORT; port 0 picks a free one.",
        meaning="`HOST:PORT` or `[IPV6]:PORT`; port 0 picks a free one",
        metavar="HOST:PORT",
    )
    kafka_listener: str | None = setting(
        None,
        parse_optional_text,
        listen_address,
        doc="Also serve the share-group state RPCs in Kafka's own wire protocol (apiKeys "
        "83-87, with ApiVersions, FindCoordinator and SASL) on HOST:PORT or [IPV6]:PORT; "
        "port 0 picks a free one. Off when not set (an empty value means not set).",
        meaning="also serve the five RPCs in Kafka's wire protocol at `HOST:PORT` "
        "([api.md](api.md#the-kafka-listener)); off when not set",
        metavar="HOST:PORT",
    )
    kafka_max_connections: int = _int(
        1000,
        at_least(1),
        doc="Most connections open at once on the Kafka listener; one more is accepted and "
        "closed at once (counted in sharecoord_kafka_connections_refused_total, logged "
        "at most once a second). Each takes a file descriptor: keep the open-files limit "
        "(ulimit -n) well above it.",
        meaning="most connections open at once on the Kafka listener; one more is closed as "
        "it comes, counted in `sharecoord_kafka_connections_refused_total` and logged at "
        "most once a second (at least 1). Each takes a file descriptor: keep `ulimit -n` "
        "well above it",
    )
    advertised_listener: str | None = setting(
        None,
        parse_optional_text,
        advertised_address,
        doc="HOST:PORT that find-coordinator (and the Kafka listener's FindCoordinator, "
        "with the Kafka listener's port) names for this node when there is no cluster "
        "file. Without it: the --listen address, or, for a wildcard listen host (0.0.0.0, "
        "[::]), this machine's host name. With a cluster file, the node's entry there is "
        "its address; this may only repeat it (a port mapping in front of the node lets "
        "--listen's port differ from it). An empty value means not set.",
        meaning="`HOST:PORT` find-coordinator names for this node when there is no cluster "
        "file; without it, the listen address, or this machine's host name for a wildcard "
        "listen host. With a cluster file it may only repeat the node's entry "
        "([api.md](api.md#find-coordinator))",
        metavar="HOST:PORT",
    )
    partitions: int = _int(
        50,
        between(1, MAX_PARTITIONS),
        doc="Number of state partitions. Fixed for a data directory once created; in a "
        "cluster it must equal the cluster file's num_partitions. At most "
        f"{MAX_PARTITIONS}: Kafka writes down no limit, but each state partition costs a "
        "directory, a log to load at start and its own metric series, while one event "
        "loop serves them all, so more buys nothing; the bound also catches a typo before "
        "it is sized.",
        meaning="number of state partitions; fixed once the data directory exists; equal "
        f"to the cluster file's `num_partitions` (at most {MAX_PARTITIONS})",
        kafka=Kafka(
            "share.coordinator.state.topic.num.partitions", 50, "fixed per data directory"
        ),
    )
    topic_catalog: bool = _switch(
        doc="Check topics against the topic catalog (PUT /v1/admin/topics); off: no metadata "
        "checks at all.",
        meaning="check topics against the topic catalog",
    )
    max_body_bytes: int = _int(
        4194304,
        at_least(1024),
        doc="Largest request body accepted (413 above).",
        meaning="largest request body (at least 1024)",
    )
    max_entries_per_request: int = _int(
        5000,
        at_least(1),
        doc="Most partition entries (over all topics) in one request.",
        meaning="most partition entries per request",
    )
    max_state_batches_per_entry: int = _int(
        10000,
        at_least(1),
        doc="Most state batches in one partition entry of a write.",
        meaning="most state batches per write entry",
    )
    max_state_batches_per_share_partition: int = _int(
        DEFAULT_MAX_STATE_BATCHES,
        at_least(1),
        doc="Most state batches a share-partition's state may hold: a write that would "
        "leave more is refused (42). A snapshot writes the whole state, so this bounds what "
        "one write can make the daemon write and hold; a share-partition leader keeps at "
        "most its record locks in flight (Kafka's group.share.partition.max.record.locks, "
        "2,000 by default).",
        meaning="most state batches one share-partition's state may hold; a write that "
        "would leave more answers 42. A snapshot writes the whole state, so this bounds "
        "what one write makes the daemon write and hold ([api.md](api.md#limits))",
    )
    max_group_id_bytes: int = _int(
        DEFAULT_MAX_GROUP_ID_BYTES,
        at_least(1),
        doc="Longest group id accepted, in UTF-8 bytes (400 above; on the Kafka listener "
        "the connection is closed). Every record of the state log and every "
        "share-partition the daemon holds repeats its group id, so this bounds what one "
        "request can make it write and hold. Kafka's group ids are short names (its topic "
        "names stop at 249 characters).",
        meaning="longest group id, in UTF-8 bytes: every record repeats it, so it bounds "
        "what a request writes and holds ([api.md](api.md#limits))",
    )
    segment_bytes: int = _int(
        104857600,
        at_least(1024),
        doc="Size at which a state partition's active log segment is rolled.",
        meaning="size at which a segment is rolled (at least 1024)",
        kafka=Kafka("share.coordinator.state.topic.segment.bytes", 104857600, "at least 1024"),
    )
    snapshot_update_records_per_snapshot: int = _int(
        DEFAULT_RECORDS_PER_SNAPSHOT,
        between(0, MAX_RECORDS_PER_SNAPSHOT),
        doc="Updates of a key between two snapshots of it (docs/semantics.md §6).",
        meaning=f"updates between snapshots of a key, 0 to {MAX_RECORDS_PER_SNAPSHOT}",
        kafka=Kafka(
            "share.coordinator.snapshot.update.records.per.snapshot",
            500,
            "0 to 500 (Kafka caps it at 500 too)",
        ),
    )
    state_retention_ms: int = _int(
        -1,
        minus_one_or_positive,
        doc="Tombstone a group's state on this node once no RPC touched it for this long; "
        "-1 = never.",
        meaning="delete a group's state on this node after this long without an RPC; -1 never",
    )
    node_id: int = _int(
        0,
        between(0, INT32_MAX),
        doc="This node's id; with --cluster, it must be a node of the cluster file.",
        meaning="this node's id in the cluster file",
    )
    cluster: str | None = _file(
        doc="Cluster file (TOML) mapping nodes to state partitions (docs/api.md).",
        meaning="the cluster file",
    )
    auth_token_file: str | None = _file(
        doc="File holding the bearer token every /v1/ request must carry.",
        meaning="bearer token for `/v1/`; on the Kafka listener, the SASL/PLAIN password",
    )
    scram_credentials_file: str | None = _file(
        doc="SCRAM-SHA-256/512 credentials of the Kafka listener's SASL users (salted keys, "
        "written by `sharecoord scram add`). With it or --auth-token-file (SASL/PLAIN, "
        "the token as password), Kafka clients must authenticate.",
        meaning="SCRAM-SHA-256/512 users of the Kafka listener (written by "
        "`sharecoord scram add`)",
    )
    tls_cert: str | None = _file(
        doc="TLS certificate chain (PEM); needs --tls-key.",
        meaning="serve HTTPS with this certificate chain (PEM); needs `tls_key`",
    )
    tls_key: str | None = _file(
        doc="TLS private key (PEM, unencrypted); needs --tls-cert.",
        meaning="the private key of `tls_cert` (PEM, unencrypted)",
    )
    tls_client_ca: str | None = _file(
        doc="CA bundle (PEM) client certificates must chain to: mutual TLS. Needs --tls-cert.",
        meaning="require client certificates from this CA",
    )
    prune_interval_ms: int = _ms(
        300000,
        doc="How often sealed segments below every key's latest snapshot are deleted.",
        meaning="how often to prune",
        kafka=Kafka("share.coordinator.state.topic.prune.interval.ms", 300000),
    )
    cold_partition_snapshot_interval_ms: int = _ms(
        300000,
        doc="How often keys written only by updates get a fresh snapshot "
        "(docs/semantics.md §10).",
        meaning="how often to snapshot keys that only get updates",
        kafka=Kafka("share.coordinator.cold.partition.snapshot.interval.ms", 300000),
    )
    compaction_commit_interval_ms: int = _ms(
        5000,
        doc="How often staged compaction output is looked for and committed.",
        meaning="how often to look for staged compaction output",
    )
    write_timeout_ms: int = _ms(
        5000,
        doc="Timeout of one operation on a state partition (then error 15).",
        meaning="an answer not durable by then is 15",
        kafka=Kafka(
            "share.coordinator.write.timeout.ms",
            5000,
            "an operation not durable by then answers 15",
        ),
    )
    journal_segment_bytes: int = _int(
        16 * 1024 * 1024,
        at_least(64 * 1024),
        doc="Size of each segment of the shared journal (DATA/journal): one record there and "
        "one fdatasync make a whole group commit durable. Segments are created, "
        "zero-filled, ahead of need.",
        meaning="size of each journal segment, created zero-filled ahead of need (at least "
        "65536)",
    )
    journal_checkpoint_interval_ms: int = _ms(
        10_000,
        doc="How often a checkpoint fsyncs the partition files written since the last one "
        "and lets the journal below go (also every journal_checkpoint_bytes).",
        meaning="how often the partition files written since the last checkpoint are "
        "fsynced and the journal below is freed",
        # Kafka's "persistent record of the last flush", its log recovery point.
        kafka=Kafka(
            "log.flush.offset.checkpoint.interval.ms",
            60000,
            "Kafka: how often the recovery point is saved; here, how often the journal's "
            "checkpoint runs",
        ),
    )
    journal_checkpoint_bytes: int = _int(
        8 * 1024 * 1024,
        at_least(1),
        doc="Journal bytes written after which a checkpoint runs, whatever the time.",
        meaning="journal bytes after which a checkpoint runs, whatever the time",
    )
    journal_max_bytes: int = _int(
        1024 * 1024 * 1024,
        at_least(1024 * 1024),
        doc="Journal bytes a checkpoint cannot free (a partition whose files will not sync) "
        "after which writes answer 15 until one can.",
        meaning="journal bytes no checkpoint could free after which writes answer 15 (at "
        "least 1048576)",
    )
    append_linger_ms: int = _int(
        0,
        at_least(0),
        doc="Extra wait before a group commit to gather more writes. Kafka's default is 5; "
        "sharecoord's is 0 because writes arriving during an fsync already share the "
        "next one.",
        meaning="extra wait before a commit cycle",
        kafka=Kafka(
            "share.coordinator.append.linger.ms",
            5,
            "writes that arrive during an fsync share the next one already",
        ),
    )
    journal_flush: str = setting(
        "kernel",
        parse_word,
        one_of("kernel", "thread"),
        doc="Who runs the journal's fdatasync. `kernel`: Linux AIO runs it and tells the event "
        "loop when it ends, with no thread on the path (where the kernel has no AIO flush, the "
        "log says why and the commit thread does it). `thread`: always the commit thread.",
        meaning="`kernel` (Linux AIO; else the commit thread) or `thread`",
        metavar="WHO",
    )
    request_timeout_s: float = _seconds(
        60.0,
        positive,
        doc="Seconds a client may take to send a request (its first one counted from when "
        "it connects) and to take its answer, and an idle keep-alive connection stays "
        "open; slow clients are cut off after it.",
        meaning="time a client gets to send a request and to take its answer; idle "
        "keep-alive limit",
    )
    shutdown_timeout_s: float = _seconds(
        30.0,
        at_least(0),
        doc="Seconds to drain in-flight requests on SIGTERM before closing connections.",
        meaning="time to finish requests on SIGTERM",
    )
    log_level: str = setting(
        "info",
        parse_word,
        one_of(*LOG_LEVELS),
        doc="Log level: debug, info, warning or error.",
        meaning="`debug`, `info`, `warning` or `error`",
        metavar="LEVEL",
    )
    log_format: str = setting(
        "text",
        parse_word,
        one_of(*LOG_FORMATS),
        doc="Log format: text (one line per event) or json (one object per line).",
        meaning="`text` (a line per event) or `json` (an object per line)",
        metavar="FORMAT",
    )
    access_log: bool = _switch(
        doc="Log one line per request (method, path, status, partition entries of an RPC, "
        "milliseconds) at info; without it the lines come at debug only. When they "
        "would not be printed, nothing of the access log runs per request.",
        meaning="log a line per request (method, path, status, entries, milliseconds) at "
        "info; without it, at debug only, and no access-log code runs while debug is off",
    )
    # Derived from the settings by load_serve_config.
    host: str
    port: int
    cluster_map: ClusterMap


SERVE_SETTINGS = command("serve", settings_of(ServeConfig))


def load_serve_config(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> ServeConfig:
    """Resolve ``SERVE_SETTINGS`` (the file from ``--config`` or ``SHARECOORD_CONFIG``),
    check the settings that go together, and load the cluster map."""
    config_file = config_file_of(args, environ)
    values, sources = resolve_with_sources(SERVE_SETTINGS, args, environ, config_file)

    def where(name: str) -> str:
        return f"{name} (from {sources[name]})"

    if (values["tls_cert"] is None) != (values["tls_key"] is None):
        given = "tls_cert" if values["tls_cert"] is not None else "tls_key"
        raise ConfigError(f"{where(given)} is set without the other: give --tls-cert and --tls-key")
    if values["tls_client_ca"] is not None and values["tls_cert"] is None:
        raise ConfigError(
            f"{where('tls_client_ca')} needs --tls-cert and --tls-key: mutual TLS is TLS first"
        )
    check_state_store(values, where)
    host, port = parse_listen(values["listen"])
    node_id, partitions = values["node_id"], values["partitions"]
    advertised = values["advertised_listener"]
    if values["cluster"] is None:
        if advertised is not None:
            shown_host, shown_port = parse_listen(advertised)
        else:
            shown_host = advertised_host(None) if host in WILDCARD_HOSTS else host
            shown_port = port
        cluster_map = ClusterMap.single(node_id, shown_host, shown_port, partitions)
    else:
        try:
            cluster_map = load_cluster(values["cluster"])
            check_partition_count(cluster_map, partitions)
        except ClusterError as exc:
            raise ConfigError(f"{where('cluster')}: {exc}") from None
        if node_id not in {node.id for node in cluster_map.nodes}:
            ids = ", ".join(str(node.id) for node in cluster_map.nodes)
            raise ConfigError(
                f"{where('node_id')} = {node_id} is not a node of cluster file "
                f"{values['cluster']} (ids: {ids}); give --node-id"
            )
        check_node_address(cluster_map, node_id, port, advertised, values["cluster"], where)
    return ServeConfig(**values, host=host, port=port, cluster_map=cluster_map)

