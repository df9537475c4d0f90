"""The PostgreSQL store's own promises, on a real server: the epoch fence, the schema,
the lease statements, the replay from each key's last snapshot, passwords never shown,
and a commit while the server is down.

Most tests share the session's server (``postgres``), each in a schema of its own; the
one that stops its server starts its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from persistence import (
    DurabilityError,
    GroupCommitter,
    LogError,
    MetaMismatchError,
    PartitionFailedError,
)
from persistence.errors import NotLeaderError, StoreUnavailableError
from persistence.postgres import (
    SCHEMA_VERSION,
    PostgresStore,
    claim,
    copyin,
    heartbeat,
    list_leases,
    list_nodes,
    masked,
    release,
    renew,
)
from persistence.postgres.connection import one_line
from persistence.postgres.store import FETCH_ROWS, replay_sql
from protocol.records import SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE
from tests.figures import Figures
from tests.harness import wait_until_blocking
from tests.persistence.log_helpers import append_records
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer, free_port, running_servers, server_root

LEASE_MS = 60_000


def open_led(uri: str, partitions: int, node_id: int = 1, schema: str | None = None) -> Any:
    store = PostgresStore.open(uri, partitions, node_id, schema=schema or fresh_schema())
    for p in range(partitions):
        assert store.claim(p, LEASE_MS) is not None
        store.partition(p).open()
    return store


def rows_of(server: PostgresServer, store: PostgresStore, partition: int) -> list[int]:
    found = server.execute(
        f'SELECT "offset" FROM {store.tables.schema}.sharecoord_records '
        f'WHERE state_partition = {partition} ORDER BY "offset"'
    )
    return [int(line) for line in found.split()]


def release_all(store: PostgresStore, partitions: list[int]) -> list[int]:
    with store.connection("test") as conn:
        return release(conn, store.tables, store.node_id, partitions)


# -- the epoch fence --------------------------------------------------------------------


async def test_a_commit_whose_epoch_moved_writes_none_of_that_partition(
    postgres: PostgresServer,
) -> None:
    schema = fresh_schema()
    old = await asyncio.to_thread(open_led, postgres.uri(), 2, 1, schema)
    committer = GroupCommitter(old)
    committer.start()
    try:
        first = {p: append_records(old.partition(p), 2) for p in (0, 1)}
        barrier = committer.wait_durable_many({p: r[-1].offset for p, r in first.items()})
        assert await barrier.future == {}
        # Node 2 takes partition 0 over (node 1 handed it back): epoch 2.
        assert await asyncio.to_thread(release_all, old, [0]) == [0]
        new = await asyncio.to_thread(PostgresStore.open, postgres.uri(), 2, 2, schema=schema)
        try:
            assert await asyncio.to_thread(new.claim, 0, LEASE_MS) == 2
        finally:
            await asyncio.to_thread(new.close)
        # The old leader's next cycle carries both partitions: 0 is refused, 1 is written.
        second = {p: append_records(old.partition(p), 3, 10) for p in (0, 1)}
        barrier = committer.wait_durable_many({p: r[-1].offset for p, r in second.items()})
        failed = await barrier.future
    finally:
        await committer.close()
    assert set(failed) == {0}
    assert isinstance(failed[0], DurabilityError)
    assert isinstance(failed[0].cause, NotLeaderError)
    assert "node 2, epoch 2" in str(failed[0].cause)
    assert await asyncio.to_thread(rows_of, postgres, old, 0) == [0, 1]  # nothing refused
    assert await asyncio.to_thread(rows_of, postgres, old, 1) == [0, 1, 2, 3, 4]
    assert isinstance(old.partition(0).failure, NotLeaderError)
    # It cannot come back by a reset either: the store says it is not its own.
    with pytest.raises(NotLeaderError):
        await asyncio.to_thread(old.partition(0).reset_to_durable)
    await asyncio.to_thread(old.close)


async def test_opening_a_partition_this_node_does_not_lead_is_refused(
    postgres: PostgresServer,
) -> None:
    store = await asyncio.to_thread(PostgresStore.open, postgres.uri(), 2, 1, schema=fresh_schema())
    try:
        with pytest.raises(NotLeaderError, match="no epoch"):
            await asyncio.to_thread(store.partition(0).open)
        store.lead(1, 7)  # an epoch the leaders table never gave
        with pytest.raises(NotLeaderError, match="epoch 7"):
            await asyncio.to_thread(store.partition(1).open)
    finally:
        await asyncio.to_thread(store.close)


# -- the lease statements ---------------------------------------------------------------


def test_a_claim_raises_the_epoch_and_only_an_expired_lease_can_be_claimed(
    postgres: PostgresServer,
) -> None:
    with PostgresStore.open(postgres.uri(), 3, 1, schema=fresh_schema()) as store:
        tables = store.tables
        with store.connection("test") as conn:
            assert claim(conn, tables, 0, 1, LEASE_MS) == 1
            assert claim(conn, tables, 0, 2, LEASE_MS) is None  # node 1's lease is live
            assert claim(conn, tables, 0, 1, LEASE_MS) is None  # even for node 1 itself
            # A lease of 1 ms is over by PostgreSQL's clock at once: node 2 gets it,
            # with the epoch raised (polled: the clocks are PostgreSQL's, not ours).
            assert claim(conn, tables, 1, 1, 1) == 1
            epoch = wait_until_blocking(
                lambda: claim(conn, tables, 1, 2, LEASE_MS),
                "a 1 ms lease to expire",
                until=lambda claimed: claimed is not None,
            )
            assert epoch == 2
            found = {lease.state_partition: lease for lease in list_leases(conn, tables)}
            assert (found[1].node_id, found[1].epoch, found[1].live) == (2, 2, True)
            assert (found[2].node_id, found[2].epoch, found[2].live) == (None, 0, False)


def test_renewal_extends_every_live_lease_of_a_node_in_one_statement(
    postgres: PostgresServer,
) -> None:
    with PostgresStore.open(postgres.uri(), 4, 1, schema=fresh_schema()) as store:
        tables = store.tables
        with store.connection("test") as conn:
            for p in (0, 1, 2):
                assert claim(conn, tables, p, 1, LEASE_MS) == 1
            assert claim(conn, tables, 3, 2, LEASE_MS) == 1
            before = {lease.state_partition: lease for lease in list_leases(conn, tables)}
            assert renew(conn, tables, 1, 2 * LEASE_MS) == {0: 1, 1: 1, 2: 1}
            after = {lease.state_partition: lease for lease in list_leases(conn, tables)}
            for p in (0, 1, 2):
                assert after[p].lease_expiry > before[p].lease_expiry
            assert after[3].lease_expiry == before[3].lease_expiry  # node 2's
            # A released lease is not renewed: it must be claimed again, epoch + 1.
            assert release(conn, tables, 1, [2]) == [2]
            assert renew(conn, tables, 1, LEASE_MS) == {0: 1, 1: 1}
            assert claim(conn, tables, 2, 1, LEASE_MS) == 2
            assert release(conn, tables, 1, [3]) == []  # not node 1's to release
            heartbeat(conn, tables, 1, "127.0.0.1:9095", None, 3000)
            heartbeat(conn, tables, 1, "127.0.0.1:9096", "127.0.0.1:9092", 3000)
            heartbeat(conn, tables, 2, None, None, 60_000)
            rows = conn.execute(
                tables.sql("SELECT node_id, http_listener, kafka_listener FROM {nodes}")
            ).fetchall()
            assert sorted(rows) == [(1, "127.0.0.1:9096", "127.0.0.1:9092"), (2, None, None)]
            # Each node is judged by its own lease, whatever the reader's: 4 s without
            # a heartbeat is past node 1's 3 s, within node 2's 60 s.
            conn.execute(
                tables.sql(
                    "UPDATE {nodes} SET last_heartbeat = clock_timestamp() - '4 s'::interval"
                )
            )
            nodes = {node.node_id: node for node in list_nodes(conn, tables)}
            assert (nodes[1].lease_ms, nodes[2].lease_ms) == (3000, 60_000)
            assert not nodes[1].live(5000) and nodes[2].live(1000)
            conn.execute(tables.sql("UPDATE {nodes} SET lease_ms = NULL"))  # an older node
            assert [node.live(5000) for node in list_nodes(conn, tables)] == [True, True]


# -- the schema -------------------------------------------------------------------------


def test_the_schema_is_made_once_versioned_and_fixed_in_partition_count(
    postgres: PostgresServer,
) -> None:
    schema = fresh_schema()
    opened: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(PostgresStore.open(postgres.uri(), 5, 1, schema=schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]  # nodes starting together
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in opened:
        store.close()
    assert errors == [] and len(opened) == 4
    version = postgres.execute(f"SELECT version, num_partitions FROM {schema}.sharecoord_schema")
    assert version == f"{SCHEMA_VERSION}|5"
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_leaders") == "5"
    with pytest.raises(MetaMismatchError, match="num_partitions=5"):
        PostgresStore.open(postgres.uri(), 6, 1, schema=schema)
    postgres.execute(f"UPDATE {schema}.sharecoord_schema SET version = {SCHEMA_VERSION + 1}")
    with pytest.raises(LogError, match="newer than this sharecoord knows") as refused:
        PostgresStore.open(postgres.uri(), 5, 1, schema=schema)
    assert "\n" not in str(refused.value)
    with pytest.raises(LogError, match="schema name"):
        PostgresStore.open(postgres.uri(), 5, 1, schema="Robert'); DROP TABLE x;--")


# -- passwords and errors ---------------------------------------------------------------


def test_a_password_is_masked_wherever_the_uri_is_shown() -> None:
    assert masked(
        "postgresql://app:s3cret@db1:5432,db2:5432/sc?target_session_attrs=read-write"
    ) == ("postgresql://app:***@db1:5432,db2:5432/sc?target_session_attrs=read-write")
    assert masked("postgres://app:s3cret@db/sc") == "postgres://app:***@db/sc"
    assert masked("postgresql://db/sc?user=app&password=s3cret&sslmode=require") == (
        "postgresql://db/sc?user=app&password=***&sslmode=require"
    )
    assert masked("host=db user=app password='s3 cret' dbname=sc") == (
        "host=db user=app password=*** dbname=sc"
    )
    assert masked("postgresql://app@db/sc") == "postgresql://app@db/sc"


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    uri = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/sc?connect_timeout=5"
    with pytest.raises(StoreUnavailableError) as caught:
        PostgresStore.open(uri, 2, 1)
    message = str(caught.value)
    assert "hunter2" not in message and "\n" not in message
    assert message.startswith(f"PostgreSQL store {masked(uri)}: ")
    assert "refused" in message.lower()
    with pytest.raises(LogError) as bad:
        PostgresStore.open("postgresql://app:hunter2@db/sc?nonsense=1", 2, 1)
    assert "hunter2" not in str(bad.value) and "\n" not in str(bad.value)


def test_a_driver_message_is_one_line_without_the_password() -> None:
    uri = "postgresql://app:hunter2@db1,db2/sc"
    said = one_line(ValueError("auth for app with hunter2 failed\n\tDETAIL: retry"), uri)
    assert said == "auth for app with *** failed; DETAIL: retry"


def test_a_store_s_repr_masks_the_password(postgres: PostgresServer) -> None:
    with PostgresStore.open(postgres.uri(password="hunter2"), 1, 1, schema=fresh_schema()) as store:
        assert "hunter2" not in repr(store) and ":***@" in repr(store)
        assert "hunter2" not in repr(store.partition(0))


# -- the COPY's own encoding -------------------------------------------------------------


def test_records_encoded_for_copy_read_back_as_written(postgres: PostgresServer) -> None:
    """copyin.encode writes COPY's binary format itself: every field's extremes, a NULL
    value and empty bytes read back as they were, and a row's length is what
    ROW_OVERHEAD says."""
    schema = fresh_schema()
    store = PostgresStore.open(postgres.uri(), 3, 1, schema=schema)
    rows: list[copyin.Row] = [
        (0, 0, 0, b"k", b"v", 0),
        (2, 2**63 - 1, -(2**15), bytes(range(256)), None, -(2**63)),
        (1, 7, 2**15 - 1, b"", b"", 2**63 - 1),
        (1, 8, 1, b"\x00" * 3, bytes(100_000), 1_700_000_000_000),
    ]
    for row in rows:
        assert len(copyin.encode([row])) == copyin.ROW_OVERHEAD + len(row[3]) + len(row[4] or b"")
    with store.transaction("test") as conn:
        copyin.copy_records(
            conn, store.tables, [copyin.encode(rows[:2]), b"", copyin.encode(rows[2:])]
        )
    with store.transaction("test") as conn:
        back = conn.execute(
            store.tables.sql(
                'SELECT state_partition, "offset", record_type, key, value, "timestamp" '
                'FROM {records} ORDER BY state_partition, "offset"'
            )
        ).fetchall()
    store.close()
    assert [
        (p, o, t, bytes(k), None if v is None else bytes(v), ts) for p, o, t, k, v, ts in back
    ] == sorted(rows)


# -- the replay from each key's last snapshot -------------------------------------------

KEYS = 200
RECORDS_PER_KEY = 200
SNAPSHOT_EVERY = 20  # records per key between two snapshots: the last one is 180 .. 199
LAST_SNAPSHOT = (RECORDS_PER_KEY - 1) // SNAPSHOT_EVERY * SNAPSHOT_EVERY


def fill(store: PostgresStore) -> None:
    """KEYS keys, RECORDS_PER_KEY records each, every SNAPSHOT_EVERY-th a snapshot, in
    cycles of 2000 records, the keys interleaved."""
    part = store.partition(0)
    for round_ in range(RECORDS_PER_KEY):
        for k in range(KEYS):
            kind = SNAPSHOT_RECORD_TYPE if round_ % SNAPSHOT_EVERY == 0 else UPDATE_RECORD_TYPE
            part.append(kind, f"key-{k:04}".encode(), bytes(60), round_)
        if round_ % 10 == 9:
            batch = part.take_pending()
            assert batch is not None
            result = store.commit_cycle([(0, batch)])
            assert result.errors == [None]


def records_scanned(server: PostgresServer, store: PostgresStore) -> int:
    """How many rows of sharecoord_records the replay's plan reads, by EXPLAIN ANALYZE:
    partition 0 from the oldest key's start on, as replay_rows asks."""
    keys = f"{store.tables.schema}.sharecoord_keys"
    start = server.execute(f"SELECT min(since) FROM {keys} WHERE state_partition = 0")
    query = replay_sql(store.tables).as_string(None) % ("0", start)
    plan = json.loads(server.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}"))

    def scanned(node: dict[str, Any]) -> int:
        own = 0
        if node.get("Relation Name") == "sharecoord_records":
            own = node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
        return own + sum(scanned(child) for child in node.get("Plans", []))

    return int(scanned(plan[0]["Plan"]))


