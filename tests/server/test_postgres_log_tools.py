"""``sharecoord log verify`` and ``log dump`` on a PostgreSQL store (docs/api.md#cli,
docs/operations.md#repairing-a-damaged-partition), on the session's real server: the
same output and exit codes as on a data directory, each kind of damage the store can
have made by really editing its rows and seen reported, and a store read while a
transaction is writing to it seen as of one snapshot.

The store is written by the store's own commit (``commit_cycle``), as a node writes it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from persistence.postgres import SCHEMA_VERSION, PostgresStore
from persistence.postgres.reading import read_snapshot
from protocol.records import ShareKey, ShareSnapshot, ShareUpdate, encode_record
from server.postgres_tools import log_dump_postgres, log_verify_postgres
from server.postgres_verify import verify_store
from tests.harness import run_cli
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer

NUM_PARTITIONS = 3
KEYS_EACH = 2
UPDATES_EACH = 3  # per key, after its snapshot
TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"
LEASE_MS = 60_000
RECORDS = NUM_PARTITIONS * KEYS_EACH * (1 + UPDATES_EACH)


@dataclass
class Store:
    server: PostgresServer
    schema: str

    def sql(self, statement: str) -> str:
        return self.server.execute(statement.format(s=self.schema))

    def verified(self) -> tuple[int, list[str]]:
        out = io.StringIO()
        code = log_verify_postgres(self.server.uri(), self.schema, out)
        return code, out.getvalue().splitlines()

    def dumped(self, partition: int | None = None, as_json: bool = True) -> tuple[int, list[str]]:
        out = io.StringIO()
        code = log_dump_postgres(self.server.uri(), self.schema, partition, as_json, out)
        return code, out.getvalue().splitlines()


def share_key(partition: int, i: int) -> ShareKey:
    return ShareKey("group", TOPIC, partition * 100 + i)


def written_store(server: PostgresServer) -> Store:
    """Every state partition with KEYS_EACH keys, each a snapshot then UPDATES_EACH
    updates (the keys interleaved), committed by the store's own commit cycle."""
    schema = fresh_schema()
    store = PostgresStore.open(server.uri(), NUM_PARTITIONS, 1, schema=schema)
    try:
        for p in range(NUM_PARTITIONS):
            assert store.claim(p, LEASE_MS) is not None
            part = store.partition(p)
            part.open()
            for i in range(KEYS_EACH):
                snapshot = ShareSnapshot(share_key(p, i), 0, 1, 1, 10, 1, 1, [])
                part.append(*encode_record(snapshot), 1000 + i)
            for n in range(UPDATES_EACH):
                for i in range(KEYS_EACH):
                    update = ShareUpdate(share_key(p, i), 0, 1, 11 + n, [])
                    part.append(*encode_record(update), 2000 + n)
            batch = part.take_pending()
            assert batch is not None
            result = store.commit_cycle([(p, batch)])
            assert result.errors == [None], result.errors
    finally:
        store.close()
    return Store(server, schema)


