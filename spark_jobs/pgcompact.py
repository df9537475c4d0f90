"""Compaction on the PostgreSQL store (docs/design.md#the-spark-jobs-on-postgresql):
each state partition's log, as it is when its task reads it, folded into one
ShareSnapshot per live key (spark_jobs/fold.py, the fold of the local store) and
swapped in by one transaction while the leader keeps serving.

A task per few state partitions (session.TASKS_PER_CORE); for each partition:

1. read (spark_jobs/pgsource.py): the whole log in one REPEATABLE READ transaction,
   and the leader's epoch then; the log's end then is the compaction's watermark;
2. fold it, outside any transaction: a claim or a prune waits for nothing meanwhile;
3. swap, in one transaction: take the partition's compaction/prune lock
   (persistence/postgres/history.py) and its leaders row FOR SHARE (a claim waits until
   the commit); refuse, changing nothing, if the epoch moved or if the log below the
   watermark holds a record that was not read; if a prune took records away meanwhile
   (a prefix, redundant for every key), fold again from what is left; then, when the
   store keeps a history, copy the log below the watermark into it; delete the log
   below the watermark; COPY the folded records in; point each folded key's
   sharecoord_keys row at its folded snapshot (a newer snapshot of the leader's is
   left alone); drop the keys rows left without records; COMMIT.

The leader appends above the watermark all along (its commits lock the leaders row FOR
SHARE too, so they run beside the swap); its state does not change, as the fold replays
to the same state. A SIGKILL anywhere leaves each partition before or after its swap.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from persistence import LogError
from persistence.postgres import copyin, history
from persistence.postgres.connection import unavailable
from persistence.postgres.schema import declare_history
from persistence.postgres.store import delete_bare_keys
from protocol.records import SNAPSHOT_RECORD_TYPE, RecordDecodeError
from spark_jobs.columns import collector_paused
from spark_jobs.fold import FoldResult, fold_records
from spark_jobs.pgsource import (
    LogBelow,
    connect_to,
    read_log_below_end,
    store_facts,
    tables_of,
)
from spark_jobs.sealed import RawRecord
from spark_jobs.session import Progress, task_count
from spark_jobs.storeref import StoreRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_OK = 0
EXIT_FAILURE = 1

NOTHING_TO_GAIN = "already compacted: nothing to gain"


@dataclass
class PgPartitionCompaction:
    """What one task did to one state partition: "compacted", "skipped", "refused" (a
    race lost: nothing changed) or "failed"."""

    partition: int
    status: str
    reason: str = ""
    watermark: int = 0
    records_before: int = 0
    records_after: int = 0
    keys: int = 0
    tombstones_dropped: int = 0
    moved_to_history: int = 0


class Refused(Exception):
    """The swap lost a race; nothing was changed."""


@collector_paused
def compact_partition(
    store: StoreRef, partition: int, tombstone_cutoff_ms: int, keep_history: bool
) -> PgPartitionCompaction:
    """Read, fold and swap one state partition; never raises for the store's or the
    log's own problems (they come back as a "failed" result)."""
    try:
        read = read_log_below_end(store, partition)
        folded = fold(read.records, tombstone_cutoff_ms)
        if len(folded.records) >= len(read.records):
            return PgPartitionCompaction(partition, "skipped", NOTHING_TO_GAIN, read.end)
        return swap(store, partition, read, folded, tombstone_cutoff_ms, keep_history)
    except Refused as exc:
        return PgPartitionCompaction(partition, "refused", f"{exc}; nothing changed, run again")
    except (LogError, RecordDecodeError, TypeError, ValueError) as exc:
        return PgPartitionCompaction(partition, "failed", f"{type(exc).__name__}: {exc}")


def fold(records: Sequence[RawRecord], tombstone_cutoff_ms: int) -> FoldResult:
    return fold_records(records, tombstone_cutoff_ms=tombstone_cutoff_ms)


def swap(
    store: StoreRef,
    partition: int,
    read: LogBelow,
    folded: FoldResult,
    tombstone_cutoff_ms: int,
    keep_history: bool,
) -> PgPartitionCompaction:
    """Step 3 of the module docstring: one transaction, or Refused and nothing."""
    tables = tables_of(store)
    result = PgPartitionCompaction(partition, "compacted", watermark=read.end)
    with connect_to(store) as conn:
        try:
            with conn.transaction():
                history.lock_partition(conn, tables, partition)
                row = conn.execute(
                    tables.sql("SELECT epoch FROM {leaders} WHERE state_partition = %s FOR SHARE"),
                    (partition,),
                ).fetchone()
                epoch = 0 if row is None else int(row[0])
                if epoch != read.epoch:
                    raise Refused(
                        f"the leader's epoch moved from {read.epoch} to {epoch} while it "
                        "was compacted"
                    )
                records = _still_there(conn, store, partition, read)
                if len(records) < len(read.records):
                    folded = fold(records, tombstone_cutoff_ms)  # a prune took a prefix
                if keep_history:
                    result.moved_to_history = history.move_below(conn, tables, partition, read.end)
                conn.execute(
                    tables.sql(
                        'DELETE FROM {records} WHERE state_partition = %s AND "offset" < %s'
                    ),
                    (partition, read.end),
                )
                _write(conn, store, partition, folded.records)
                delete_bare_keys(conn, tables, partition, read.end)
        except psycopg.Error as exc:
            raise LogError(
                str(unavailable(exc, store.uri, f"compacting state partition {partition}"))
            ) from None
    result.records_before = len(records)
    result.records_after = len(folded.records)
    result.keys = folded.keys
    result.tombstones_dropped = folded.tombstones_dropped
    return result