def test_a_load_reads_each_key_from_its_last_snapshot_only(
    postgres: PostgresServer, figures: Figures
) -> None:
    schema = fresh_schema()
    with PostgresStore.open(postgres.uri(), 1, 1, schema=schema) as store:
        store.claim(0, LEASE_MS)
        store.partition(0).open()
        fill(store)
    postgres.execute(f"ANALYZE {schema}.sharecoord_records")
    postgres.execute(f"ANALYZE {schema}.sharecoord_keys")
    total = KEYS * RECORDS_PER_KEY
    needed = KEYS * (RECORDS_PER_KEY - LAST_SNAPSHOT)
    timings: dict[str, list[float]] = {"bounded": [], "full": []}
    with PostgresStore.open(postgres.uri(), 1, 1, schema=schema) as store:
        store.lead(0, 1)
        part = store.partition(0)
        loaded: list[Any] = []
        part.open(loaded.append)
        assert len(loaded) == needed
        assert records_scanned(postgres, store) == needed  # not the whole history
        for _ in range(3):  # interleaved, so a busy machine slows both alike
            seen: list[Any] = []
            started = time.perf_counter()
            part.read_recovered(seen.append)
            timings["bounded"].append(time.perf_counter() - started)
            started = time.perf_counter()
            everything = list(part.read())
            timings["full"].append(time.perf_counter() - started)
            assert len(everything) == total
            assert seen == loaded
        assert {r.timestamp for r in loaded} == set(range(LAST_SNAPSHOT, RECORDS_PER_KEY))
        assert [r.offset for r in loaded] == sorted(r.offset for r in loaded)
    figures.set("records", total)
    figures.set("replayed", needed)
    figures.set("replay_ms", round(1000 * min(timings["bounded"]), 1))
    figures.set("full_scan_ms", round(1000 * min(timings["full"]), 1))


