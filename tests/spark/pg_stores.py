"""The Spark tests' PostgreSQL stores: a random history written into a store of its own
schema on a real server, the state a node loading it would replay, and the check
that every record written is in exactly one of the log (at or above the watermark)
and the history.

Everything here blocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from persistence.postgres import PostgresStore
from protocol.messages import AdminState
from protocol.records import SNAPSHOT_RECORD_TYPE, ShareKey, encode_record
from protocol.shard import ShardConfig, ShareCoordinatorShard
from spark_jobs.sealed import RawRecord
from spark_jobs.storeref import StoreRef
from tests.harness import run_cli
from tests.persistence.stores import StoreOpener, fresh_schema, postgres_opener
from tests.postgres import PostgresServer
from tests.spark.histories import Appended, admin_states, decoded, raw_records, replayed_shard


@dataclass
class PgLog:
    """A store on a real server, and what was written into it."""

    server: PostgresServer
    opener: StoreOpener
    store: StoreRef
    num_partitions: int
    written: list[Appended]

    def execute(self, sql: str) -> str:
        return self.server.execute(sql.replace("{schema}", self.store.schema))

    def states(self) -> dict[int, dict[ShareKey, AdminState | None]]:
        """Each partition's state as a node loading it now replays it (from each key's
        last snapshot on, by sharecoord_keys)."""
        replayed: dict[int, list] = {}
        store = self.opener.open(replayed)
        try:
            return {
                p: admin_states(
                    replayed_shard(
                        decoded(
                            (r.offset, r.timestamp, r.record_type, r.key, r.value) for r in rows
                        )
                    )
                )
                for p, rows in sorted(replayed.items())
            }
        finally:
            store.close()
            self.opener.opened.remove(store)

    def rows(self, table: str, partition: int, where: str = "true") -> list[RawRecord]:
        with psycopg.connect(self.store.uri) as conn:
            found = conn.execute(
                f'SELECT "offset", "timestamp", record_type, key, value '
                f"FROM {self.store.schema}.sharecoord_{table} "
                f'WHERE state_partition = %s AND {where} ORDER BY "offset"',
                (partition,),
            ).fetchall()
        return [(o, t, k, bytes(key), None if v is None else bytes(v)) for o, t, k, key, v in found]

    def watermark(self, partition: int) -> int:
        found = self.execute(
            "SELECT watermark FROM {schema}.sharecoord_history_marks "
            f"WHERE state_partition = {partition}"
        )
        return int(found) if found else 0

    def every_record_once(self) -> None:
        """Each record written is in exactly one of the history and the log at or above
        the watermark, as written; nothing else is there."""
        for p in range(self.num_partitions):
            ours = raw_records(a for a in self.written if a.state_partition == p)
            mark = self.watermark(p)
            history = self.rows("history", p)
            live = self.rows("records", p, f'"offset" >= {mark}')
            assert {r[0] for r in history}.isdisjoint(r[0] for r in live), p
            assert sorted(history + live) == ours, f"state partition {p}"

    def keys_point_at_last_snapshots(self) -> None:
        """sharecoord_keys as the commit keeps it: a row per key with records, where its
        replay starts: its last snapshot (or tombstone), or its first record if none."""
        for p in range(self.num_partitions):
            records = self.rows("records", p)
            with psycopg.connect(self.store.uri) as conn:
                rows = conn.execute(
                    f"SELECT key, since, snapshot FROM {self.store.schema}.sharecoord_keys "
                    "WHERE state_partition = %s",
                    (p,),
                ).fetchall()
            keys = {bytes(k): (int(since), bool(snap)) for k, since, snap in rows}
            assert set(keys) == {r[3] for r in records}, f"state partition {p}"
            for key, (since, snapshot) in keys.items():
                ours = [r for r in records if r[3] == key]
                snapshots = [r[0] for r in ours if r[2] == SNAPSHOT_RECORD_TYPE]
                if snapshot:
                    assert since == max(snapshots), (p, key)
                else:
                    assert not snapshots and since <= ours[0][0], (p, key)


def cli_dump(log: PgLog) -> list[dict[str, Any]]:
    """What `sharecoord log dump --json` prints for the store: its live log, by state
    partition and offset."""
    done = run_cli(
        "log", "dump", "--json", "--state-store", log.store.uri,
        "--state-store-schema", log.store.schema,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return sorted(rows, key=lambda r: (r["state_partition"], r["log_offset"]))


SECRET = "pw-never-shown"


def write_store(server: PostgresServer, written: Sequence[Appended], num_partitions: int) -> PgLog:
    """``written`` committed into a new store (offsets as given, in order)."""
    schema = fresh_schema()
    opener = postgres_opener(server.uri(), num_partitions, schema=schema)
    store: PostgresStore = opener.open()  # type: ignore[assignment]
    try:
        append(store, written)
    finally:
        store.close()
        opener.opened.remove(store)
    # The jobs are given a password (the test server trusts loopback and ignores it):
    # no output of theirs may show it.
    store = StoreRef(server.uri(password=SECRET), schema)
    return PgLog(server, opener, store, num_partitions, list(written))


def append(store: PostgresStore, written: Sequence[Appended]) -> None:
    """Commit ``written`` through the store's own commit cycle."""
    touched = set()
    for item in written:
        part = store.partition(item.state_partition)
        assert part.log_end_offset == item.offset, "offsets in order"
        record_type, key, value = encode_record(item.record)
        part.append(record_type, key, value, item.timestamp)
        touched.add(item.state_partition)
    batches = []
    for p in sorted(touched):
        batch = store.partition(p).take_pending()
        if batch is not None:
            batches.append((p, batch))
    result = store.commit_cycle(batches)
    assert result.shared is None and not any(result.errors), result


def write_more(log: PgLog, more: Sequence[Appended]) -> None:
    """``more`` committed into the store after what it holds."""
    store: PostgresStore = log.opener.open()  # type: ignore[assignment]
    try:
        append(store, more)
    finally:
        store.close()
        log.opener.opened.remove(store)
    log.written += more


def prune_as_the_daemon_does(log: PgLog, p: int) -> int:
    """PostgresPartition.prune below the partition's last redundant offset, as the
    daemon's prune job computes it (its shard's lowest latest-snapshot offset)."""
    shard = ShareCoordinatorShard(ShardConfig())
    for offset, record in decoded(log.rows("records", p)):
        shard.replay(offset, record)
    mark = shard.last_redundant_offset()
    assert mark is not None
    store: PostgresStore = log.opener.open()  # type: ignore[assignment]
    try:
        deleted = store.partition(p).prune(mark)
    finally:
        store.close()
        log.opener.opened.remove(store)
    assert deleted
    return mark


def prune_after_new_snapshots(log: PgLog, p: int) -> list[Appended]:
    """What a node does next on a compacted partition: each key's last snapshot written
    again (the same state), then a prune as the daemon's, which now has the compacted
    records to delete. Returns the records written."""
    last: dict[bytes, Appended] = {}
    for item in log.written:
        if item.state_partition == p and item.record is not None:
            record_type, key, value = encode_record(item.record)
            if record_type == SNAPSHOT_RECORD_TYPE and value is not None:
                last[key] = item
    end = max(a.offset for a in log.written if a.state_partition == p) + 1
    stamp = max(a.timestamp for a in log.written) + 1
    again = [Appended(p, end + i, stamp + i, item.record) for i, item in enumerate(last.values())]
    write_more(log, again)
    prune_as_the_daemon_does(log, p)
    return again
