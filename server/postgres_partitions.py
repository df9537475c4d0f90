"""``sharecoord partition export`` from a PostgreSQL store and ``partition import`` into
one (docs/operations.md#moving-state-between-a-data-directory-and-postgresql): how a
data directory's state moves to a cluster on PostgreSQL, and back. The export directory
and its ``EXPORT`` manifest are those of a data directory's export
(server/export_manifest.py): segments of frames, so either kind of store imports what
either exported.

**export** reads the partition in one REPEATABLE READ snapshot (the cluster keeps
serving it: what it commits after the snapshot is not in the export, and nothing marks
the partition as moved), verifies it first as ``log verify`` does
(server/postgres_verify.py; a damaged partition is not exported), writes its records as
frames into segments rolled at serve's default ``segment_bytes`` in ``OUT.partial``,
the manifest, renames it to ``OUT`` and reads the copy back (``check_export``). Its
``source_node`` is the partition's last leader.

**import** checks, before it writes anything, the manifest (exit 2), the export's bytes
(every segment, frame and record: exit 1), then, in one transaction on the store:

1. the tables, created if the schema has none yet (as a node's first start would, with
   the export's partition count; a store of another count is refused);
2. the partition's ``sharecoord_leaders`` row, locked (FOR UPDATE: a claim waits for
   it): a live lease refuses the import (a node leads it and would not know of the
   records: stop the nodes, whose clean stop releases their leases, or wait for the
   lease to run out);
3. the partition's records: none, or the import is refused as the data directory's
   import refuses a partition with records (it never overwrites one) — unless they are
   this very export's records, row for row: an import of it finished before, and
   nothing is done;
4. the export's records COPYed in, each key's ``sharecoord_keys`` row written (its last
   snapshot's offset, or its first record's), and the partition's epoch raised by one,
   so that a node that led it before can commit nothing more to it (every commit checks
   the epoch); the next claim loads the imported records;
5. COMMIT. A refusal, an error or a kill before it leaves the store as it was (a schema
   created in step 1 included): run the same import again.

A history the export carries (Parquet files of what compaction folded away on a data
directory) is not imported: it stays in the export, and the command says so.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from persistence import FileOps, LogRecord, read_partition
from persistence.errors import LogError, MetaMismatchError, StoreUnavailableError
from persistence.frame import encode_frame_into
from persistence.ownership import now_ms
from persistence.postgres import copyin
from persistence.postgres.connection import check_uri, connect, unavailable
from persistence.postgres.copyin import Row
from persistence.postgres.schema import Tables, prepare
from persistence.segments import segment_name
from persistence.store_uri import masked
from protocol.records import SNAPSHOT_RECORD_TYPE
from server.config import SERVE_SETTINGS
from server.export_manifest import ExportManifest, SegmentCopy
from server.partition_tools import (
    EXIT_FAILURE,
    EXIT_USAGE,
    ToolError,
    check_export,
    load_export,
    publish_export,
    remove_tree,
)
from server.postgres_tools import StoreToolError, snapshot_of
from server.postgres_verify import verify_partition

SEGMENT_BYTES: int = next(s.default for s in SERVE_SETTINGS if s.name == "segment_bytes")
COPY_BLOCK_ROWS = 5000  # records encoded per block of the COPY


@dataclass(frozen=True)
class PostgresExport:
    manifest: ExportManifest
    where: str  # the store, as shown
    leader: int | None  # the partition's last leader


def export_from_postgres(
    uri: str, schema: str, partition: int, out: str, *, fs: FileOps | None = None
) -> PostgresExport:
    fs = fs or FileOps()
    out = os.path.abspath(out)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ToolError(EXIT_USAGE, f"--out {out} exists and is not an empty directory")
    if not os.path.isdir(os.path.dirname(out)):
        raise ToolError(EXIT_USAGE, f"--out {out}: {os.path.dirname(out)} is not a directory")
    try:
        with snapshot_of(uri, schema) as store:
            num_partitions = store.num_partitions
            if num_partitions is None or store.missing_tables:
                raise ToolError(
                    EXIT_FAILURE, f"the store {store.where} is damaged: `sharecoord log verify` it"
                )
            if not 0 <= partition < num_partitions:
                raise ToolError(
                    EXIT_USAGE, f"--partition {partition} is out of range 0..{num_partitions - 1}"
                )
            check = verify_partition(store, partition)
            if not check.ok:
                first = (check.damage or [f"does not replay {check.unreplayable}"])[0]
                raise ToolError(
                    EXIT_FAILURE,
                    f"state partition {partition} of {store.where} is damaged: {first}; "
                    "`sharecoord log verify` says all",
                )
            row = store.conn.execute(
                store.tables.sql("SELECT node_id FROM {leaders} WHERE state_partition = %s"),
                (partition,),
            ).fetchone()
            leader = None if row is None or row[0] is None else int(row[0])
            start, end, count = store.offsets(partition)
            partial = out + ".partial"
            segments = _write_segments(fs, store.records(partition), start, partial)
            where = store.where
    except StoreToolError as exc:
        raise ToolError(exc.code, str(exc)) from None
    manifest = ExportManifest(
        partition, num_partitions, leader, "", now_ms(), start, end, count, tuple(segments)
    )
    publish_export(fs, partial, out, manifest)
    return PostgresExport(manifest, where, leader)


def _write_segments(
    fs: FileOps, records: Iterator[LogRecord], start: int, target: str
) -> list[SegmentCopy]:
    """The records as frames in segment files below ``target`` (made anew), each rolled
    once it holds SEGMENT_BYTES; an empty partition gets one empty segment at its start."""
    if os.path.exists(target):
        remove_tree(target)  # what an earlier export left half done
    os.mkdir(target)
    copies: list[SegmentCopy] = []
    buffer = bytearray()
    base = start

    def seal() -> None:
        name = segment_name(base)
        fd = fs.open(os.path.join(target, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            fs.write_all(fd, bytes(buffer))
            fs.fsync(fd)
        finally:
            fs.close(fd)
        copies.append(SegmentCopy(name, len(buffer), zlib.crc32(buffer)))

    for record in records:
        if len(buffer) >= SEGMENT_BYTES:
            seal()
            buffer.clear()
            base = record.offset
        encode_frame_into(
            buffer, record.offset, record.timestamp, record.record_type, record.key, record.value
        )
    seal()
    fs.fsync_dir(target)
    return copies


# --- import ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PostgresImport:
    manifest: ExportManifest
    where: str
    epoch: int  # the partition's epoch after the import
    created: bool  # the import created the store's tables
    already: bool = False  # the partition held this export already: nothing was done


def import_into_postgres(uri: str, schema: str, source: str) -> PostgresImport:
    if not os.path.isdir(source):
        raise ToolError(EXIT_USAGE, f"--from {source} is not a directory")
    manifest = load_export(source)
    try:
        check_uri(uri)
        tables = Tables(schema)
    except LogError as exc:
        raise ToolError(EXIT_USAGE, str(exc)) from None
    check_export(source, manifest)
    where = f"{masked(uri)} (schema {schema})"
    try:
        conn = connect(uri)
    except StoreUnavailableError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None
    try:
        with conn.transaction():
            created = _prepare(conn, tables, manifest, where)
            epoch, live, node = _lock_leader(conn, tables, manifest.partition)
            if live:
                raise ToolError(
                    EXIT_FAILURE,
                    f"state partition {manifest.partition} of {where} is led by node {node} "
                    "with a live lease: stop the nodes (a clean stop releases their leases) "
                    "or wait for the lease to run out, then import again",
                )
            if _holds_records(conn, tables, source, manifest, where):
                return PostgresImport(manifest, where, epoch, created=False, already=True)
            _copy_in(conn, tables, source, manifest.partition)
            row = conn.execute(
                tables.sql(
                    "UPDATE {leaders} SET epoch = epoch + 1, lease_expiry = NULL "
                    "WHERE state_partition = %s RETURNING epoch"
                ),
                (manifest.partition,),
            ).fetchone()
            assert row is not None
            epoch = int(row[0])
    except psycopg.Error as exc:
        raise ToolError(EXIT_FAILURE, str(unavailable(exc, uri, "importing"))) from None
    except StoreUnavailableError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None
    finally:
        conn.close()
    return PostgresImport(manifest, where, epoch, created)


def _prepare(
    conn: psycopg.Connection[Any], tables: Tables, manifest: ExportManifest, where: str
) -> bool:
    """Step 1: whether the tables were created now."""
    found = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{tables.schema}.sharecoord_schema",)
    ).fetchone()
    try:
        prepare(conn, tables, manifest.num_partitions)
    except MetaMismatchError:
        raise ToolError(
            EXIT_FAILURE,
            f"{where} has another number of state partitions than the export's "
            f"{manifest.num_partitions}: a partition cannot move between them",
        ) from None
    except LogError as exc:
        raise ToolError(EXIT_FAILURE, str(exc)) from None
    return not (found and found[0])


def _lock_leader(
    conn: psycopg.Connection[Any], tables: Tables, partition: int
) -> tuple[int, bool, int | None]:
    """Step 2: (epoch, whether a lease on it is live, its node), the row locked."""
    row = conn.execute(
        tables.sql(
            "SELECT epoch, coalesce(lease_expiry > clock_timestamp(), false), node_id "
            "FROM {leaders} WHERE state_partition = %s FOR UPDATE"
        ),
        (partition,),
    ).fetchone()
    assert row is not None, "prepare made a row for every partition"
    return int(row[0]), bool(row[1]), row[2]


def _holds_records(
    conn: psycopg.Connection[Any],
    tables: Tables,
    source: str,
    manifest: ExportManifest,
    where: str,
) -> bool:
    """Step 3: False when the partition holds no records, True when it holds exactly
    the export's; refuses otherwise."""
    partition = manifest.partition
    row = conn.execute(
        tables.sql(
            'SELECT count(*), min("offset"), max("offset") FROM {records} '
            "WHERE state_partition = %s"
        ),
        (partition,),
    ).fetchone()
    assert row is not None
    count = int(row[0])
    if count == 0:
        return False
    if count == manifest.records and _same_records(conn, tables, source, partition):
        return True
    raise ToolError(
        EXIT_FAILURE,
        f"state partition {partition} of {where} already holds {count} records (offsets "
        f"{row[1]}..{row[2]}): an import never overwrites them; export them first if they "
        "are to be kept, and delete them (with every node stopped) if they are not",
    )