# -- a server that goes away ------------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of the test's own, to stop and start."""
    with server_root() as root, running_servers() as servers:
        servers.append(PostgresServer.primary(root))
        yield servers[0]


async def test_a_commit_while_the_server_is_down_fails_cleanly_and_the_next_succeeds(
    own_server: PostgresServer, figures: Figures, caplog: pytest.LogCaptureFixture
) -> None:
    server = own_server
    store = await asyncio.to_thread(open_led, server.uri() + "?connect_timeout=5", 1)
    part = store.partition(0)
    committer = GroupCommitter(store)
    committer.start()
    try:
        kept = append_records(part, 3)
        await committer.wait_durable(0, kept[-1].offset)
        await asyncio.to_thread(server.stop)
        lost = append_records(part, 2, 10)
        with pytest.raises(DurabilityError) as caught:
            await committer.wait_durable(0, lost[-1].offset)
        cause = caught.value.cause
        assert isinstance(cause, StoreUnavailableError)
        assert "\n" not in str(cause) and str(cause).startswith("PostgreSQL store ")
        assert caught.value.durable_end_offset == 3
        # In this store's words: nothing here wrote or fsynced a file.
        (said,) = [r.getMessage() for r in caplog.records if r.name == "sharecoord.log"]
        assert said.startswith("state partition 0: commit to PostgreSQL failed: "), said
        assert part.failure is cause  # it takes no appends until it is reset
        with pytest.raises(PartitionFailedError):
            part.append(0, b"k", b"v", 1)
        with pytest.raises(StoreUnavailableError):  # what the runtime's reload meets
            await asyncio.to_thread(part.reset_to_durable)
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(part.reset_to_durable)
        assert part.log_end_offset == part.durable_end_offset == 3
        again = append_records(part, 2, 20)
        await committer.wait_durable(0, again[-1].offset)
    finally:
        await committer.close()
        await asyncio.to_thread(store.close)
    assert await asyncio.to_thread(rows_of, server, store, 0) == [0, 1, 2, 3, 4]
    assert [r.offset for r in again] == [3, 4]
    figures.set("failed_commits", 1)


