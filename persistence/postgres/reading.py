"""Reading a PostgreSQL store without changing it, in one snapshot: what ``log dump``,
``log verify`` and ``partition export`` read (server/postgres_tools.py).

``read_snapshot`` opens one connection and one REPEATABLE READ, READ ONLY transaction:
every statement of the block sees the store as it was at its first statement, whatever
the nodes of a running cluster commit meanwhile (a commit cycle writes its records and
its keys rows in one transaction, so the snapshot holds both or neither). Nothing is
created: a schema with no sharecoord tables is ``NotAStoreError``, not a store made on
the spot as a node's start would make it. No statement timeout is set (a dump of a big
store is long on purpose); connecting is bounded as for any connection
(connection.connect).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from persistence.errors import LogError
from persistence.frame import LogRecord
from persistence.postgres.connection import check_uri, connect, unavailable
from persistence.postgres.schema import PREFIX, Tables
from persistence.store_uri import masked

FETCH_ROWS = 5000
TABLES = ("schema", "records", "keys", "leaders", "nodes")


class NotAStoreError(LogError):
    """The schema holds no sharecoord tables: a wrong URI or schema, not damage."""


@dataclass(frozen=True)
class KeyRow:
    key: bytes
    since: int
    snapshot: bool


@dataclass
class StoreSnapshot:
    """One REPEATABLE READ, READ ONLY transaction on a store (the module docstring)."""

    conn: psycopg.Connection[Any]
    tables: Tables
    uri: str
    missing_tables: tuple[str, ...]  # of TABLES, with the prefix left off
    # From sharecoord_schema; None when that row cannot be read (verify says why).
    version: int | None
    num_partitions: int | None

    @property
    def where(self) -> str:
        """The store as a person reads it: the URI masked, and the schema."""
        return f"{masked(self.uri)} (schema {self.tables.schema})"

    def table(self, name: str) -> str:
        return f"{self.tables.schema}.{PREFIX}{name}"

    def offsets(self, partition: int) -> tuple[int, int, int]:
        """(lowest offset, one past the highest, record count) of a partition; (0, 0, 0)
        with no records."""
        row = self.conn.execute(
            self.tables.sql(
                'SELECT min("offset"), max("offset"), count(*) FROM {records} '
                "WHERE state_partition = %s"
            ),
            (partition,),
        ).fetchone()
        if row is None or row[0] is None:
            return 0, 0, 0
        return int(row[0]), int(row[1]) + 1, int(row[2])

    def records(self, partition: int) -> Iterator[LogRecord]:
        """Every record of a partition, in offset order."""
        with self.conn.cursor(name=f"records_{partition}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(
                self.tables.sql(
                    """SELECT "offset", "timestamp", record_type, key, value FROM {records}
                       WHERE state_partition = %s ORDER BY "offset\""""
                ),
                (partition,),
            )
            for offset, timestamp, record_type, key, value in cur:
                yield LogRecord(
                    int(offset),
                    int(timestamp),
                    int(record_type),
                    bytes(key),
                    None if value is None else bytes(value),
                )

    def key_rows(self, partition: int) -> Iterator[KeyRow]:
        """The partition's sharecoord_keys rows."""
        with self.conn.cursor(name=f"keys_{partition}") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(
                self.tables.sql(
                    "SELECT key, since, snapshot FROM {keys} WHERE state_partition = %s "
                    "ORDER BY key"
                ),
                (partition,),
            )
            for key, since, snapshot in cur:
                yield KeyRow(bytes(key), int(since), bool(snapshot))

    def compacted_below(self, partition: int) -> int | None:
        """The partition's compaction watermark, where the store records one
        (``sharecoord_history_marks``, kept by compaction with a history): below it
        the log holds only what compaction folded the records into."""
        if not self._has_marks:
            return None
        row = self.conn.execute(
            self.tables.sql(
                "SELECT watermark FROM {marks} WHERE state_partition = %s",
                marks=self.tables.name("history_marks"),
            ),
            (partition,),
        ).fetchone()
        return None if row is None else int(row[0])

    @property
    def _has_marks(self) -> bool:
        row = self.conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (self.table("history_marks"),)
        ).fetchone()
        return bool(row and row[0])

    def partitions_with_rows(self, table: str) -> list[int]:
        """The distinct state partitions of a table's rows."""
        rows = self.conn.execute(
            self.tables.sql(
                "SELECT DISTINCT state_partition FROM {table} ORDER BY 1",
                table=self.tables.name(table),
            )
        ).fetchall()
        return [int(p) for (p,) in rows]


def present_tables(conn: psycopg.Connection[Any], tables: Tables) -> set[str]:
    """Which of TABLES exist in the schema (names without the prefix)."""
    found = set()
    for name in TABLES:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{tables.schema}.{PREFIX}{name}",)
        ).fetchone()
        if row is not None and row[0]:
            found.add(name)
    return found


@contextlib.contextmanager
def read_snapshot(uri: str, schema: str) -> Iterator[StoreSnapshot]:
    """The store in one snapshot (the module docstring). Raises LogError in one line for
    a URI libpq cannot parse or a bad schema name, NotAStoreError for a schema with no
    sharecoord table, StoreUnavailableError when the server cannot be reached or a
    statement fails (the password masked)."""
    check_uri(uri)
    tables = Tables(schema)
    conn = connect(uri)
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            present = present_tables(conn, tables)
            if not present:
                raise NotAStoreError(
                    f"PostgreSQL store {masked(uri)}: schema {schema} holds no sharecoord "
                    "tables: no node has started on it (or give its --state-store-schema)"
                )
            version = num_partitions = None
            if "schema" in present:
                row = conn.execute(
                    tables.sql("SELECT version, num_partitions FROM {version}")
                ).fetchone()
                if row is not None:
                    version, num_partitions = int(row[0]), int(row[1])
            missing = tuple(name for name in TABLES if name not in present)
            yield StoreSnapshot(conn, tables, uri, missing, version, num_partitions)
    except psycopg.Error as exc:
        raise unavailable(exc, uri, "reading the store") from None
    finally:
        conn.close()
