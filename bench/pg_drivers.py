"""asyncpg against psycopg 3 for the PostgreSQL store (docs/design.md#the-postgresql-store).

    python -m bench.pg_drivers [--seconds S]

Starts a primary with a synchronous standby (tests/postgres.py), then, on one
connection per driver, times the store's commit transaction: lock the epoch rows of the
cycle's partitions FOR SHARE, COPY the records (~120 bytes each: a 40-byte key, a 60-byte
value, the numbers), COMMIT; in batches of 1, 50 and 500 records, the drivers
interleaved round by round so that a busy machine slows both alike. Then whether each
driver, given libpq's multi-host URI with target_session_attrs=read-write, reaches the
standby once the primary is SIGKILLed and the standby promoted. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import psycopg

from tests.postgres import PostgresServer, running_servers, server_root

BATCHES = (1, 50, 500)
ROUNDS = 3
KEY = bytes(40)
VALUE = bytes(60)
SCHEMA = """
CREATE TABLE leaders (state_partition int PRIMARY KEY, epoch bigint NOT NULL);
INSERT INTO leaders SELECT p, 1 FROM generate_series(0, 49) p;
CREATE TABLE records (
    state_partition int NOT NULL, "offset" bigint NOT NULL, record_type smallint NOT NULL,
    key bytea NOT NULL, value bytea, "timestamp" bigint NOT NULL,
    PRIMARY KEY (state_partition, "offset"));
"""
LOCK = "SELECT state_partition, epoch FROM leaders WHERE state_partition = ANY($1) FOR SHARE"
COLUMNS = ["state_partition", "offset", "record_type", "key", "value", "timestamp"]


def rows(partition: int, first: int, count: int) -> list[tuple[Any, ...]]:
    now = time.time_ns() // 1_000_000
    return [(partition, first + i, 1, KEY, VALUE, now) for i in range(count)]


class Timings:
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.records = 0

    def row(self, driver: str, batch: int) -> str:
        ms = sorted(s * 1000 for s in self.seconds)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        rate = self.records / sum(self.seconds)
        return (
            f"| {driver} | {batch} | {statistics.median(ms):.2f} ms | {p99:.2f} ms | {rate:,.0f} |"
        )


async def asyncpg_round(
    conn: Any, partition: int, batch: int, seconds: float, t: Timings, offset: list[int]
) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        records = rows(partition, offset[0], batch)
        started = time.perf_counter()
        async with conn.transaction():
            await conn.fetch(LOCK, [partition])
            await conn.copy_records_to_table("records", records=records, columns=COLUMNS)
        t.seconds.append(time.perf_counter() - started)
        t.records += batch
        offset[0] += batch


def psycopg_round(
    conn: psycopg.Connection[Any],
    partition: int,
    batch: int,
    seconds: float,
    t: Timings,
    offset: list[int],
) -> None:
    deadline = time.perf_counter() + seconds
    lock = LOCK.replace("$1", "%s")
    copy_sql = (
        'COPY records (state_partition, "offset", record_type, key, value, '
        '"timestamp") FROM STDIN (FORMAT BINARY)'
    )
    while time.perf_counter() < deadline:
        records = rows(partition, offset[0], batch)
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(lock, ([partition],))
            with cur.copy(copy_sql) as copy:
                copy.set_types(["int4", "int8", "int2", "bytea", "bytea", "int8"])
                for record in records:
                    copy.write_row(record)
        t.seconds.append(time.perf_counter() - started)
        t.records += batch
        offset[0] += batch


async def throughput(primary: PostgresServer, seconds: float) -> list[str]:
    apg = await asyncpg.connect(primary.uri())
    pg = await asyncio.to_thread(psycopg.connect, primary.uri(), autocommit=True)
    lines = []
    try:
        offsets = {"asyncpg": [0], "psycopg": [0]}
        for batch in BATCHES:
            timings = {"asyncpg": Timings(), "psycopg": Timings()}
            for _ in range(ROUNDS):
                await asyncpg_round(apg, 1, batch, seconds, timings["asyncpg"], offsets["asyncpg"])
                await asyncio.to_thread(
                    psycopg_round, pg, 2, batch, seconds, timings["psycopg"], offsets["psycopg"]
                )
            lines += [timings[d].row(d, batch) for d in ("asyncpg", "psycopg")]
    finally:
        await apg.close()
        await asyncio.to_thread(pg.close)
    return lines


async def follows_promote(root: str, servers: list[PostgresServer]) -> list[str]:
    """Each driver, given the multi-host URI: reaches the primary, then, once it is
    killed and its standby promoted, the standby."""
    primary = PostgresServer.primary(root, "fo-primary")
    servers.append(primary)
    standby = primary.standby("fo-standby", synchronous=True)
    servers.append(standby)
    uri = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        "?target_session_attrs=read-write"
    )
    port_sql = "SELECT current_setting('port')"

    async def by_asyncpg() -> str:
        conn = await asyncpg.connect(uri)
        try:
            return str(await conn.fetchval(port_sql))
        finally:
            await conn.close()

    def by_psycopg() -> str:
        with psycopg.connect(uri) as conn:
            row = conn.execute(port_sql).fetchone()
            assert row is not None
            return str(row[0])

    checks: dict[str, Callable[[], Any]] = {
        "asyncpg": by_asyncpg,
        "psycopg": lambda: asyncio.to_thread(by_psycopg),
    }
    before = {name: await check() for name, check in checks.items()}
    primary.kill()
    promote_s = await asyncio.to_thread(standby.promote)
    after = {}
    for name, check in checks.items():
        started = time.perf_counter()
        try:
            port = await check()
            after[name] = f"port {port} in {1000 * (time.perf_counter() - started):.0f} ms"
        except Exception as exc:
            after[name] = f"failed: {type(exc).__name__}: {exc}"
    return [
        f"| {name} | port {before[name]} (primary {primary.port}) | {after[name]} "
        f"(standby {standby.port}, promote {promote_s:.2f} s) |"
        for name in checks
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per driver, batch, round")
    args = parser.parse_args()
    with server_root() as root, running_servers() as servers:
        primary = PostgresServer.primary(root)
        servers.append(primary)
        servers.append(primary.standby(synchronous=True))
        for statement in SCHEMA.strip().split(";\n"):
            primary.execute(statement)
        print(
            f"asyncpg {asyncpg.__version__}, psycopg {psycopg.__version__} "
            f"({psycopg.pq.__impl__}, libpq {psycopg.pq.version()}), "
            f"PostgreSQL {primary.execute('SHOW server_version')}, synchronous standby"
        )
        print("| driver | records per transaction | commit p50 | commit p99 | records/s |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for line in await throughput(primary, args.seconds):
            print(line)
        print()
        print("| driver | multi-host URI before | after SIGKILL + promote |")
        print("| --- | --- | --- |")
        for line in await follows_promote(root, servers):
            print(line)


if __name__ == "__main__":
    asyncio.run(main())