def test_a_load_whose_server_freezes_midway_fails_within_the_timeout(
    own_server: PostgresServer, figures: Figures
) -> None:
    """A load takes many round trips (FETCH_ROWS rows each) and may take far longer than
    timeout_ms as a whole; a server that stops answering between two of them (SIGSTOP:
    its TCP stack still answers, so neither keepalives nor statement_timeout help) must
    fail the load within about timeout_ms, not leave the partition loading for ever."""
    server = own_server
    schema = fresh_schema()
    keys = FETCH_ROWS + FETCH_ROWS // 2  # the load's second fetch is after the freeze
    with PostgresStore.open(server.uri(), 1, 1, schema=schema) as store:
        store.claim(0, LEASE_MS)
        part = store.partition(0)
        part.open()
        for k in range(keys):
            part.append(SNAPSHOT_RECORD_TYPE, f"key-{k:06}".encode(), bytes(20), k)
        batch = part.take_pending()
        assert batch is not None
        assert store.commit_cycle([(0, batch)]).errors == [None]
    timeout_ms = 1000
    outcome: list[BaseException | int] = []
    with PostgresStore.open(server.uri(), 1, 1, schema=schema, timeout_ms=timeout_ms) as store:
        store.lead(0, 1)
        seen: list[int] = []
        frozen_at: list[float] = []

        def on_record(record: Any) -> None:
            if not seen:
                server.freeze()
                frozen_at.append(time.monotonic())
            seen.append(record.offset)

        def load() -> None:
            try:
                store.partition(0).open(on_record)
                outcome.append(len(seen))
            except BaseException as exc:  # the test looks at it
                outcome.append(exc)

        loader = threading.Thread(target=load, daemon=True)
        try:
            loader.start()
            # Generous: the load must end by itself, long before this.
            wait_until_blocking(lambda: bool(outcome), "the load to end", timeout=60)
        finally:
            server.thaw()
        loader.join(timeout=60)
    failed_after_s = time.monotonic() - frozen_at[0]
    (result,) = outcome
    assert isinstance(result, StoreUnavailableError), result
    assert "loading state partition 0" in str(result) or "replaying" in str(result)
    assert 0 < len(seen) < keys  # it had read some, not all
    figures.set("rows_before_the_freeze", len(seen))
    figures.set("timeout_ms", timeout_ms)
    figures.set("failed_after_s", round(failed_after_s, 2))