def _still_there(
    conn: psycopg.Connection[Any], store: StoreRef, partition: int, read: LogBelow
) -> list[RawRecord]:
    """The records read that are still in the log, as read: all of them, or all from
    some offset on (a prune deleted the rest, which were redundant). Refused if the log
    below the watermark is anything else (a record written there, or another
    compaction's output, which stands at offsets the read had too: so the rows' types
    and values are compared, by digest, not only their offsets)."""
    row = conn.execute(
        tables_of(store).sql(
            """SELECT count(*), min("offset"),
                      md5(string_agg(record_type::text || ':' || md5(coalesce(value, ''::bytea)),
                                     ',' ORDER BY "offset"))
               FROM {records} WHERE state_partition = %s AND "offset" < %s"""
        ),
        (partition, read.end),
    ).fetchone()
    assert row is not None
    count, first, digest = int(row[0]), row[1], row[2]
    offsets = [r[0] for r in read.records]
    start = len(offsets) if first is None else bisect.bisect_left(offsets, int(first))
    rest = read.records[start:]
    if count != len(rest) or (rest and digest != rows_digest(rest)):
        raise Refused(
            f"the log below offset {read.end} changed while it was compacted "
            f"({len(read.records)} records read, {count} there now)"
        )
    return rest


def rows_digest(records: Sequence[RawRecord]) -> str:
    """The digest _still_there's query makes of the same rows."""
    parts = ",".join(f"{r[2]}:{hashlib.md5(r[4] or b'').hexdigest()}" for r in records)
    return hashlib.md5(parts.encode()).hexdigest()


def _write(
    conn: psycopg.Connection[Any], store: StoreRef, partition: int, records: list[RawRecord]
) -> None:
    """COPY the folded records in, and point each folded snapshot's key at it."""
    if not records:
        return
    rows = ((partition, offset, kind, key, value, ts) for offset, ts, kind, key, value in records)
    copyin.copy_records(conn, tables_of(store), [copyin.encode(rows)])
    snapshots = [(r[3], r[0]) for r in records if r[2] == SNAPSHOT_RECORD_TYPE]
    if snapshots:
        keys, offsets = zip(*snapshots, strict=True)
        conn.execute(
            tables_of(store).sql(
                """UPDATE {keys} k SET since = f.since, snapshot = true
                   FROM unnest(%s::bytea[], %s::bigint[]) AS f(key, since)
                   WHERE k.state_partition = %s AND k.key = f.key AND k.since < f.since"""
            ),
            (list(keys), list(offsets), partition),
        )


# -- the driver ------------------------------------------------------------------------


def run_compaction(
    spark: SparkSession,
    store: StoreRef,
    tombstone_retention_ms: int,
    history_retention_ms: int,
    out: Progress | None = None,
) -> int:
    """The whole job over a PostgreSQL store: declare (or drop) the history, compact
    every partition, expire old history, print the summary. Returns the exit code."""
    started = time.monotonic()
    num_partitions = store_facts(store).num_partitions
    keep = history_retention_ms != 0
    _declare(store, history_retention_ms if keep else None)
    cutoff = time.time_ns() // 1_000_000 - tombstone_retention_ms
    sc = spark.sparkContext
    with out or Progress(sc, "compact") as progress:
        progress.describe(
            f"fold the log of {num_partitions} state partitions of {store}"
            + (", moving what is folded into the history table" if keep else "")
        )
        results: list[PgPartitionCompaction] = (
            sc.parallelize(range(num_partitions), task_count(sc, num_partitions))
            .map(lambda p: compact_partition(store, p, cutoff, keep))
            .collect()
        )
        for result in results:
            if result.status in ("failed", "refused"):
                progress.say(f"partition {result.partition}: {result.status}: {result.reason}")
    expired = 0
    if keep and history_retention_ms > 0:
        expired = _expire(store, num_partitions, time.time_ns() // 1_000_000 - history_retention_ms)
    if expired:
        print(f"history: expired {expired} records older than the retention")
    print(summary_line(results, time.monotonic() - started, store if keep else None))
    return EXIT_FAILURE if any(r.status in ("failed", "refused") for r in results) else EXIT_OK


def _declare(store: StoreRef, retention_ms: int | None) -> None:
    """Before the first move: from its commit on, pruning keeps what it deletes too."""
    with connect_to(store) as conn:
        try:
            declare_history(conn, tables_of(store), retention_ms)
        except psycopg.Error as exc:
            raise LogError(str(unavailable(exc, store.uri, "declaring the history"))) from None


def _expire(store: StoreRef, num_partitions: int, older_than_ms: int) -> int:
    with connect_to(store) as conn:
        try:
            return sum(
                history.expire(conn, tables_of(store), p, older_than_ms)
                for p in range(num_partitions)
            )
        except psycopg.Error as exc:
            raise LogError(str(unavailable(exc, store.uri, "expiring the history"))) from None


def summary_line(
    results: Sequence[PgPartitionCompaction], seconds: float, kept_in: StoreRef | None
) -> str:
    done = [r for r in results if r.status == "compacted"]
    counts = {s: sum(r.status == s for r in results) for s in ("skipped", "refused", "failed")}
    if kept_in is None:
        kept = "history: none kept"
    else:
        kept = (
            f"history: {sum(r.moved_to_history for r in done)} records moved to "
            f"{kept_in.schema}.sharecoord_history"
        )
    return (
        f"compaction: {len(done)} of {len(results)} partitions compacted "
        f"({counts['skipped']} skipped, {counts['refused']} refused, {counts['failed']} failed); "
        f"records {sum(r.records_before for r in done)} -> {sum(r.records_after for r in done)}; "
        f"keys {sum(r.keys for r in done)}; "
        f"tombstones dropped {sum(r.tombstones_dropped for r in done)}; {kept}; {seconds:.1f} s"
    )
