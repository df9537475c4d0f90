"""The PostgreSQL state store: the seam of persistence/store.py over the tables of
schema.py, through psycopg 3 (docs/design.md#the-postgresql-store says why that driver).

A commit cycle is one transaction, on the commit thread's own connection:

  1. lock the leaders rows of the cycle's partitions FOR SHARE and compare each epoch
     (and node) with the one this store holds for it: a partition whose epoch moved is
     left out, and its batch fails with NotLeaderError (this node no longer leads it);
     a claim (leases.py) waits for the lock, so it lands before or after the whole
     commit, never inside it;
  2. COPY the other batches' records (binary);
  3. upsert sharecoord_keys for the keys the cycle gave a snapshot, or wrote first;
  4. COMMIT. Any error of the driver or the server fails every batch of the cycle
     (StoreUnavailableError, one line): the partitions stop, and their reset asks the
     server what is durable. A connection lost during COMMIT leaves the outcome unknown
     to the store; the reset learns it (the records are there or not), but the
     answers already given said 15.
The connection is dropped after any error, and the next cycle connects again: with a
multi-host URI, to whichever host accepts writes then.

Replay reads, for each key of the partition, its records from its last snapshot on
(sharecoord_keys.since), in offset order, in one REPEATABLE READ transaction together
with the partition's end offset: the records from the oldest key's start on, one range
of the primary key, less what each key's own snapshot replaced. Everything else (read,
prune, the leases) takes a pooled connection.

A partition takes appends only with an epoch this store holds for it (``lead``, after
a claim): ``open`` and ``reset_to_durable`` check it against the leaders table and
raise NotLeaderError when it is not this node's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from persistence.errors import LogError, NotLeaderError, StoreUnavailableError
from persistence.frame import LogRecord
from persistence.postgres import copyin, history, leases
from persistence.postgres.connection import (
    Pool,
    Watchdog,
    check_uri,
    connect,
    is_usable,
    unavailable,
)
from persistence.postgres.copyin import ROW_OVERHEAD
from persistence.postgres.partition import PostgresPartition, RowBatch
from persistence.postgres.schema import Tables, prepare
from persistence.store import CycleResult
from persistence.store_uri import masked

if TYPE_CHECKING:
    from persistence.store import StateStore

_log = logging.getLogger("sharecoord.log")

# Rows a replay or a read fetches from the server at a time.
FETCH_ROWS = 5000
# What a batch committed adds to its partition: its rows' bytes, the keys it gave a
# keys row (PostgresPartition.committed).
_Written = tuple[int, Iterable[bytes]]


class PostgresStore:
    """Every state partition in one PostgreSQL schema (persistence/store.py's
    StateStore), for node `node_id`."""

    def __init__(
        self,
        uri: str,
        num_partitions: int,
        node_id: int,
        tables: Tables,
        timeout_ms: int | None = None,
    ) -> None:
        self.uri = uri
        self._num_partitions = num_partitions
        self.node_id = node_id
        self.tables = tables
        # Bounds every statement and connection attempt (connection.connect), and the
        # commit and the lease statements on a server that answers nothing (Watchdog).
        self.timeout_ms = timeout_ms
        self.watchdog = Watchdog()
        self.pool = Pool(uri, timeout_ms)
        self._partitions = [PostgresPartition(self, p) for p in range(num_partitions)]
        self._epochs: dict[int, int] = {}
        self._commit_conn: psycopg.Connection[Any] | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({masked(self.uri)}, schema {self.tables.schema})"

    @classmethod
    def open(
        cls,
        uri: str,
        num_partitions: int,
        node_id: int,
        *,
        schema: str = "public",
        timeout_ms: int | None = None,
    ) -> PostgresStore:
        """Connect, and create or upgrade the tables (schema.py). Raises LogError in one
        line for a bad URI or schema name, StoreUnavailableError when the server
        cannot be reached, MetaMismatchError for another number of partitions. With
        ``timeout_ms``, no statement or connection attempt waits longer than that
        (but a replay's, on a server that stopped answering: docs/design.md)."""
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        check_uri(uri)
        store = cls(uri, num_partitions, node_id, Tables(schema), timeout_ms)
        try:
            with store.pool.connection("creating the tables") as conn:
                prepare(conn, store.tables, num_partitions)
        except BaseException:
            store.close()
            raise
        return store

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def partition(self, partition: int) -> PostgresPartition:
        if not 0 <= partition < self._num_partitions:
            raise IndexError(f"state partition {partition} not in [0, {self._num_partitions})")
        return self._partitions[partition]

    @property
    def partitions(self) -> list[PostgresPartition]:
        return list(self._partitions)

    # -- leadership --------------------------------------------------------------------

    def lead(self, partition: int, epoch: int) -> None:
        """This node leads `partition` under `epoch` (a claim returned it): its commits
        carry that epoch from now on."""
        self._epochs[partition] = epoch

    def unlead(self, partition: int) -> None:
        """This node no longer leads `partition`: a commit carrying it is fenced."""
        self._epochs.pop(partition, None)

    def held_epoch(self, partition: int) -> int | None:
        return self._epochs.get(partition)

    def check_leader(
        self, conn: psycopg.Connection[Any], partition: int, epoch: int | None
    ) -> None:
        row = conn.execute(
            self.tables.sql("SELECT node_id, epoch FROM {leaders} WHERE state_partition = %s"),
            (partition,),
        ).fetchone()
        if row is None or epoch is None or row[0] != self.node_id or row[1] != epoch:
            found = "no row" if row is None else f"node {row[0]}, epoch {row[1]}"
            raise NotLeaderError(partition, epoch, found)

    @contextlib.contextmanager
    def connection(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit) for the lease statements (leases.py): the
        block is cut past ``timeout_ms``."""
        with self.pool.connection(doing) as conn, self._guarded(conn, doing):
            yield conn

    def _guarded(
        self, conn: psycopg.Connection[Any], doing: str
    ) -> contextlib.AbstractContextManager[None]:
        if self.timeout_ms is None:
            return contextlib.nullcontext()
        return self.watchdog.guard(conn, self.timeout_ms / 1000, self.uri, doing)

    @contextlib.contextmanager
    def transaction(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction for the block."""
        with self.pool.connection(doing) as conn, conn.transaction():
            yield conn

    @contextlib.contextmanager
    def snapshot(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a REPEATABLE READ transaction: every statement of the
        block sees the same state. A load or a read can take far longer than
        ``timeout_ms`` as a whole, so the watchdog guards each round trip instead: the
        transaction's start and end here, each statement and each fetch in the block
        (``guarded``, ``fetch``). A server that stops answering midway (frozen, or its
        host gone while a standby was promoted) fails the block within ``timeout_ms``,
        rather than leaving it waiting for ever."""
        with self.pool.connection(doing) as conn:
            tx = conn.transaction()
            with self._guarded(conn, doing):
                tx.__enter__()
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            try:
                yield conn
            except BaseException as exc:
                # The block's error is the one to tell; a rollback on a connection that
                # broke (or was cut) fails too, and the pool drops the connection.
                quiet = contextlib.suppress(psycopg.Error, StoreUnavailableError)
                with quiet, self._guarded(conn, doing):
                    tx.__exit__(type(exc), exc, exc.__traceback__)
                raise
            with self._guarded(conn, doing):
                tx.__exit__(None, None, None)

    def guarded(
        self, conn: psycopg.Connection[Any], doing: str
    ) -> contextlib.AbstractContextManager[None]:
        """One round trip on `conn`, cut past ``timeout_ms``."""
        return self._guarded(conn, doing)

    def rows(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        query: sql.Composed,
        params: Sequence[Any],
        doing: str,
    ) -> Iterator[Any]:
        """The rows of `query` through a named cursor, FETCH_ROWS per round trip, each
        round trip guarded (inside the caller's transaction)."""
        cur = conn.cursor(name=name)
        try:
            with self._guarded(conn, doing):
                cur.execute(query, params)
            while True:
                with self._guarded(conn, doing):
                    rows = cur.fetchmany(FETCH_ROWS)
                if not rows:
                    return
                yield from rows
        finally:
            quiet = contextlib.suppress(psycopg.Error, StoreUnavailableError)
            with quiet, self._guarded(conn, doing):
                cur.close()

    def claim(self, partition: int, lease_ms: int) -> int | None:
        """leases.claim for this node, and lead with the epoch it got."""
        with self.connection(f"claiming state partition {partition}") as conn:
            epoch = leases.claim(conn, self.tables, partition, self.node_id, lease_ms)
        if epoch is not None:
            self.lead(partition, epoch)
        return epoch

    # -- the commit cycle --------------------------------------------------------------

    def commit_cycle(self, batches: Sequence[tuple[int, RowBatch]]) -> CycleResult:
        parts = [self._partitions[p] for p, _ in batches]
        errors: list[BaseException | None] = [None] * len(batches)
        live: list[int] = []  # indexes of the batches to write
        for index, (part, (_, batch)) in enumerate(zip(parts, batches, strict=True)):
            if batch.generation != part.generation:
                errors[index] = LogError(f"{part!r}: batch taken before a reset")
            else:
                live.append(index)
        started = time.perf_counter()
        written: dict[int, _Written] = {}
        try:
            fenced = self._commit(batches, live, parts, written)
        except BaseException as exc:
            shared = unavailable(exc, self.uri, "commit") if isinstance(exc, psycopg.Error) else exc
            self._drop_commit_connection()
            for part in parts:
                part.fail(shared)
            return CycleResult([shared] * len(batches), shared, time.perf_counter() - started)
        seconds = time.perf_counter() - started
        for index in live:
            part, (_, batch) = parts[index], batches[index]
            if index in fenced:
                errors[index] = fenced[index]
                part.fail(fenced[index])
            else:
                part.committed(batch, *written[index])
        return CycleResult(errors, None, seconds)

    def _commit(
        self,
        batches: Sequence[tuple[int, RowBatch]],
        live: list[int],
        parts: list[PostgresPartition],
        written: dict[int, _Written],
    ) -> dict[int, NotLeaderError]:
        """One transaction (the module docstring) in three round trips: BEGIN with the
        lock of the leaders rows, the COPY, then the keys' upsert with the COMMIT (one
        pipeline). The fenced batches, by index; what each batch written adds to its
        partition into `written`. An error leaves the transaction open on the
        connection, which commit_cycle then drops (the server rolls it back)."""
        if not live:
            return {}
        conn = self._commit_connection()
        tables = self.tables
        fenced: dict[int, NotLeaderError] = {}
        with self._guarded(conn, "commit"):
            found = self._begin_locking(conn, sorted({batches[i][0] for i in live}))
            for index in live:
                partition = batches[index][0]
                held = self._epochs.get(partition)
                now = found.get(partition)
                if held is None or now != (self.node_id, held):
                    said = "no row" if now is None else f"node {now[0]}, epoch {now[1]}"
                    fenced[index] = NotLeaderError(partition, held, said)
            writing = [i for i in live if i not in fenced]
            if not writing:
                conn.execute("ROLLBACK")
                return fenced
            blocks = [copyin.encode(batches[index][1].rows) for index in writing]
            copyin.copy_records(conn, tables, blocks)
            keys: list[tuple[int, bytes, int, bool]] = []
            for index, block in zip(writing, blocks, strict=True):
                partition, batch = batches[index]
                starts = parts[index].key_starts(batch)
                keys += [(partition, key, since, snap) for key, (since, snap) in starts.items()]
                written[index] = (len(block), starts.keys())
            with conn.pipeline():
                if keys:
                    columns = [list(column) for column in zip(*keys, strict=True)]
                    conn.execute(_upsert_keys(tables), columns)
                conn.execute("COMMIT")
        return fenced

    def _begin_locking(
        self, conn: psycopg.Connection[Any], partitions: list[int]
    ) -> dict[int, tuple[int | None, int]]:
        """BEGIN, and lock the leaders rows of `partitions` FOR SHARE, in one round trip
        (a statement without parameters goes as a simple query, which may hold two):
        each partition's (node, epoch)."""
        listed = sql.SQL(", ").join(sql.Literal(int(p)) for p in partitions)
        with conn.cursor() as cur:
            cur.execute(_begin_locking(self.tables).format(partitions=listed))
            cur.nextset()  # past BEGIN's result
            return {int(p): (node, int(epoch)) for p, node, epoch in cur.fetchall()}

    def _commit_connection(self) -> psycopg.Connection[Any]:
        conn = self._commit_conn
        if conn is None or not is_usable(conn):
            self._drop_commit_connection()
            conn = self._commit_conn = connect(self.uri, timeout_ms=self.timeout_ms)
        return conn

    def _drop_commit_connection(self) -> None:
        conn, self._commit_conn = self._commit_conn, None
        if conn is not None:
            conn.close()

    # -- reading and pruning -----------------------------------------------------------

    def offsets(self, conn: psycopg.Connection[Any], partition: int) -> tuple[int, int]:
        """(log start, log end) of a partition: its lowest offset and one past its
        highest, (0, 0) with no records."""
        row = conn.execute(
            self.tables.sql(
                'SELECT min("offset"), max("offset") FROM {records} WHERE state_partition = %s'
            ),
            (partition,),
        ).fetchone()
        if row is None or row[0] is None:
            return 0, 0
        return int(row[0]), int(row[1]) + 1

    def replay_rows(self, conn: psycopg.Connection[Any], partition: int) -> Iterator[LogRecord]:
        """Each key's records from its last snapshot on, in offset order (inside a
        transaction of the caller's): the partition's records from the oldest of the
        keys' starts on (replay_sql), less each key's records below its own start."""
        doing = f"replaying state partition {partition}"
        with self._guarded(conn, doing):
            starts: dict[bytes, int] = {
                bytes(key): int(since)
                for key, since in conn.execute(
                    self.tables.sql("SELECT key, since FROM {keys} WHERE state_partition = %s"),
                    (partition,),
                )
            }
        if not starts:
            return
        start = min(starts.values())
        query = replay_sql(self.tables)
        rows = self.rows(conn, f"replay_{partition}", query, (partition, start), doing)
        for offset, timestamp, record_type, key, value in rows:
            since = starts.get(key := bytes(key))
            if since is not None and offset >= since:
                yield LogRecord(offset, timestamp, record_type, key, _bytes(value))

    def read_rows(self, partition: int, from_offset: int, end: int | None) -> Iterator[LogRecord]:
        """Every record of `partition` at or above `from_offset` (below `end`)."""
        doing = f"reading state partition {partition}"
        query = self.tables.sql(
            """SELECT "offset", "timestamp", record_type, key, value FROM {records}
                   WHERE state_partition = %s AND "offset" >= %s
                     AND "offset" < coalesce(%s, 9223372036854775807)
                   ORDER BY "offset\""""
        )
        with self.snapshot(doing) as conn:
            rows = self.rows(conn, f"read_{partition}", query, (partition, from_offset, end), doing)
            for offset, timestamp, record_type, key, value in rows:
                yield LogRecord(offset, timestamp, record_type, bytes(key), _bytes(value))

    def delete_below(self, partition: int, below: int) -> tuple[int, int, int]:
        """Delete the records of `partition` below `below`, and the keys rows left
        without records, moving them into the history first when the store keeps one
        (history.py), in one transaction: (records deleted, their keys' and values'
        bytes, records moved into the history)."""
        with self.transaction(f"pruning state partition {partition}") as conn:
            history.lock_partition(conn, self.tables, partition)
            moved = 0
            if history.history_retention(conn, self.tables) is not None:
                moved = history.move_below(conn, self.tables, partition, below)
            row = conn.execute(
                self.tables.sql(
                    """WITH gone AS (
                               DELETE FROM {records}
                               WHERE state_partition = %(p)s AND "offset" < %(below)s
                               RETURNING octet_length(key) + coalesce(octet_length(value), 0)
                                   AS size)
                           SELECT count(*), coalesce(sum(size), 0) FROM gone"""
                ),
                {"p": partition, "below": below},
            ).fetchone()
            assert row is not None
            deleted, size = int(row[0]), int(row[1])
            if deleted:
                delete_bare_keys(conn, self.tables, partition, below)
        return deleted, size + ROW_OVERHEAD * deleted, moved

    def close(self) -> None:
        for part in self._partitions:
            part.close()
        self._drop_commit_connection()
        self.pool.close()
        self.watchdog.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@functools.cache
def _upsert_keys(tables: Tables) -> sql.Composed:
    """The keys rows of a commit: a snapshot moves a key's start, a new key gets one."""
    return tables.sql(
        """INSERT INTO {keys} (state_partition, key, since, snapshot)
           SELECT * FROM unnest(%s::integer[], %s::bytea[], %s::bigint[], %s::boolean[])
           ON CONFLICT (state_partition, key) DO UPDATE
           SET since = excluded.since, snapshot = true
           WHERE excluded.snapshot"""
    )


@functools.cache
def _begin_locking(tables: Tables) -> sql.SQL:
    """BEGIN and the lock of the leaders rows, {partitions} left to fill in."""
    statement = tables.sql(
        "BEGIN; SELECT state_partition, node_id, epoch FROM {leaders} "
        "WHERE state_partition IN ({partitions}) ORDER BY state_partition FOR SHARE",
        partitions=sql.SQL("{partitions}"),
    )
    return sql.SQL(statement.as_string(None))


def replay_sql(tables: Tables) -> sql.Composed:
    """A partition's records from an offset on, in offset order: one range of the
    primary key. Its start is the oldest of the keys' last snapshots, which is where
    pruning cuts the log, so a load reads the log that is kept and nothing the history
    holds; replay_rows drops, per key, what its own last snapshot replaced. There is no
    index by key (schema version 3 dropped it): every commit paid for it, row by row,
    and a replay reads the kept log at one range anyway (docs/design.md)."""
    return tables.sql(
        """SELECT "offset", "timestamp", record_type, key, value FROM {records}
           WHERE state_partition = %s AND "offset" >= %s
           ORDER BY "offset\""""
    )


def delete_bare_keys(
    conn: psycopg.Connection[Any], tables: Tables, partition: int, below: int
) -> None:
    """Delete the keys rows (starting below `below`) none of whose records remain.
    Compaction's folded records stand below `below`, so every record of the partition
    is looked at (one range of the primary key, hashed against the keys rows)."""
    conn.execute(
        tables.sql(
            """DELETE FROM {keys} k
                   WHERE k.state_partition = %(p)s AND k.since < %(below)s
                     AND NOT EXISTS (
                       SELECT 1 FROM {records} r
                       WHERE r.state_partition = %(p)s AND r.key = k.key)"""
        ),
        {"p": partition, "below": below},
    )


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


if TYPE_CHECKING:

    def _implements_the_seam(store: PostgresStore) -> StateStore[RowBatch]:
        """mypy's check that this is a state store (persistence/store.py)."""
        return store