def test_a_store_of_version_1_is_upgraded_with_its_records_kept(postgres: PostgresServer) -> None:
    """Version 2 added the history (a table, its watermarks and a column saying whether
    it is kept): a store a version-1 daemon created gains them, keeping what it holds."""
    schema = fresh_schema()
    store = open_led(postgres.uri(), 2, schema=schema)
    append_records(store.partition(0), 3)
    batch = store.partition(0).take_pending()
    assert store.commit_cycle([(0, batch)]).shared is None
    store.close()
    postgres.execute(
        f"DROP TABLE {schema}.sharecoord_history, {schema}.sharecoord_history_marks; "
        f"ALTER TABLE {schema}.sharecoord_schema DROP COLUMN history_retention_ms; "
        f"ALTER TABLE {schema}.sharecoord_nodes DROP COLUMN lease_ms; "
        f"UPDATE {schema}.sharecoord_schema SET version = 1"
    )
    PostgresStore.open(postgres.uri(), 2, 1, schema=schema).close()
    assert (
        postgres.execute(
            f"SELECT version, history_retention_ms IS NULL FROM {schema}.sharecoord_schema"
        )
        == f"{SCHEMA_VERSION}|t"
    )
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_history") == "0"
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_records") == "3"


def test_a_store_of_version_2_loses_the_index_by_key_and_replays_the_same(
    postgres: PostgresServer,
) -> None:
    """Version 3 dropped the index on records by key (every commit paid for it) and gave
    each node row its lease: a store a version-2 daemon created loses the index and
    gains the column, and its replay gives the same records."""
    schema = fresh_schema()
    store = open_led(postgres.uri(), 1, schema=schema)
    append_records(store.partition(0), 40)
    assert store.commit_cycle([(0, store.partition(0).take_pending())]).shared is None
    before: list[Any] = []
    store.partition(0).read_recovered(before.append)
    store.close()
    index = f"{schema}.sharecoord_records_by_key"
    postgres.execute(
        f"CREATE INDEX sharecoord_records_by_key ON {schema}.sharecoord_records "
        f'(state_partition, key, "offset"); UPDATE {schema}.sharecoord_schema SET version = 2; '
        f"ALTER TABLE {schema}.sharecoord_nodes DROP COLUMN lease_ms"
    )
    assert postgres.execute(f"SELECT to_regclass('{index}') IS NULL") == "f"
    with PostgresStore.open(postgres.uri(), 1, 1, schema=schema) as store:
        after: list[Any] = []
        store.partition(0).read_recovered(after.append)
    assert postgres.execute(f"SELECT to_regclass('{index}') IS NULL") == "t"
    assert postgres.execute(f"SELECT version FROM {schema}.sharecoord_schema") == "3"
    assert postgres.execute(f"SELECT count(lease_ms) FROM {schema}.sharecoord_nodes") == "0"
    assert after == before
    assert len(before) < 40  # each key from its last snapshot on, not every record
