"""The daemon's configuration: a table of name / default / doc / validator.

Names follow Kafka's where Kafka has the same setting
(``share.coordinator.snapshot.update.records.per.snapshot`` →
``snapshot_update_records_per_snapshot``). Each setting is read, first found wins, from

1. its flag (``--data-dir``),
2. the environment (``SHARECOORD_DATA_DIR``: ``SHARECOORD_`` + the flag's name in upper
   case with ``-`` as ``_``),
3. the ``--config`` TOML file (top-level key ``data_dir``),
4. its default.

Flags are declared with ``default=argparse.SUPPRESS`` so "not given" is visible. Every
value, whatever its source, goes through the setting's ``parse`` and ``validate``; an
error is a ``ConfigError`` naming the setting, where the value came from and what is
allowed (the CLI prints it and exits 2). Unknown keys in the file are errors too: a typo
must not be silently ignored.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import re
import socket
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, MAX_RECORDS_PER_SNAPSHOT
from protocol.shard import DEFAULT_MAX_STATE_BATCHES
from protocol.topic_id import canonical_topic_id
from protocol.widths import DEFAULT_MAX_GROUP_ID_BYTES
from server.cluster import (
    MAX_PARTITIONS,
    ClusterError,
    ClusterMap,
    check_partition_count,
    load_cluster,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ENV_PREFIX = "SHARECOORD_"
CONFIG_ENV_VAR = ENV_PREFIX + "CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")
_INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it, its source and what is allowed."""


@dataclass(frozen=True)
class Setting:
    """One row of the config table.

    ``parse`` turns text (a flag, an env var, a string in the file) into a value;
    ``validate`` raises ``ValueError`` saying what is allowed. ``flag`` defaults to the
    name with ``-`` for ``_``.
    """

    name: str
    default: Any
    doc: str
    parse: Callable[[str], Any]
    validate: Callable[[Any], None]
    kafka_name: str | None = None
    flag: str = ""
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.flag.lstrip("-").upper().replace("-", "_")

    @property
    def is_bool(self) -> bool:
        return isinstance(self.default, bool)


# --- parsers (text -> value) -----------------------------------------------------------


def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def parse_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected a boolean: true/false, 1/0 or yes/no")


def parse_path(text: str) -> str:
    return os.path.expanduser(text)


def parse_optional_path(text: str) -> str | None:
    """A path, or ``None`` for an empty value (so an env var can unset a file's path)."""
    return os.path.expanduser(text) if text.strip() else None


