"""The Spark jobs' reads of the PostgreSQL store (docs/design.md#the-spark-jobs-on-postgresql):
a state partition's records as the jobs take them, read by a task with COPY out.

A task connects itself (the driver, psycopg, is on the executors: the `postgres` extra
of the environment they run) and reads one state partition in one REPEATABLE READ
transaction, so what it reads is one moment of the store however the leader, a prune
or a compaction change it meanwhile:

* for the audit and the data source: the history below the partition's watermark and
  the log at and above it (persistence/postgres/history.py says why that is the whole
  log, each record once), in offset order;
* for compaction: the log below the end it saw, with the leader's epoch then.

Rows come out as binary COPY (``cursor.copy``): a few microseconds a row, the fold and
the decoding then in Python as over the local store (spark_jobs/fold.py,
spark_jobs/columns.py). A store is named by a ``StoreRef`` (URI and schema), plain
data that Spark ships to the tasks (spark_jobs/storeref.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa

from persistence import LogError
from persistence.postgres import history
from persistence.postgres.connection import connect, unavailable
from persistence.postgres.schema import SCHEMA_VERSION, StoreFacts, Tables, read_facts
from spark_jobs.logsource import to_batches
from spark_jobs.sealed import RawRecord
from spark_jobs.storeref import StoreRef

_COPY_TYPES = ["int8", "int8", "int2", "bytea", "bytea"]
_COLUMNS = '"offset", "timestamp", record_type, key, value'


def tables_of(store: StoreRef) -> Tables:
    return Tables(store.schema)


def connect_to(store: StoreRef) -> psycopg.Connection[Any]:
    """A connection (autocommit); StoreUnavailableError, one line, if none."""
    return connect(store.uri)


def store_facts(store: StoreRef) -> StoreFacts:
    """The store's number of partitions and history retention; LogError (one line)
    where the schema holds no sharecoord store."""
    with connect_to(store) as conn:
        try:
            facts = read_facts(conn, tables_of(store))
        except psycopg.Error as exc:
            raise unavailable(exc, store.uri, "reading the store's schema") from None
    if facts is None:
        raise LogError(
            f"PostgreSQL store {store}: no sharecoord store there (no "
            f"{store.schema}.sharecoord_schema table): start a node on it first, or "
            "give the schema its nodes use (--state-store-schema)"
        )
    if facts.version != SCHEMA_VERSION:
        newer = facts.version > SCHEMA_VERSION
        raise LogError(
            f"PostgreSQL store {store}: its tables are at version {facts.version}, "
            + (
                f"newer than this sharecoord knows ({SCHEMA_VERSION}): run a newer sharecoord"
                if newer
                else f"this sharecoord needs {SCHEMA_VERSION}: upgrade the nodes first "
                "(a node of this version brings the tables up to date as it starts)"
            )
        )
    return facts


def copy_rows(
    conn: psycopg.Connection[Any], query: Any, params: tuple[Any, ...]
) -> list[RawRecord]:
    """The rows of ``query`` (offset, timestamp, record type, key, value) by binary COPY."""
    statement = psycopg.sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)
    records: list[RawRecord] = []
    append = records.append
    with conn.cursor() as cur, cur.copy(statement, params) as copy:
        copy.set_types(_COPY_TYPES)
        for offset, timestamp, record_type, key, value in copy.rows():
            append((offset, timestamp, record_type, key, value))
    return records


def read_partition(
    store: StoreRef, partition: int, after: int = -1, *, with_history: bool = True
) -> list[RawRecord]:
    """Every record of ``partition`` above ``after``, in offset order: the history below
    its watermark and the log at and above it (the log alone if not ``with_history``)."""
    tables = tables_of(store)
    with connect_to(store) as conn:
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                mark = history.watermark(conn, tables, partition) if with_history else 0
                query = tables.sql(
                    f"""SELECT {_COLUMNS} FROM {{history}}
                          WHERE state_partition = %s AND "offset" > %s AND "offset" < %s
                        UNION ALL
                        SELECT {_COLUMNS} FROM {{records}}
                          WHERE state_partition = %s AND "offset" > %s AND "offset" >= %s
                        ORDER BY 1"""
                )
                return copy_rows(conn, query, (partition, after, mark, partition, after, mark))
        except psycopg.Error as exc:
            raise unavailable(exc, store.uri, f"reading state partition {partition}") from None


def read_partition_batches(
    store: StoreRef, partition: int, after: int = -1, *, with_history: bool = True
) -> Iterator[pa.RecordBatch]:
    """``read_partition`` as the data source's Arrow batches."""
    yield from to_batches(
        read_partition(store, partition, after, with_history=with_history), partition
    )


@dataclass(frozen=True)
class LogBelow:
    """What a compaction read of one partition saw: its log below ``end`` (the end
    then), under ``epoch``; ``count`` and ``offset_sum`` let the swap check that the
    log below ``end`` is still exactly what was read."""

    epoch: int
    end: int
    records: list[RawRecord]

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def offset_sum(self) -> int:
        return sum(r[0] for r in self.records)


def read_log_below_end(store: StoreRef, partition: int) -> LogBelow:
    """The partition's whole log as it is now, with its leader's epoch."""
    tables = tables_of(store)
    with connect_to(store) as conn:
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                row = conn.execute(
                    tables.sql("SELECT epoch FROM {leaders} WHERE state_partition = %s"),
                    (partition,),
                ).fetchone()
                epoch = 0 if row is None else int(row[0])
                query = tables.sql(
                    f"""SELECT {_COLUMNS} FROM {{records}} WHERE state_partition = %s
                        ORDER BY "offset\""""
                )
                records = copy_rows(conn, query, (partition,))
        except psycopg.Error as exc:
            raise unavailable(exc, store.uri, f"reading state partition {partition}") from None
    end = records[-1][0] + 1 if records else 0
    return LogBelow(epoch, end, records)


# Bytes a row takes, about, for grouping state partitions into tasks.
ROW_BYTES = 120


def partition_sizes(store: StoreRef) -> dict[int, int]:
    """About how many bytes each state partition's rows take (log and history), by the
    row counts: for grouping state partitions into tasks."""
    tables = tables_of(store)
    with connect_to(store) as conn:
        try:
            rows = conn.execute(
                tables.sql(
                    """SELECT state_partition, count(*) FROM (
                           SELECT state_partition FROM {records}
                           UNION ALL SELECT state_partition FROM {history}) AS everything
                       GROUP BY state_partition"""
                )
            ).fetchall()
        except psycopg.Error as exc:
            raise unavailable(exc, store.uri, "counting the rows") from None
    return {int(p): int(n) * ROW_BYTES for p, n in rows}
