"""``partition import`` into a PostgreSQL store, its rules one by one
(server/postgres_partitions.py), on the session's real server: the import fences the
node that led the partition before (its epoch rises), a damaged export or a store of
another partition count is refused before anything is written, a kill before its
commit leaves nothing of it, and an export taken from the store holds exactly its
records."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from persistence import StateLog
from persistence.errors import NotLeaderError
from persistence.postgres import PostgresStore, release
from protocol.records import ShareKey, ShareSnapshot, ShareUpdate, encode_record
from server.partition_tools import ToolError, export_partition
from server.postgres_partitions import export_from_postgres, import_into_postgres
from tests.harness import REPO_ROOT, SHARECOORD, child_env, wait_until_blocking
from tests.persistence.stores import fresh_schema
from tests.postgres import PostgresServer

NUM_PARTITIONS = 2
TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"
LEASE_MS = 60_000


def exported(tmp_path: Path, partition: int = 0) -> str:
    """An export of a data directory's state partition: a snapshot and updates."""
    data_dir = str(tmp_path / "data")
    log = StateLog.open(data_dir, NUM_PARTITIONS)
    try:
        part = log.partition(partition)
        part.open()
        key = ShareKey("group", TOPIC, 7)
        part.append(*encode_record(ShareSnapshot(key, 0, 1, 1, 10, 1, 1, [])), 1)
        for n in range(3):
            part.append(*encode_record(ShareUpdate(key, 0, 1, 11 + n, [])), 2)
        part.commit()
    finally:
        log.close()
    out = str(tmp_path / "export")
    export_partition(data_dir, partition, out)
    return out


def schema_exists(server: PostgresServer, schema: str) -> bool:
    return server.execute(f"SELECT to_regclass('{schema}.sharecoord_schema') IS NOT NULL") == "t"


def test_an_import_fences_the_node_that_led_the_partition_before(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A node whose lease ran out but which still holds its epoch (paused, say) cannot
    commit after the import: its commit is refused by the epoch check, not by a clash
    of offsets."""
    source = exported(tmp_path)
    schema = fresh_schema()
    old = PostgresStore.open(postgres.uri(), NUM_PARTITIONS, 1, schema=schema)
    try:
        epoch = old.claim(0, LEASE_MS)
        assert epoch is not None
        part = old.partition(0)
        part.open()
        with old.connection("test") as conn:
            assert release(conn, old.tables, 1, [0]) == [0]
        done = import_into_postgres(postgres.uri(), schema, source)
        assert done.epoch == epoch + 1
        key = ShareKey("group", TOPIC, 9)
        part.append(*encode_record(ShareSnapshot(key, 0, 1, 1, 0, 1, 1, [])), 5)
        batch = part.take_pending()
        assert batch is not None
        result = old.commit_cycle([(0, batch)])
        assert isinstance(result.errors[0], NotLeaderError), result.errors
    finally:
        old.close()


def test_a_damaged_export_is_refused_before_the_store_is_touched(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    source = Path(exported(tmp_path))
    segment = next(source.glob("*.log"))
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    schema = fresh_schema()
    with pytest.raises(ToolError) as refused:
        import_into_postgres(postgres.uri(), schema, str(source))
    assert refused.value.code == 1 and "damaged" in str(refused.value)
    assert not schema_exists(postgres, schema)


def test_a_store_of_another_partition_count_is_refused_and_left_as_it_was(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    source = exported(tmp_path)
    schema = fresh_schema()
    PostgresStore.open(postgres.uri(), NUM_PARTITIONS + 1, 1, schema=schema).close()
    with pytest.raises(ToolError) as refused:
        import_into_postgres(postgres.uri(), schema, source)
    assert refused.value.code == 1
    assert "another number of state partitions" in str(refused.value)
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_records") == "0"


def test_an_export_from_the_store_holds_its_records_byte_for_byte(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Data directory -> store -> export: the segments are the data directory's own,
    byte for byte (the same frames, in the same offsets)."""
    source = exported(tmp_path)
    schema = fresh_schema()
    import_into_postgres(postgres.uri(), schema, source)
    again = export_from_postgres(postgres.uri(), schema, 0, str(tmp_path / "again"))
    first = sorted(Path(source).glob("*.log"))
    second = sorted((tmp_path / "again").glob("*.log"))
    assert [p.name for p in first] == [p.name for p in second]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert again.manifest.records == 4
    # An empty partition exports too: one empty segment at offset 0.
    empty = export_from_postgres(postgres.uri(), schema, 1, str(tmp_path / "empty"))
    assert (empty.manifest.records, [s.size for s in empty.manifest.segments]) == (0, [0])


def test_an_import_killed_before_its_commit_leaves_the_store_as_it_was(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """SIGKILL of the import while its transaction has COPYed every record (it is held
    at the keys rows by a lock this test takes): none of its records stays, the epoch
    is unmoved, and the same import run again does the whole job."""
    source = exported(tmp_path)
    schema = fresh_schema()
    PostgresStore.open(postgres.uri(), NUM_PARTITIONS, 1, schema=schema).close()
    key = encode_record(ShareSnapshot(ShareKey("group", TOPIC, 7), 0, 1, 1, 10, 1, 1, []))[1]
    # A keys row without records (the import writes over such a row), locked by a
    # transaction held open: the import's upsert of it waits, after its COPY.
    postgres.execute(
        f"INSERT INTO {schema}.sharecoord_keys VALUES (0, '\\x{key.hex()}'::bytea, 0, true)"
    )
    epoch_before = postgres.execute(
        f"SELECT epoch FROM {schema}.sharecoord_leaders WHERE state_partition = 0"
    )
    args = ["partition", "import", "--state-store", postgres.uri()]
    args += ["--state-store-schema", schema, "--from", source]
    with psycopg.connect(postgres.uri()) as holder:
        holder.execute(
            f"SELECT * FROM {schema}.sharecoord_keys WHERE state_partition = 0 FOR UPDATE"
        )
        child = subprocess.Popen([*SHARECOORD, *args], env=child_env(), cwd=REPO_ROOT)
        try:
            wait_until_blocking(
                lambda: (
                    postgres.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'sharecoord' AND wait_event_type = 'Lock'"
                    )
                    == "1"
                ),
                "the import to wait for the keys row, its records COPYed",
            )
            child.kill()
        finally:
            child.wait()
        holder.rollback()
    wait_until_blocking(
        lambda: (
            postgres.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sharecoord'"
            )
            == "0"
        ),
        "the killed import's backend to end",
    )
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_records") == "0"
    assert epoch_before == postgres.execute(
        f"SELECT epoch FROM {schema}.sharecoord_leaders WHERE state_partition = 0"
    )
    done = import_into_postgres(postgres.uri(), schema, source)
    assert not done.already and done.manifest.records == 4
    assert postgres.execute(f"SELECT count(*) FROM {schema}.sharecoord_records") == "4"
