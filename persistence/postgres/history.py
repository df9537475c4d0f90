"""The PostgreSQL store's history (docs/design.md#the-spark-jobs-on-postgresql):
the records compaction and pruning take out of the log, kept in sharecoord_history for
the audit, in the transaction that takes them out.

Below a partition's watermark (sharecoord_history_marks) the history holds the records
as they were written, and the log holds only what compaction folded them into (a folded
snapshot stands at the offset of its key's last record, which the history holds too:
moving it again is skipped, by the primary key). At and above the watermark the log
holds the records as written. So the history below the watermark and the log at and
above it are the whole log, and every record is in exactly one of them.

Compaction and pruning of one partition exclude each other by an advisory lock held
for their transaction (``lock_partition``): a compaction checks what it read against
what is there under that lock.
"""

from __future__ import annotations

import zlib
from typing import Any

import psycopg

from persistence.postgres.schema import Tables


def lock_partition(conn: psycopg.Connection[Any], tables: Tables, partition: int) -> None:
    """Hold, until the transaction ends, the lock that compaction and pruning of
    ``partition`` take before they move or delete its records."""
    lock_id = zlib.crc32(f"sharecoord log {tables.schema} {partition}".encode())
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_id,))


def history_retention(conn: psycopg.Connection[Any], tables: Tables) -> int | None:
    """The store's history retention (ms, -1 for ever), None if it keeps no history."""
    row = conn.execute(tables.sql("SELECT history_retention_ms FROM {version}")).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def move_below(conn: psycopg.Connection[Any], tables: Tables, partition: int, below: int) -> int:
    """Copy the partition's records below ``below`` into the history (those it holds
    already are skipped) and raise its watermark to ``below``; the caller deletes them
    from the log in the same transaction. Returns the records copied."""
    moved = conn.execute(
        tables.sql(
            """INSERT INTO {history}
                   SELECT state_partition, "offset", record_type, key, value, "timestamp"
                   FROM {records}
                   WHERE state_partition = %s AND "offset" < %s
               ON CONFLICT (state_partition, "offset") DO NOTHING"""
        ),
        (partition, below),
    ).rowcount
    conn.execute(
        tables.sql(
            """INSERT INTO {history_marks} (state_partition, watermark) VALUES (%s, %s)
               ON CONFLICT (state_partition) DO UPDATE
               SET watermark = greatest({history_marks}.watermark, excluded.watermark)"""
        ),
        (partition, below),
    )
    return max(0, moved)


def watermark(conn: psycopg.Connection[Any], tables: Tables, partition: int) -> int:
    """The partition's watermark: 0 while nothing was moved into the history."""
    row = conn.execute(
        tables.sql("SELECT watermark FROM {history_marks} WHERE state_partition = %s"),
        (partition,),
    ).fetchone()
    return 0 if row is None else int(row[0])


def expire(
    conn: psycopg.Connection[Any], tables: Tables, partition: int, older_than_ms: int
) -> int:
    """Delete the partition's history records with a timestamp below ``older_than_ms``
    (its watermark stays: what is below it in the log is still folded)."""
    return max(
        0,
        conn.execute(
            tables.sql(
                """DELETE FROM {history}
                   WHERE state_partition = %s AND "timestamp" < %s"""
            ),
            (partition, older_than_ms),
        ).rowcount,
    )