def _same_records(
    conn: psycopg.Connection[Any], tables: Tables, source: str, partition: int
) -> bool:
    with conn.cursor(name=f"import_check_{partition}") as cur:
        cur.itersize = 5000
        cur.execute(
            tables.sql(
                """SELECT "offset", "timestamp", record_type, key, value FROM {records}
                   WHERE state_partition = %s ORDER BY "offset\""""
            ),
            (partition,),
        )
        stored = (
            LogRecord(int(o), int(t), int(r), bytes(k), None if v is None else bytes(v))
            for o, t, r, k, v in cur
        )
        for theirs, ours in zip(read_partition(source), stored, strict=False):
            if theirs != ours:
                return False
    return True


def _copy_in(conn: psycopg.Connection[Any], tables: Tables, source: str, partition: int) -> None:
    """Step 4's records and keys rows."""
    first: dict[bytes, int] = {}
    snapshot: dict[bytes, int] = {}

    def blocks() -> Iterator[bytes]:
        rows: list[Row] = []
        for record in read_partition(source):
            rows.append(
                (
                    partition,
                    record.offset,
                    record.record_type,
                    record.key,
                    record.value,
                    record.timestamp,
                )
            )
            first.setdefault(record.key, record.offset)
            if record.record_type == SNAPSHOT_RECORD_TYPE:
                snapshot[record.key] = record.offset
            if len(rows) == COPY_BLOCK_ROWS:
                yield copyin.encode(rows)
                rows = []
        yield copyin.encode(rows)

    copyin.copy_records(conn, tables, blocks())
    keys = [(k, snapshot.get(k, since), k in snapshot) for k, since in first.items()]
    if keys:
        conn.execute(
            tables.sql(
                """INSERT INTO {keys} (state_partition, key, since, snapshot)
                   SELECT %s::integer, * FROM unnest(%s::bytea[], %s::bigint[], %s::boolean[])
                   ON CONFLICT (state_partition, key) DO UPDATE
                   SET since = excluded.since, snapshot = excluded.snapshot"""
            ),
            [partition, *(list(column) for column in zip(*keys, strict=True))],
        )


def manifest_line(manifest: ExportManifest) -> str:
    """What an export holds, in the words of the data directory's commands."""
    size = sum(segment.size for segment in manifest.segments)
    return (
        f"{manifest.records} records, offsets {manifest.log_start_offset}.."
        f"{manifest.log_end_offset - 1}, {len(manifest.segments)} segments, {size} bytes"
    )


def with_history_note(manifest: ExportManifest, source: str) -> str | None:
    if not manifest.history:
        return None
    return (
        f"its history ({len(manifest.history)} files) is not imported: the PostgreSQL store "
        f"does not take history files; keep {os.path.join(source, 'history')} for audits "
        "of what compaction folded away before"
    )
