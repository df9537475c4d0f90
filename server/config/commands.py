"""The settings of every command but ``serve`` (docs/api.md#cli): one table each.

Their flags read the environment and the config file exactly like serve's, so one file
can carry the settings of every command. A setting several commands take is declared
once and named in each of their tables (``DATA_DIR`` is serve's ``data_dir``). These
commands read a handful of values each, from the dict ``load_settings`` returns; a
command that wants a typed config declares it as ``ServeConfig`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from server.config.engine import Kafka, Setting, command
from server.config.parsers import (
    INT32_MAX,
    at_least,
    between,
    non_empty,
    parse_bool,
    parse_float,
    parse_int,
    parse_optional_path,
    parse_partition_list,
    parse_spark_master,
    parse_url,
    positive,
    topic_id,
)
from server.config.serve import SERVE_SETTINGS

_SERVE = {s.name: s for s in SERVE_SETTINGS}
DATA_DIR = _SERVE["data_dir"]
# The Spark jobs read a data directory, or the PostgreSQL store given as serve takes it
# (a flag, the setting or the environment), in the schema serve names.
JOB_STATE_STORE = replace(
    _SERVE["state_store"],
    doc="serve's state_store: not set, the job reads --data-dir; a PostgreSQL URI (as the "
    "nodes were given it), the job reads and compacts that store's tables instead "
    "(needs the postgres extra where the job and its executors run). Its password is "
    "never shown.",
    meaning="serve's `state_store`: not set, the job reads `--data-dir`; a `postgresql://` "
    "URI, the job works on that store's tables ([operations.md](operations.md#the-spark-"
    "jobs-on-the-postgresql-store)); its password is never shown",
)
JOB_STATE_STORE_SCHEMA = replace(
    _SERVE["state_store_schema"],
    doc="serve's state_store_schema: the schema of the store's sharecoord_* tables, as "
    "its nodes name it (with state_store only).",
    meaning="serve's `state_store_schema`: the schema of the store's tables, as its nodes name it",
)


def _int(
    name: str,
    default: int | None,
    doc: str,
    check: Callable[[Any], None],
    *,
    metavar: str = "N",
    **kw: Any,
) -> Setting:
    return Setting(name, default, doc, parse_int, check, metavar=metavar, **kw)


def _file(name: str, doc: str, **kw: Any) -> Setting:
    doc += " An empty value means not set."
    return Setting(name, None, doc, parse_optional_path, metavar="FILE", **kw)


def _retention(value: Any) -> None:
    if value < -1:
        raise ValueError("must be -1 (forever), 0 (keep no history) or more")


MASTER = Setting(
    "master",
    "local[*]",
    "Spark master URL: local[*] (the embedded default) or spark://host:7077, yarn, ...",
    parse_spark_master,
    metavar="URL",
    meaning="Spark master: `local[*]` (Spark in the command's own process, all cores) or "
    "any URL Spark takes (`spark://HOST:7077`, `yarn`, ...)",
)

# Where the jobs keep the Python environment they ship to a cluster's executors
# (spark_jobs/shipenv.py): the cache, not the archive, so a changed venv packs anew.
SPARK_ENV_CACHE = Setting(
    "spark_env_cache",
    None,
    "Where the jobs keep the Python environment they pack and ship to a cluster's "
    "executors (--archives), one archive per environment; a changed environment packs a "
    "new one. Default: $XDG_CACHE_HOME/sharecoord/spark-env (~/.cache/...). Not used by "
    "local masters, nor when PYSPARK_PYTHON names the executors' Python. An empty value "
    "means the default.",
    parse_optional_path,
    metavar="DIR",
    meaning="where the Python environment shipped to a cluster's executors is packed and "
    "kept (`~/.cache/sharecoord/spark-env`); local masters and a set `PYSPARK_PYTHON` "
    "need none",
)

# Where the jobs keep their driver JVM's class-data archive (spark_jobs/classcache.py).
SPARK_CLASS_CACHE = Setting(
    "spark_class_cache",
    None,
    "Where the jobs keep the classes their driver JVM loads (a class-data archive, one per "
    "job, Spark and java), written by the first run and mapped by the next ones to start "
    "faster; off keeps none. Default: $XDG_CACHE_HOME/sharecoord/spark-classes "
    "(~/.cache/...). An empty value means the default.",
    parse_optional_path,
    metavar="DIR",
    meaning="where the driver JVM's class-data archive is kept, written by the first run "
    "and mapped by the next ones (`~/.cache/sharecoord/spark-classes`); `off` keeps none",
)

COMPACT_SETTINGS = command(
    "compact",
    (
        DATA_DIR,
        MASTER,
        SPARK_ENV_CACHE,
        SPARK_CLASS_CACHE,
        _int(
            "tombstone_retention_ms",
            86_400_000,
            "Compaction drops a key whose latest record is a tombstone older than this.",
            at_least(0),
            kafka=Kafka(
                "delete.retention.ms",
                86_400_000,
                "a topic config: how long compaction keeps a tombstone",
            ),
            meaning="how long a deleted share-partition's tombstone is kept",
        ),
        Setting(
            "history_dir",
            None,
            "Where compaction keeps the history of the records it folds away (Parquet, by "
            "state partition and day); a relative path is inside --data-dir. Default: "
            "DATA/history. An empty value means the default.",
            parse_optional_path,
            metavar="DIR",
            meaning="where the history of the records compaction folds away goes; relative "
            "paths are inside the data directory; none means `DATA/history`",
        ),
        _int(
            "history_retention_ms",
            7 * 86_400_000,
            "How long the history keeps a day of records: -1 forever; 0 keeps no history at "
            "all (compaction and pruning then fold records away for good, and the audit "
            "sees only what is left).",
            _retention,
            kafka=Kafka(
                "retention.ms",
                7 * 86_400_000,
                "a topic config; here, how long the history keeps records",
            ),
            meaning="how long the history keeps a day of records (7 days): `-1` forever, "
            "`0` no history at all",
        ),
        replace(
            _SERVE["segment_bytes"],
            doc="The daemon's segment_bytes: only said when nothing is sealed yet.",
            meaning="the daemon's `segment_bytes`, said when nothing is sealed yet",
        ),
        JOB_STATE_STORE,
        JOB_STATE_STORE_SCHEMA,
    ),
)

AUDIT_SETTINGS = command(
    "audit",
    (
        DATA_DIR,
        Setting(
            "out",
            None,
            "Directory for the audit report (JSON, Parquet, PNG, HTML).",
            parse_optional_path,
            metavar="DIR",
            meaning="directory for the report (JSON, Parquet, PNG, HTML)",
            required=True,
        ),
        _int(
            "delivery_limit",
            5,
            "Records at or over this delivery count should have been archived.",
            at_least(1),
            kafka=Kafka("group.share.delivery.count.limit", 5),
            meaning="records at or over this delivery count should have been archived: the "
            "brokers' `group.share.delivery.count.limit`",
        ),
        MASTER,
        SPARK_ENV_CACHE,
        SPARK_CLASS_CACHE,
        Setting(
            "since_last",
            False,
            "Audit only the records written since the last audit into --out (its checkpoint "
            "carries the state they need); the first run audits everything.",
            parse_bool,
            meaning="audit only the records written since the last audit into `--out`; the "
            "first run audits everything",
        ),
        JOB_STATE_STORE,
        JOB_STATE_STORE_SCHEMA,
    ),
)

# The tools that read (or import into) a state store take it as serve does: the flag,
# the setting or the environment; set, it is read instead of --data-dir.
TOOL_STATE_STORE = replace(
    _SERVE["state_store"],
    doc="serve's state_store: not set, the command works on --data-dir; a PostgreSQL URI "
    "(postgresql://USER@HOST:PORT/DB), on that PostgreSQL store instead, in one "
    "REPEATABLE READ snapshot (a running cluster's too). Its password is never shown. An "
    "empty value means not set.",
    meaning="serve's `state_store`: not set, `--data-dir`; a `postgresql://` URI, that "
    "PostgreSQL store instead, read in one snapshot; its password is never shown",
)
TOOL_STORE_SETTINGS = (TOOL_STATE_STORE, _SERVE["state_store_schema"])

LOG_DUMP_SETTINGS = command(
    "log dump",
    (
        DATA_DIR,
        *TOOL_STORE_SETTINGS,
        _int("partition", None, "Only this state partition.", at_least(0), metavar="P"),
        Setting("json", False, "One JSON object per record.", parse_bool),
    ),
)

LOG_VERIFY_SETTINGS = command("log verify", (DATA_DIR, *TOOL_STORE_SETTINGS))

STATE_GET_SETTINGS = command(
    "state get",
    (
        Setting(
            "url",
            None,
            "Base URL of a daemon, e.g. http://127.0.0.1:9095 (HOST:PORT means http).",
            parse_url,
            metavar="URL",
            required=True,
        ),
        Setting("group", None, "Group id.", str, non_empty, metavar="G", required=True),
        Setting(
            "topic",
            None,
            "Topic id (22-char or RFC 4122 form).",
            str,
            topic_id,
            metavar="T",
            required=True,
        ),
        _int("partition", None, "Partition.", between(0, INT32_MAX), metavar="P", required=True),
        Setting(
            "timeout_s",
            10.0,
            "Seconds to wait for the daemon to accept the connection and to answer.",
            parse_float,
            positive,
            metavar="SECONDS",
        ),
        _file("token_file", "File holding the bearer token."),
        _file("cacert", "CA certificate (PEM) to verify the daemon's TLS certificate."),
        _file("cert", "Client certificate (PEM) for mutual TLS."),
        _file("key", "Client private key (PEM) for mutual TLS."),
    ),
)

# The node a data directory belongs to, for the partition commands: DATA/ASSIGNMENT
# says so once a daemon of this version ran there; until then it must be given.
_PARTITION_NODE = _int(
    "node_id",
    None,
    "The node the data directory belongs to; needed only while it does not record one "
    "(DATA/ASSIGNMENT, written by the daemon), and checked against it otherwise.",
    between(0, INT32_MAX),
)

PARTITION_EXPORT_SETTINGS = command(
    "partition export",
    (
        DATA_DIR,
        *TOOL_STORE_SETTINGS,
        _int(
            "partition",
            None,
            "The state partition to export.",
            at_least(0),
            metavar="P",
            required=True,
        ),
        Setting(
            "out",
            None,
            "A new (or empty) directory to write the export into.",
            parse_optional_path,
            metavar="DIR",
            required=True,
        ),
    ),
)

PARTITION_IMPORT_SETTINGS = command(
    "partition import",
    (
        DATA_DIR,
        *TOOL_STORE_SETTINGS,
        Setting(
            "source",
            None,
            "The directory `sharecoord partition export` wrote.",
            parse_optional_path,
            flag="--from",
            metavar="DIR",
            required=True,
        ),
        _PARTITION_NODE,
    ),
)

PARTITION_ADOPT_SETTINGS = command(
    "partition adopt",
    (
        DATA_DIR,
        Setting(
            "partition",
            None,
            'The state partitions to adopt: a number or a list, "3,5-7".',
            parse_partition_list,
            metavar="LIST",
            required=True,
        ),
        _PARTITION_NODE,
    ),
)

CLUSTER_STATUS_SETTINGS = command(
    "cluster status",
    (
        replace(
            _SERVE["state_store"],
            doc="The cluster's PostgreSQL store, as its nodes were given it "
            "(postgresql://USER@HOST:PORT/DB, multi-host form included); its password is "
            "never shown.",
            meaning="the cluster's PostgreSQL store, the URI its nodes were given; its "
            "password is never shown",
            required=True,
        ),
        _SERVE["state_store_schema"],
        replace(
            _SERVE["lease_ms"],
            doc="The nodes' lease_ms: a node whose last heartbeat is older is shown dead.",
            meaning="the nodes' `lease_ms`: a node whose last heartbeat is older is dead",
        ),
        replace(
            _SERVE["state_store_timeout_ms"],
            doc="The most connecting and each statement may take.",
            meaning="the most connecting and each statement may take",
        ),
        Setting(
            "json",
            False,
            "One JSON object (GET /v1/admin/cluster's answer) instead of the table.",
            parse_bool,
        ),
    ),
)