def parse_word(text: str) -> str:
    return text.strip().lower()


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` → ``(host, port)``, the host without brackets."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError("expected [IPV6]:PORT, e.g. [::1]:9095")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9095")
        if ":" in host:
            raise ValueError("an IPv6 address goes in brackets, e.g. [::1]:9095")
        if not host or any(c.isspace() for c in host):
            raise ValueError("the host is empty or has spaces (0.0.0.0 or [::] listen everywhere)")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError("the port must be an integer 0..65535")
    return host, int(port_text)


def parse_url(text: str) -> str:
    """A daemon's base URL: ``http(s)://HOST[:PORT]``, or ``HOST:PORT`` meaning
    ``http://HOST:PORT`` (what ``--listen`` takes). Anything else is refused here, before
    a connection is tried: another scheme would only time out or fail obscurely."""
    text = text.strip()
    if "://" not in text:
        try:
            parse_listen(text)
        except ValueError:
            raise ValueError("expected http://HOST:PORT, https://HOST:PORT or HOST:PORT") from None
        text = "http://" + text
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # parsed lazily: a bad port raises here
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"the scheme must be http or https, not {parts.scheme}")
    if not parts.hostname:
        raise ValueError("the URL names no host")
    if port == 0:
        raise ValueError("port 0 cannot be connected to")
    if parts.query or parts.fragment:
        raise ValueError("a base URL has no query or fragment")
    return text.rstrip("/")


# Masters spark-submit accepts (Spark's SparkSubmitArguments / SparkContext): local
# ones, standalone clusters (several masters for HA), YARN and Kubernetes.
_SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?"
    r"|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*\]"
    r"|spark://[^\s,:/]+:[0-9]+(,[^\s,:/]+:[0-9]+)*"
    r"|yarn"
    r"|k8s://\S+"
)


def parse_spark_master(text: str) -> str:
    master = text.strip()
    if not _SPARK_MASTER.fullmatch(master):
        raise ValueError("expected local, local[*], local[N], spark://HOST:PORT, yarn or k8s://URL")
    return master


# --- validators (value -> None or ValueError) ------------------------------------------


def at_least(minimum: int | float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")

    return check


def between(low: int, high: int) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")

    return check


def one_of(*choices: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")

    return check


def _minus_one_or_positive(value: Any) -> None:
    if value != -1 and value < 1:
        raise ValueError("must be -1 (never) or >= 1")


def _positive(value: Any) -> None:
    if value <= 0:
        raise ValueError("must be > 0")


def _non_empty(value: Any) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


def _topic_id(value: Any) -> None:
    canonical_topic_id(value)  # its ValueError says what a topic id looks like


def _listen(value: Any) -> None:
    parse_listen(value)


# Listen hosts that mean "every interface": no client can connect to one.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def _advertised(value: Any) -> None:
    host, port = parse_listen(value)
    if host in WILDCARD_HOSTS:
        raise ValueError(f"{host or 'an empty host'} is not an address a client can connect to")
    if port == 0:
        raise ValueError("the port must be 1..65535: clients connect to it")


def advertised_host(advertised_listener: str | None) -> str:
    """The host find-coordinator names for this node when its listen host is a
    wildcard: the --advertised-listener's, else this machine's host name (what Kafka
    advertises for a listener without a host)."""
    if advertised_listener is not None:
        return parse_listen(advertised_listener)[0]
    return socket.gethostname()


def _anything(value: Any) -> None:
    pass


def _int(name: str, default: int, doc: str, check: Callable[[Any], None], **kw: Any) -> Setting:
    return Setting(name, default, doc, parse_int, check, metavar="N", **kw)


def _ms(name: str, default: int, doc: str, kafka_name: str | None = None) -> Setting:
    return _int(name, default, doc, at_least(1), kafka_name=kafka_name)


def _optional_text(text: str) -> str | None:
    """A value that may be unset: empty text (an env var or a file key) unsets it."""
    return text.strip() or None


def _file(name: str, doc: str) -> Setting:
    doc += " An empty value means not set."
    return Setting(name, None, doc, parse_optional_path, _anything, metavar="FILE")


SERVE_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "data_dir",
        "./data",
        "Directory of the state log (one subdirectory per state partition).",
        parse_path,
        _non_empty,
        metavar="DIR",
    ),
    Setting(
        "listen",
        "127.0.0.1:9095",
        "Address to serve HTTP on: HOST:PORT, or [IPV6]:PORT; port 0 picks a free one.",
        str.strip,
        _listen,
        metavar="HOST:PORT",
    ),
    Setting(
        "kafka_listener",
        None,
        "Also serve the share-group state RPCs in Kafka's own wire protocol (apiKeys "
        "83-87, with ApiVersions, FindCoordinator and SASL) on HOST:PORT or [IPV6]:PORT; "
        "port 0 picks a free one. Off when not set (an empty value means not set).",
        _optional_text,
        _listen,
        metavar="HOST:PORT",
    ),
    _int(
        "kafka_max_connections",
        1000,
        "Most connections open at once on the Kafka listener; one more is accepted and "
        "closed at once (counted in sharecoord_kafka_connections_refused_total, logged "
        "at most once a second). Each takes a file descriptor: keep the open-files limit "
        "(ulimit -n) well above it.",
        at_least(1),
    ),
    Setting(
        "advertised_listener",
        None,
        "HOST:PORT that find-coordinator (and the Kafka listener's FindCoordinator, with "
        "the Kafka listener's port) names for this node when there is no cluster file. "
        "Without it: the --listen address, or, for a wildcard listen host (0.0.0.0, [::]), "
        "this machine's host name. With a cluster file, the node's entry there is its "
        "address; this may only repeat it (a port mapping in front of the node lets "
        "--listen's port differ from it). An empty value means not set.",
        _optional_text,
        _advertised,
        metavar="HOST:PORT",
    ),
    _int(
        "partitions",
        50,
        "Number of state partitions. Fixed for a data directory once created; in a "
        f"cluster it must equal the cluster file's num_partitions. At most {MAX_PARTITIONS}: "
        "Kafka writes down no limit, but each state partition costs a directory, a log "
        "to load at start and its own metric series, while one event loop serves them "
        "all, so more buys nothing; the bound also catches a typo before it is sized.",
        between(1, MAX_PARTITIONS),
        kafka_name="share.coordinator.state.topic.num.partitions",
    ),
    Setting(
        "topic_catalog",
        False,
        "Check topics against the topic catalog (PUT /v1/admin/topics); off: no metadata "
        "checks at all.",
        parse_bool,
        _anything,
    ),
    _int("max_body_bytes", 4194304, "Largest request body accepted (413 above).", at_least(1024)),
    _int(
        "max_entries_per_request",
        5000,
        "Most partition entries (over all topics) in one request.",
        at_least(1),
    ),
    _int(
        "max_state_batches_per_entry",
        10000,
        "Most state batches in one partition entry of a write.",
        at_least(1),
    ),
    _int(
        "max_state_batches_per_share_partition",
        DEFAULT_MAX_STATE_BATCHES,
        "Most state batches a share-partition's state may hold: a write that would leave "
        "more is refused (42). A snapshot writes the whole state, so this bounds what one "
        "write can make the daemon write and hold; a share-partition leader keeps at most "
        "its record locks in flight (Kafka's group.share.partition.max.record.locks, 2,000 "
        "by default).",
        at_least(1),
    ),
    _int(
        "max_group_id_bytes",
        DEFAULT_MAX_GROUP_ID_BYTES,
        "Longest group id accepted, in UTF-8 bytes (400 above; on the Kafka listener the "
        "connection is closed). Every record of the state log and every share-partition "
        "the daemon holds repeats its group id, so this bounds what one request can make "
        "it write and hold. Kafka's group ids are short names (its topic names stop at "
        "249 characters).",
        at_least(1),
    ),
    _int(
        "segment_bytes",
        104857600,
        "Size at which a state partition's active log segment is rolled.",
        at_least(1024),
        kafka_name="share.coordinator.state.topic.segment.bytes",
    ),
    _int(
        "snapshot_update_records_per_snapshot",
        DEFAULT_RECORDS_PER_SNAPSHOT,
        "Updates of a key between two snapshots of it (docs/semantics.md §6).",
        between(0, MAX_RECORDS_PER_SNAPSHOT),
        kafka_name="share.coordinator.snapshot.update.records.per.snapshot",
    ),
    _int(
        "state_retention_ms",
        -1,
        "Tombstone a group's state on this node once no RPC touched it for this long; -1 = never.",
        _minus_one_or_positive,
    ),
    _int(
        "node_id",
        0,
        "This node's id; with --cluster, it must be a node of the cluster file.",
        between(0, _INT32_MAX),
    ),
    _file("cluster", "Cluster file (TOML) mapping nodes to state partitions (docs/api.md)."),
    _file(
        "auth_token_file",
        "File holding the bearer token every /v1/ request must carry.",
    ),
    _file(
        "scram_credentials_file",
        "SCRAM-SHA-256/512 credentials of the Kafka listener's SASL users (salted keys, "
        "written by `sharecoord scram add`). With it or --auth-token-file (SASL/PLAIN, "
        "the token as password), Kafka clients must authenticate.",
    ),
    _file("tls_cert", "TLS certificate chain (PEM); needs --tls-key."),
    _file("tls_key", "TLS private key (PEM, unencrypted); needs --tls-cert."),
    _file(
        "tls_client_ca",
        "CA bundle (PEM) client certificates must chain to: mutual TLS. Needs --tls-cert.",
    ),
    _ms(
        "prune_interval_ms",
        300000,
        "How often sealed segments below every key's latest snapshot are deleted.",
        "share.coordinator.state.topic.prune.interval.ms",
    ),
    _ms(
        "cold_partition_snapshot_interval_ms",
        300000,
        "How often keys written only by updates get a fresh snapshot (docs/semantics.md §10).",
        "share.coordinator.cold.partition.snapshot.interval.ms",
    ),
    _ms(
        "compaction_commit_interval_ms",
        5000,
        "How often staged compaction output is looked for and committed.",
    ),
    _ms(
        "write_timeout_ms",
        5000,
        "Timeout of one operation on a state partition (then error 15).",
        "share.coordinator.write.timeout.ms",
    ),
    _int(
        "journal_segment_bytes",
        16 * 1024 * 1024,
        "Size of each segment of the shared journal (DATA/journal): one record there and "
        "one fdatasync make a whole group commit durable. Segments are created, "
        "zero-filled, ahead of need.",
        at_least(64 * 1024),
    ),
    _ms(
        "journal_checkpoint_interval_ms",
        10_000,
        "How often a checkpoint fsyncs the partition files written since the last one "
        "and lets the journal below go (also every journal_checkpoint_bytes).",
        kafka_name="log.flush.offset.checkpoint.interval.ms",
    ),
    _int(
        "journal_checkpoint_bytes",
        8 * 1024 * 1024,
        "Journal bytes written after which a checkpoint runs, whatever the time.",
        at_least(1),
    ),
    _int(
        "journal_max_bytes",
        1024 * 1024 * 1024,
        "Journal bytes a checkpoint cannot free (a partition whose files will not sync) "
        "after which writes answer 15 until one can.",
        at_least(1024 * 1024),
    ),
    _int(
        "append_linger_ms",
        0,
        "Extra wait before a group commit to gather more writes. Kafka's default is 5; "
        "sharecoord's is 0 because writes arriving during an fsync already share the "
        "next one.",
        at_least(0),
        kafka_name="share.coordinator.append.linger.ms",
    ),
    Setting(
        "request_timeout_s",
        60.0,
        "Seconds a client may take to send a request (its first one counted from when it "
        "connects) and to take its answer, and an idle keep-alive connection stays open; "
        "slow clients are cut off after it.",
        parse_float,
        _positive,
        metavar="SECONDS",
    ),
    Setting(
        "shutdown_timeout_s",
        30.0,
        "Seconds to drain in-flight requests on SIGTERM before closing connections.",
        parse_float,
        at_least(0),
        metavar="SECONDS",
    ),
    Setting(
        "log_level",
        "info",
        "Log level: debug, info, warning or error.",
        parse_word,
        one_of(*LOG_LEVELS),
        metavar="LEVEL",
    ),
    Setting(
        "log_format",
        "text",
        "Log format: text (one line per event) or json (one object per line).",
        parse_word,
        one_of(*LOG_FORMATS),
        metavar="FORMAT",
    ),
    Setting(
        "access_log",
        False,
        "Log one line per request (method, path, status, partition entries of an RPC, "
        "milliseconds) at info; without it the lines come at debug only. When they "
        "would not be printed, nothing of the access log runs per request.",
        parse_bool,
        _anything,
    ),
)


# --- the other commands (docs/api.md#cli) ----------------------------------------------
# Their flags read the environment and the config file exactly like serve's, so one
# file can carry the settings of every command.

_DATA_DIR = SERVE_SETTINGS[0]


_MASTER = Setting(
    "master",
    "local[*]",
    "Spark master URL: local[*] (the embedded default) or spark://host:7077, yarn, ...",
    parse_spark_master,
    _anything,
    metavar="URL",
)

def _retention(value: Any) -> None:
    if value < -1:
        raise ValueError("must be -1 (forever), 0 (keep no history) or more")


_HISTORY_DIR = Setting(
    "history_dir",
    None,
    "Where compaction keeps the history of the records it folds away (Parquet, by state "
    "partition and day); a relative path is inside --data-dir. Default: DATA/history. "
    "An empty value means the default.",
    parse_optional_path,
    _anything,
    metavar="DIR",
)

COMPACT_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    _MASTER,
    _int(
        "tombstone_retention_ms",
        86_400_000,
        "Compaction drops a key whose latest record is a tombstone older than this.",
        at_least(0),
        kafka_name="delete.retention.ms",
    ),
    _HISTORY_DIR,
    _int(
        "history_retention_ms",
        7 * 86_400_000,
        "How long the history keeps a day of records: -1 forever; 0 keeps no history at "
        "all (compaction and pruning then fold records away for good, and the audit sees "
        "only what is left).",
        _retention,
        kafka_name="retention.ms",
    ),
    replace(
        next(s for s in SERVE_SETTINGS if s.name == "segment_bytes"),
        doc="The daemon's segment_bytes: only said when nothing is sealed yet.",
    ),
)

AUDIT_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    Setting(
        "out",
        None,
        "Directory for the audit report (JSON, Parquet, PNG, HTML); required.",
        parse_optional_path,
        _anything,
        metavar="DIR",
    ),
    _int(
        "delivery_limit",
        5,
        "Records at or over this delivery count should have been archived.",
        at_least(1),
        kafka_name="group.share.delivery.count.limit",
    ),
    _MASTER,
    Setting(
        "since_last",
        False,
        "Audit only the records written since the last audit into --out (its checkpoint "
        "carries the state they need); the first run audits everything.",
        parse_bool,
        _anything,
    ),
)

LOG_DUMP_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    Setting("partition", None, "Only this state partition.", parse_int, at_least(0), metavar="P"),
    Setting("json", False, "One JSON object per record.", parse_bool, _anything),
)

LOG_VERIFY_SETTINGS: tuple[Setting, ...] = (_DATA_DIR,)

STATE_GET_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "url",
        None,
        "Base URL of a daemon, e.g. http://127.0.0.1:9095 (HOST:PORT means http); required.",
        parse_url,
        _anything,
        metavar="URL",
    ),
    Setting("group", None, "Group id; required.", str, _non_empty, metavar="G"),
    Setting(
        "topic", None, "Topic id (22-char or RFC 4122 form); required.", str, _topic_id, metavar="T"
    ),
    Setting(
        "partition",
        None,
        "Partition; required.",
        parse_int,
        between(0, _INT32_MAX),
        metavar="P",
    ),
    Setting(
        "timeout_s",
        10.0,
        "Seconds to wait for the daemon to accept the connection and to answer.",
        parse_float,
        _positive,
        metavar="SECONDS",
    ),
    _file("token_file", "File holding the bearer token."),
    _file("cacert", "CA certificate (PEM) to verify the daemon's TLS certificate."),
    _file("cert", "Client certificate (PEM) for mutual TLS."),
    _file("key", "Client private key (PEM) for mutual TLS."),
)


def parse_partition_list(text: str) -> tuple[int, ...]:
    """``3``, ``3,5-7`` or ``0-24``: state partition numbers, as in a cluster file."""
    found: set[int] = set()
    for part in text.split(","):
        first, dash, last = (piece.strip() for piece in part.partition("-"))
        if not (first.isdigit() and (not dash or last.isdigit())):
            raise ValueError('expected partition numbers and ranges, e.g. "3" or "3,5-7"')
        low, high = int(first), int(last) if dash else int(first)
        if low > high:
            raise ValueError(f"range {part.strip()!r} is reversed")
        found.update(range(low, high + 1))
    return tuple(sorted(found))


# The node a data directory belongs to, for the partition commands: DATA/ASSIGNMENT
# says so once a daemon of this version ran there; until then it must be given.
_PARTITION_NODE = Setting(
    "node_id",
    None,
    "The node the data directory belongs to; needed only while it does not record one "
    "(DATA/ASSIGNMENT, written by the daemon), and checked against it otherwise.",
    parse_int,
    between(0, _INT32_MAX),
    metavar="N",
)

PARTITION_EXPORT_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    Setting(
        "partition",
        None,
        "The state partition to export; required.",
        parse_int,
        at_least(0),
        metavar="P",
    ),
    Setting(
        "out",
        None,
        "A new (or empty) directory to write the export into; required.",
        parse_optional_path,
        _anything,
        metavar="DIR",
    ),
)

PARTITION_IMPORT_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    Setting(
        "source",
        None,
        "The directory `sharecoord partition export` wrote; required.",
        parse_optional_path,
        _anything,
        flag="--from",
        metavar="DIR",
    ),
    _PARTITION_NODE,
)

PARTITION_ADOPT_SETTINGS: tuple[Setting, ...] = (
    _DATA_DIR,
    Setting(
        "partition",
        None,
        'The state partitions to adopt: a number or a list, "3,5-7"; required.',
        parse_partition_list,
        _anything,
        metavar="LIST",
    ),
    _PARTITION_NODE,
)

_ALL_SETTINGS: tuple[Setting, ...] = (
    SERVE_SETTINGS
    + COMPACT_SETTINGS
    + AUDIT_SETTINGS
    + LOG_DUMP_SETTINGS
    + STATE_GET_SETTINGS
    + PARTITION_IMPORT_SETTINGS
)


def load_settings(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str] = os.environ,
    *,
    required: Sequence[str] = (),
) -> dict[str, Any]:
    """Resolve one command's settings (flag > env > file > default); a ``required``
    setting left unset is a ConfigError naming its flag and env var."""
    config_file = getattr(args, "config", None) or environ.get(CONFIG_ENV_VAR) or None
    values = resolve(settings, args, environ, config_file)
    by_name = {s.name: s for s in settings}
    for name in required:
        if values[name] is None:
            setting = by_name[name]
            raise ConfigError(f"{setting.flag} is required (or set {setting.env_var})")
    return values


@dataclass(frozen=True)
class ServeConfig:
    """The resolved settings of ``sharecoord serve``, one attribute per setting, plus
    ``host``/``port`` from ``listen`` and the cluster map (from ``--cluster``, or this
    node alone at the listen address)."""

    data_dir: str
    listen: str
    kafka_listener: str | None
    kafka_max_connections: int
    advertised_listener: str | None
    partitions: int
    topic_catalog: bool
    max_body_bytes: int
    max_entries_per_request: int
    max_state_batches_per_entry: int
    max_state_batches_per_share_partition: int
    max_group_id_bytes: int
    segment_bytes: int
    snapshot_update_records_per_snapshot: int
    state_retention_ms: int
    node_id: int
    cluster: str | None
    auth_token_file: str | None
    scram_credentials_file: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    prune_interval_ms: int
    cold_partition_snapshot_interval_ms: int
    compaction_commit_interval_ms: int
    write_timeout_ms: int
    journal_segment_bytes: int
    journal_checkpoint_interval_ms: int
    journal_checkpoint_bytes: int
    journal_max_bytes: int
    append_linger_ms: int
    request_timeout_s: float
    shutdown_timeout_s: float
    log_level: str
    log_format: str
    access_log: bool
    host: str
    port: int
    cluster_map: ClusterMap


# --- argparse --------------------------------------------------------------------------


def add_arguments(
    parser: argparse.ArgumentParser, settings: Sequence[Setting], *, config_flag: bool = True
) -> None:
    """Add one ``--flag`` per setting (and ``--config FILE`` unless ``config_flag`` is
    false). Nothing given leaves no attribute on the namespace (``argparse.SUPPRESS``)."""
    if config_flag:
        parser.add_argument(
            "--config",
            metavar="FILE",
            default=argparse.SUPPRESS,
            help=f"TOML file of settings, top-level keys with '_' (env {CONFIG_ENV_VAR}).",
        )
    for setting in settings:
        help_text = _help(setting).replace("%", "%%")
        if setting.is_bool:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                setting.flag,
                dest=setting.name,
                metavar=setting.metavar or "VALUE",
                default=argparse.SUPPRESS,
                help=help_text,
            )


def _help(setting: Setting) -> str:
    parts = [f"default: {_show_default(setting.default)}", f"env {setting.env_var}"]
    if setting.kafka_name:
        parts.append(f"Kafka: {setting.kafka_name}")
    return f"{setting.doc} ({'; '.join(parts)})"


def _show_default(default: Any) -> str:
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


# --- resolution ------------------------------------------------------------------------


def resolve(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config_file: str | None,
) -> dict[str, Any]:
    """The value of every setting: flag > env > file > default, parsed and validated."""
    values, _ = _resolve_with_sources(settings, args, environ, config_file)
    return values


def load_serve_config(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> ServeConfig:
    """Resolve ``SERVE_SETTINGS`` (the file from ``--config`` or ``SHARECOORD_CONFIG``),
    check the settings that go together, and load the cluster map."""
    config_file = getattr(args, "config", None) or environ.get(CONFIG_ENV_VAR) or None
    values, sources = _resolve_with_sources(SERVE_SETTINGS, args, environ, config_file)

    def where(name: str) -> str:
        return f"{name} (from {sources[name]})"

    if (values["tls_cert"] is None) != (values["tls_key"] is None):
        given = "tls_cert" if values["tls_cert"] is not None else "tls_key"
        raise ConfigError(f"{where(given)} is set without the other: give --tls-cert and --tls-key")
    if values["tls_client_ca"] is not None and values["tls_cert"] is None:
        raise ConfigError(
            f"{where('tls_client_ca')} needs --tls-cert and --tls-key: mutual TLS is TLS first"
        )
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
        _check_node_address(cluster_map, node_id, port, advertised, values["cluster"], where)
    return ServeConfig(**values, host=host, port=port, cluster_map=cluster_map)


def _check_node_address(
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


def _resolve_with_sources(
    settings: Sequence[Setting],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config_file: str | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    file_values = _read_config_file(config_file, settings) if config_file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in settings:
        if hasattr(args, setting.name):
            raw: Any = getattr(args, setting.name)
            source = f"flag {setting.flag}"
        elif setting.env_var in environ:
            raw = environ[setting.env_var]
            source = f"env var {setting.env_var}"
        elif setting.name in file_values:
            raw = file_values[setting.name]
            source = f"key {setting.name} in config file {config_file}"
        else:
            values[setting.name] = setting.default
            sources[setting.name] = "default"
            continue
        values[setting.name] = _convert(setting, raw, source)
        sources[setting.name] = source
    return values, sources


def _convert(setting: Setting, raw: Any, source: str) -> Any:
    try:
        if isinstance(raw, str):
            value = setting.parse(raw)
        elif isinstance(raw, bool) and setting.is_bool:
            value = raw
        elif isinstance(raw, bool):  # TOML true where a non-boolean belongs
            value = setting.parse("true" if raw else "false")
        elif isinstance(raw, (int, float)):
            value = setting.parse(str(raw))
        else:
            raise ValueError("expected a string, number or boolean")
        if value is not None:
            setting.validate(value)
    except ValueError as exc:
        raise ConfigError(f"{setting.name}: {exc}; got {raw!r} from {source}") from None
    return value


def _read_config_file(path: str, settings: Sequence[Setting]) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            document: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # tomllib decodes before it parses
        raise ConfigError(
            f"config file {path}: not valid TOML: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc
    # Keys of any command's settings are allowed (one file serves several commands);
    # anything else is a typo and refused.
    known = {s.name for s in _ALL_SETTINGS} | {s.name for s in settings}
    unknown = sorted(set(document) - known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key.replace("-", "_"), known, n=1)
            hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"config file {path}: unknown key(s): {', '.join(hints)}")
    return document


# --- documentation ---------------------------------------------------------------------


def describe_settings(settings: Sequence[Setting] = SERVE_SETTINGS) -> str:
    """The config table in Markdown, for the README."""
    lines = [
        "| name | flag | env var | default | Kafka name | doc |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in settings:
        kafka = f"`{s.kafka_name}`" if s.kafka_name else ""
        default = f"`{_show_default(s.default)}`"
        doc = s.doc.replace("|", "\\|")
        lines.append(f"| `{s.name}` | `{s.flag}` | `{s.env_var}` | {default} | {kafka} | {doc} |")
    return "\n".join(lines) + "\n"