def test_a_sound_store_says_ok_with_every_partition(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    code, lines = store.verified()
    assert code == 0, lines
    each = KEYS_EACH * (1 + UPDATES_EACH)
    assert lines[:NUM_PARTITIONS] == [
        f"partition {p}: ok, {each} records, offsets 0..{each - 1}" for p in range(NUM_PARTITIONS)
    ]
    assert lines[-1] == (
        f"ok: {NUM_PARTITIONS} partitions, {RECORDS} records in {postgres.uri()} "
        f"(schema {store.schema})"
    )


def test_a_value_that_does_not_decode_is_named_by_its_offset(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    store.sql(
        "UPDATE {s}.sharecoord_records SET value = '\\x00ff'::bytea "
        'WHERE state_partition = 1 AND "offset" = 4'
    )
    code, lines = store.verified()
    assert code == 1
    assert any(line.startswith("partition 1: DOES NOT REPLAY at offset 4: ") for line in lines)
    assert lines[-2].startswith("DAMAGED: partition 1 (1 of 3), ")
    assert "log dump --state-store" in lines[-1] and "--partition 1" in lines[-1]
    # The dump prints it as the data directory's does: undecodable, its error given.
    code, dumped = store.dumped(1)
    assert code == 0
    bad = json.loads(dumped[4])
    assert (bad["log_offset"], bad["record_type"]) == (4, "undecodable")
    assert bad["error"]


def test_a_hole_above_the_log_start_is_damage(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    store.sql('DELETE FROM {s}.sharecoord_records WHERE state_partition = 2 AND "offset" IN (3, 4)')
    code, lines = store.verified()
    assert code == 1
    assert (
        f"partition 2: DAMAGED {store.schema}.sharecoord_records: offsets 3..4 missing, above "
        "the log start 0 (a hole)"
    ) in lines
    assert lines[-2].startswith("DAMAGED: partition 2 (1 of 3), ")


def test_what_pruning_deleted_from_the_bottom_is_no_hole(postgres: PostgresServer) -> None:
    """New snapshots of every key of partition 0, then the store's own prune below
    them: the log starts there, and every keys row is where its records say."""
    store = written_store(postgres)
    each = KEYS_EACH * (1 + UPDATES_EACH)
    opened = PostgresStore.open(postgres.uri(), NUM_PARTITIONS, 1, schema=store.schema)
    try:
        assert opened.claim(0, LEASE_MS) is None  # still led by the writer's lease
        opened.lead(
            0, int(store.sql("SELECT epoch FROM {s}.sharecoord_leaders WHERE state_partition = 0"))
        )
        part = opened.partition(0)
        part.open()
        for i in range(KEYS_EACH):
            snapshot = ShareSnapshot(share_key(0, i), 1, 1, 1, 20, 1, 1, [])
            part.append(*encode_record(snapshot), 3000)
        batch = part.take_pending()
        assert batch is not None
        assert opened.commit_cycle([(0, batch)]).errors == [None]
        assert part.prune(each) == [f"{each} records below offset {each}"]
    finally:
        opened.close()
    code, lines = store.verified()
    assert code == 0, lines
    assert lines[0] == f"partition 0: ok, {KEYS_EACH} records, offsets {each}..{each + 1}"


def test_what_compaction_leaves_is_no_hole_but_a_gap_after_it_is(
    postgres: PostgresServer,
) -> None:
    """Compaction's shape, made by hand in partition 0 (key 0 at even offsets, key 1 at
    odd): one snapshot per key, at 2 and 5, then updates appended from 8 on. The gaps
    before, between and right after the snapshots are not damage; one among the
    appended records is, unless it lies below the compaction watermark the store
    records (sharecoord_history_marks)."""
    store = written_store(postgres)
    where = 'FROM {s}.sharecoord_records WHERE state_partition = 0 AND "offset"'
    update = 'UPDATE {s}.sharecoord_records SET "offset" = '
    store.sql(f"DELETE {where} IN (2, 3, 4, 5)")
    for old, new in ((7, 9), (6, 8), (1, 5), (0, 2)):
        store.sql(f'{update}{new} WHERE state_partition = 0 AND "offset" = {old}')
    for old, new in ((1, 5), (0, 2)):
        store.sql(
            f"UPDATE {{s}}.sharecoord_keys SET since = {new} "
            f"WHERE state_partition = 0 AND since = {old}"
        )
    code, lines = store.verified()
    assert code == 0, lines
    assert lines[0] == "partition 0: ok, 4 records, offsets 2..9"
    store.sql(
        "INSERT INTO {s}.sharecoord_records SELECT state_partition, 11, record_type, key, "
        f'value, "timestamp" {where} = 9'
    )
    code, lines = store.verified()
    assert code == 1
    assert lines[0] == (
        f"partition 0: DAMAGED {store.schema}.sharecoord_records: offset 10 missing, above "
        "the log start 2 (a hole)"
    )
    store.sql(
        "INSERT INTO {s}.sharecoord_history_marks (state_partition, watermark) VALUES (0, 11) "
        "ON CONFLICT (state_partition) DO UPDATE SET watermark = excluded.watermark"
    )
    code, lines = store.verified()
    assert code == 0, lines


def test_a_wrong_since_and_a_missing_or_extra_keys_row_are_each_named(
    postgres: PostgresServer,
) -> None:
    store = written_store(postgres)
    k0, k1 = share_key(0, 0), share_key(0, 1)
    # Key 0's since moved to one of its updates: a load would replay it without its
    # snapshot under it.
    store.sql("UPDATE {s}.sharecoord_keys SET since = 4 WHERE state_partition = 0 AND since = 0")
    # Key 1's row gone: a load would not replay it at all.
    store.sql("DELETE FROM {s}.sharecoord_keys WHERE state_partition = 0 AND since = 1")
    # A row for a key that has no records.
    store.sql("INSERT INTO {s}.sharecoord_keys VALUES (0, '\\x01'::bytea, 3, true)")
    code, lines = store.verified()
    assert code == 1
    keys = f"partition 0: DAMAGED {store.schema}.sharecoord_keys: key"
    name = f"{k0.group_id}:{k0.topic_id}:{k0.partition}"
    assert (
        f"{keys} {name} has since 4 (snapshot true); its records say 0, its last snapshot's offset"
    ) in lines
    name = f"{k1.group_id}:{k1.topic_id}:{k1.partition}"
    assert (
        f"{keys} {name} has records (the first at offset 1) but no row: a load would not replay it"
    ) in lines
    assert f"{keys} 0x01 has a row (since 3) but no records" in lines
    assert lines[-2].startswith("DAMAGED: partition 0 (1 of 3), ")


def test_a_missing_leaders_row_is_the_store_itself(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    store.sql("DELETE FROM {s}.sharecoord_leaders WHERE state_partition = 1")
    store.sql("INSERT INTO {s}.sharecoord_leaders (state_partition) VALUES (7)")
    code, lines = store.verified()
    assert code == 1
    leaders = f"{store.schema}.sharecoord_leaders"
    assert f"DAMAGED {leaders}: no row for state partition(s) 1: nobody can lead them" in lines
    assert f"DAMAGED {leaders}: rows of state partition(s) 7, outside 0..2" in lines
    assert lines[-2].startswith(
        "DAMAGED: the store itself (above); 3 partitions checked, none damaged"
    )


def test_a_newer_schema_version_is_refused_as_the_store_itself(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    store.sql("UPDATE {s}.sharecoord_schema SET version = 99")
    code, lines = store.verified()
    assert code == 1
    assert lines[0] == (
        f"DAMAGED {store.schema}.sharecoord_schema: version 99; this sharecoord knows version "
        f"{SCHEMA_VERSION} (run a newer sharecoord)"
    )


def test_verify_reads_one_snapshot_whatever_commits_meanwhile(postgres: PostgresServer) -> None:
    """Rows deleted (a hole made) and committed after verify began are not seen by it:
    it checks the store as it was at its first statement, as for a running cluster."""
    store = written_store(postgres)
    with read_snapshot(postgres.uri(), store.schema) as snapshot:
        store.sql('DELETE FROM {s}.sharecoord_records WHERE state_partition = 0 AND "offset" = 3')
        report = verify_store(snapshot)
    assert report.ok, report
    code, lines = store.verified()  # a new snapshot sees it
    assert code == 1
    assert f"partition 0: DAMAGED {store.schema}.sharecoord_records: offset 3 missing" in "\n".join(
        lines
    )


def test_dump_prints_what_a_data_directory_dump_prints(postgres: PostgresServer) -> None:
    store = written_store(postgres)
    code, lines = store.dumped(None, as_json=True)
    assert code == 0
    rows = [json.loads(line) for line in lines]
    assert len(rows) == RECORDS
    for p in range(NUM_PARTITIONS):
        mine = [r for r in rows if r["state_partition"] == p]
        assert [r["log_offset"] for r in mine] == list(range(KEYS_EACH * (1 + UPDATES_EACH)))
        assert [r["record_type"] for r in mine[:KEYS_EACH]] == ["ShareSnapshot"] * KEYS_EACH
        assert mine[-1]["start_offset"] == 10 + UPDATES_EACH
    code, text = store.dumped(2, as_json=False)
    assert code == 0
    assert text[0].startswith("p=2 offset=0 ") and f"ShareSnapshot group:{TOPIC}:200" in text[0]


def test_the_commands_take_the_store_as_serve_does_and_refuse_in_one_line(
    postgres: PostgresServer,
) -> None:
    store = written_store(postgres)
    env = {"SHARECOORD_STATE_STORE": postgres.uri()}
    done = run_cli("log", "verify", "--state-store-schema", store.schema, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"ok: {NUM_PARTITIONS} partitions")
    done = run_cli(
        "log", "dump", "--state-store", postgres.uri(), "--state-store-schema", store.schema,
        "--partition", "0", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == KEYS_EACH * (1 + UPDATES_EACH)
    refusals = {
        ("log", "dump", "--partition", "3", "--state-store-schema", store.schema): (
            2,
            "partition 3 is out of range 0..2",
        ),
        ("log", "verify", "--state-store-schema", "nothing_here"): (
            2,
            "schema nothing_here holds no sharecoord tables",
        ),
        ("log", "verify", "--state-store-schema", "Bad-Name"): (2, "schema"),
    }
    for args, (code, said) in refusals.items():
        done = run_cli(*args, env=env)
        assert done.returncode == code, (args, done.stderr)
        assert said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    done = run_cli("log", "verify", "--data-dir", "data", env=env)
    assert done.returncode == 2 and "both given" in done.stderr, done.stderr
    secret = postgres.uri(password="s3cret").replace(str(postgres.port), "1")
    done = run_cli("log", "verify", "--state-store", secret)
    assert done.returncode == 1, done.stderr
    assert "s3cret" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    done = run_cli("log", "verify", "--state-store", "mysql://x@y/z")
    assert done.returncode == 2 and "not a PostgreSQL URI" in done.stderr
