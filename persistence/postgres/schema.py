"""The PostgreSQL store's tables, created and upgraded by the store itself.

Every table lives in one schema (a constructor argument, ``public`` by default) and
has the ``sharecoord_`` prefix, so a database shared with other applications names
nothing of theirs::

    sharecoord_schema   one row: the schema version, and the number of state partitions
                        (fixed for a store, as DATA/meta fixes it for a data directory)
    sharecoord_records  state_partition, offset, record_type, key, value, timestamp:
                        the log, one row per record; primary key (state_partition, offset)
    sharecoord_keys     state_partition, key, since, snapshot: where each key's replay
                        starts: its last snapshot's offset (snapshot = true), or its
                        first record's while it has none; written in the commit's own
                        transaction
    sharecoord_leaders  state_partition, node_id, epoch, lease_expiry: who leads each
                        state partition, under which epoch, until when (PostgreSQL's
                        clock); a row per partition from the start, epoch 0, no leader
    sharecoord_nodes    node_id, http_listener, kafka_listener, last_heartbeat,
                        lease_ms: the node's lease (version 3; NULL from an older node)
    sharecoord_history  the records compaction and pruning took out of the log (same
                        columns as sharecoord_records, same primary key), while the
                        store keeps a history (version 2)
    sharecoord_history_marks  state_partition, watermark: below it the history holds
                        the partition's records as written, and the log only what
                        compaction folded them into (version 2)

``sharecoord_schema.history_retention_ms`` (version 2) says whether the store keeps a
history: NULL, none; -1, for ever; else how long (by the records' timestamps) the
compaction job keeps it. The compaction job sets it; pruning reads it in the
transaction that deletes, and moves the rows into the history there.

Why each index exists (docs/design.md#the-postgresql-store):

* records (state_partition, offset), the primary key: a partition's records in order
  (``read``, the end offset as max(offset)), pruning deletes a range of it, and a
  replay reads one range of it: from the oldest key's ``since`` on.
* keys (state_partition, key), the primary key: the commit's upsert, and the replay's
  walk over a partition's keys.
There is no index on records by key: version 1 had one, and version 3 dropped it, as
every commit paid for it row by row (docs/design.md says by how much).
* leaders (state_partition), the primary key: the commit locks the rows of its
  partitions by it (FOR SHARE), a claim updates one row by it.
* nodes (node_id), the primary key: a heartbeat upserts its row.
* history (state_partition, offset), the primary key: a record is moved into the
  history once (a folded record that stands at an exported offset is not: the insert
  skips the conflict), and the audit reads a partition's history in offset order.
There is no index on leaders.node_id: renewing a node's leases reads a table of
num_partitions rows (50 by default), which a sequential scan reads faster than an
index would.

Creating and upgrading run in one transaction under an advisory lock, so nodes
starting together create the tables once. A store whose version is newer than this
code knows is refused (one line); an older one is brought up to date, step by step.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from persistence.errors import LogError, MetaMismatchError

SCHEMA_VERSION = 3
PREFIX = "sharecoord_"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


@dataclass(frozen=True)
class Tables:
    """The qualified names of the store's tables in one schema."""

    schema: str

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.schema):
            raise LogError(
                f"schema name {self.schema!r} must be lower-case letters, digits and _ "
                "(not starting with a digit), at most 41 characters"
            )

    def name(self, table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(PREFIX + table))

    @property
    def records(self) -> sql.Composed:
        return self.name("records")

    @property
    def keys(self) -> sql.Composed:
        return self.name("keys")

    @property
    def leaders(self) -> sql.Composed:
        return self.name("leaders")

    @property
    def nodes(self) -> sql.Composed:
        return self.name("nodes")

    @property
    def version(self) -> sql.Composed:
        return self.name("schema")

    @property
    def history(self) -> sql.Composed:
        return self.name("history")

    @property
    def history_marks(self) -> sql.Composed:
        return self.name("history_marks")

    def sql(self, template: str, **names: Any) -> sql.Composed:
        """``template`` with {records}, {keys}, {leaders}, {nodes}, {version}, {schema}
        filled in as identifiers (and any other name given)."""
        return sql.SQL(template).format(
            records=self.records,
            keys=self.keys,
            leaders=self.leaders,
            nodes=self.nodes,
            version=self.version,
            history=self.history,
            history_marks=self.history_marks,
            schema=sql.Identifier(self.schema),
            **names,
        )


# Step n brings a store from version n to n + 1.
_STEPS: list[list[str]] = [
    [
        """CREATE TABLE {records} (
            state_partition integer NOT NULL,
            "offset" bigint NOT NULL,
            record_type smallint NOT NULL,
            key bytea NOT NULL,
            value bytea,
            "timestamp" bigint NOT NULL,
            PRIMARY KEY (state_partition, "offset"))""",
        """CREATE INDEX {records_by_key} ON {records} (state_partition, key, "offset")""",
        """CREATE TABLE {keys} (
            state_partition integer NOT NULL,
            key bytea NOT NULL,
            since bigint NOT NULL,
            snapshot boolean NOT NULL,
            PRIMARY KEY (state_partition, key))""",
        """CREATE TABLE {leaders} (
            state_partition integer PRIMARY KEY,
            node_id integer,
            epoch bigint NOT NULL DEFAULT 0,
            lease_expiry timestamptz)""",
        """CREATE TABLE {nodes} (
            node_id integer PRIMARY KEY,
            http_listener text,
            kafka_listener text,
            last_heartbeat timestamptz NOT NULL)""",
    ],
    [
        """CREATE TABLE {history} (
            state_partition integer NOT NULL,
            "offset" bigint NOT NULL,
            record_type smallint NOT NULL,
            key bytea NOT NULL,
            value bytea,
            "timestamp" bigint NOT NULL,
            PRIMARY KEY (state_partition, "offset"))""",
        """CREATE TABLE {history_marks} (
            state_partition integer PRIMARY KEY,
            watermark bigint NOT NULL)""",
        "ALTER TABLE {version} ADD COLUMN history_retention_ms bigint",
    ],
    [
        # Every commit paid for this index row by row (about a third of a commit
        # cycle's time in PostgreSQL); a replay reads the kept log as one range of the
        # primary key instead (store.replay_sql).
        "DROP INDEX IF EXISTS {schema}.{records_by_key}",
        # A node's own lease, so that whoever reads the nodes table judges it by it.
        "ALTER TABLE {nodes} ADD COLUMN lease_ms integer",
    ],
]


def prepare(conn: psycopg.Connection[Any], tables: Tables, num_partitions: int) -> None:
    """Create the tables, or bring them up to SCHEMA_VERSION, and a leaders row per
    state partition; refuse a store of another number of partitions or a newer
    version. One transaction, under an advisory lock named after the schema."""
    lock_id = zlib.crc32(f"sharecoord schema {tables.schema}".encode())
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id,))
        conn.execute(tables.sql("CREATE SCHEMA IF NOT EXISTS {schema}"))
        found = conn.execute(
            "SELECT to_regclass(%s)", (f"{tables.schema}.{PREFIX}schema",)
        ).fetchone()
        if found is None or found[0] is None:
            conn.execute(
                tables.sql(
                    """CREATE TABLE {version} (
                        one boolean PRIMARY KEY DEFAULT true CHECK (one),
                        version integer NOT NULL,
                        num_partitions integer NOT NULL)"""
                )
            )
            conn.execute(
                tables.sql("INSERT INTO {version} (version, num_partitions) VALUES (0, %s)"),
                (num_partitions,),
            )
        row = conn.execute(
            tables.sql("SELECT version, num_partitions FROM {version} FOR UPDATE")
        ).fetchone()
        assert row is not None
        version, recorded_partitions = int(row[0]), int(row[1])
        where = f"the PostgreSQL store's schema {tables.schema}"
        if version > SCHEMA_VERSION:
            raise LogError(
                f"{where} is at version {version}, newer than this sharecoord knows "
                f"({SCHEMA_VERSION}): run a newer sharecoord"
            )
        if recorded_partitions != num_partitions:
            raise MetaMismatchError(
                f"{where} was created with num_partitions={recorded_partitions}; refusing "
                f"to open it with num_partitions={num_partitions}: the number of state "
                "partitions is fixed for a store"
            )
        for step in _STEPS[version:]:
            for statement in step:
                conn.execute(
                    tables.sql(statement, records_by_key=sql.Identifier(PREFIX + "records_by_key"))
                )
        if version < SCHEMA_VERSION:
            conn.execute(tables.sql("UPDATE {version} SET version = %s"), (SCHEMA_VERSION,))
        conn.execute(
            tables.sql(
                "INSERT INTO {leaders} (state_partition) SELECT generate_series(0, %s - 1) "
                "ON CONFLICT (state_partition) DO NOTHING"
            ),
            (num_partitions,),
        )


def schema_version(conn: psycopg.Connection[Any], tables: Tables) -> int:
    row = conn.execute(tables.sql("SELECT version FROM {version}")).fetchone()
    assert row is not None
    return int(row[0])


@dataclass(frozen=True)
class StoreFacts:
    """What a store's sharecoord_schema row says besides its version."""

    version: int
    num_partitions: int
    history_retention_ms: int | None  # None: the store keeps no history


def read_facts(conn: psycopg.Connection[Any], tables: Tables) -> StoreFacts | None:
    """The store's facts, None where the schema holds no sharecoord store (no daemon
    ever started on it)."""
    found = conn.execute("SELECT to_regclass(%s)", (f"{tables.schema}.{PREFIX}schema",)).fetchone()
    if found is None or found[0] is None:
        return None
    row = conn.execute(tables.sql("SELECT num_partitions FROM {version}")).fetchone()
    if row is None:
        return None
    num_partitions = int(row[0])
    version = schema_version(conn, tables)
    if version < 2:
        return StoreFacts(version, num_partitions, None)
    retention = conn.execute(tables.sql("SELECT history_retention_ms FROM {version}")).fetchone()
    assert retention is not None
    kept = None if retention[0] is None else int(retention[0])
    return StoreFacts(version, num_partitions, kept)


def declare_history(
    conn: psycopg.Connection[Any], tables: Tables, retention_ms: int | None
) -> None:
    """Keep a history (for ``retention_ms``, -1 for ever), or none (None): from the
    commit of this on, pruning moves what it deletes into the history, or not."""
    conn.execute(tables.sql("UPDATE {version} SET history_retention_ms = %s"), (retention_ms,))
