"""What a user would otherwise pick: PostgreSQL 15 and Redis 7, doing the same logical work.

Each stores one row/key per share-partition (its state as a ~100-byte blob) and
replaces it durably on every write: PostgreSQL with `INSERT ... ON CONFLICT DO UPDATE`
and synchronous_commit on (the default), Redis with `appendfsync always`. Batched writes
upsert 50 share-partitions in one statement / one MSET. The peers only overwrite a
blob; sharecoord also merges the new batches into the stored ones.

Both run on loopback with private data directories and ports, pinned to the server
CPU; pgbench and redis-benchmark run on the generator CPU at the same concurrency.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.loadgen import LoadResult, _children_cpu
from bench.system import (
    CpuMeter,
    free_port,
    generator_cpus,
    pinned,
    postgres_bin,
    running,
    server_cpus,
    wait_for_port,
)
from bench.workload import GROUPS, PARTITIONS_PER_GROUP, TOPIC_ID

BLOB = "ab" * 50  # 100 bytes of state, about a sharecoord record's size


# --- PostgreSQL ---------------------------------------------------------------------------


def _as_postgres(argv: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user."""
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@contextmanager
def postgres(workdir: Path) -> Iterator[tuple[int, int]]:
    """A private PostgreSQL 15 on loopback: yields (port, postmaster pid)."""
    data = workdir / "pgdata"
    sockets = workdir / "pgsock"
    sockets.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        # The server runs as the postgres user: it must reach its directories.
        os.chmod(workdir.parent, 0o755)
        shutil.chown(workdir, "postgres")
        shutil.chown(sockets, "postgres")
    _checked(
        _as_postgres(
            [postgres_bin("initdb"), "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8"]
        )
    )
    port = free_port()
    argv = pinned(
        server_cpus(),
        _as_postgres(
            [
                postgres_bin("postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-k",
                str(sockets),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "synchronous_commit=on",
                "-c",
                "fsync=on",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=256MB",
            ]
        ),
    )
    with running(argv, log=str(workdir / "postgres.log")) as proc:
        wait_for_port(port)
        _psql(
            port,
            "CREATE TABLE share_state (group_id text, topic_id text, partition int, "
            "state text, PRIMARY KEY (group_id, topic_id, partition));"
            f"INSERT INTO share_state SELECT 'bench-group-' || g, '{TOPIC_ID}', p, '{BLOB}' "
            f"FROM generate_series(0, {GROUPS - 1}) g, "
            f"generate_series(0, {PARTITIONS_PER_GROUP - 1}) p;",
        )
        yield port, proc.pid


def _checked(argv: list[str]) -> None:
    """Run a setup command; on failure, say what it printed."""
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")


def _psql(port: int, sql: str) -> None:
    _checked(
        [
            postgres_bin("psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "bench",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-c",
            sql,
        ]
    )


_PG_SINGLE = f"""\\set g random(0, {GROUPS - 1})
\\set p random(0, {PARTITIONS_PER_GROUP - 1})
INSERT INTO share_state VALUES ('bench-group-' || :g, '{TOPIC_ID}', :p, '{BLOB}')
  ON CONFLICT (group_id, topic_id, partition) DO UPDATE SET state = EXCLUDED.state;
"""

_PG_BATCH = f"""\\set g random(0, {GROUPS - 1})
\\set base random(0, 1)
INSERT INTO share_state
  SELECT 'bench-group-' || :g, '{TOPIC_ID}', p, '{BLOB}'
  FROM generate_series(:base * 50, :base * 50 + 49) p
  ON CONFLICT (group_id, topic_id, partition) DO UPDATE SET state = EXCLUDED.state;
"""


def run_pgbench(
    name: str,
    port: int,
    server_pid: int,
    workdir: Path,
    *,
    concurrency: int,
    duration_s: float,
    batch: bool,
) -> LoadResult:
    script = workdir / ("batch.sql" if batch else "single.sql")
    script.write_text(_PG_BATCH if batch else _PG_SINGLE)
    logs = workdir / f"pglog-{name}-{concurrency}"
    for old in glob.glob(f"{logs}*"):
        os.unlink(old)
    argv = pinned(
        generator_cpus(),
        [
            postgres_bin("pgbench"),
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "bench",
            "-c",
            str(concurrency),
            "-j",
            str(min(concurrency, 2)),
            "-T",
            f"{duration_s:g}",
            "-M",
            "prepared",
            "-f",
            str(script),
            "-l",
            f"--log-prefix={logs}",
            "postgres",
        ],
    )
    server = CpuMeter(server_pid)
    server.start()
    before = _children_cpu()
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    elapsed = time.monotonic() - started
    generator_share = (_children_cpu() - before) / elapsed
    server_share = server.share()
    latencies_us: list[int] = []
    for path in glob.glob(f"{logs}*"):
        with open(path, encoding="ascii") as f:
            latencies_us += [int(line.split()[2]) for line in f if line.strip()]
    tps = next(
        float(line.split("=")[1].split()[0])
        for line in out.stdout.splitlines()
        if line.startswith("tps =")
    )
    return LoadResult(
        name=name,
        concurrency=concurrency,
        requests_per_s=tps,
        p50_ms=_percentile(latencies_us, 50) / 1000,
        p99_ms=_percentile(latencies_us, 99) / 1000,
        requests=len(latencies_us),
        non_2xx=0,
        errors=0,
        server_cpu=round(server_share, 3),
        generator_cpu=round(generator_share, 3),
        items_per_request=50 if batch else 1,
    )


def _percentile(values: list[int], pct: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    index = min(len(values) - 1, max(0, round(pct / 100 * len(values)) - 1))
    return float(values[index])


# --- Redis --------------------------------------------------------------------------------


@contextmanager
def redis(workdir: Path) -> Iterator[tuple[int, int]]:
    """A private Redis 7 with appendfsync always: yields (port, pid)."""
    directory = workdir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = pinned(
        server_cpus(),
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "no",
        ],
    )
    with running(argv, log=str(workdir / "redis.log")) as proc:
        wait_for_port(port)
        yield port, proc.pid


def run_redis_benchmark(
    name: str, port: int, server_pid: int, *, concurrency: int, duration_s: float, batch: bool
) -> LoadResult:
    if batch:
        command = ["MSET"] + [part for _ in range(50) for part in ("bench:__rand_int__", BLOB)]
    else:
        command = ["SET", "bench:__rand_int__", BLOB]

    def run(requests: int) -> tuple[subprocess.CompletedProcess[str], float, float]:
        argv = pinned(
            generator_cpus(),
            [
                "redis-benchmark",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-c",
                str(concurrency),
                "-n",
                str(requests),
                "-r",
                str(GROUPS * PARTITIONS_PER_GROUP),
                "--csv",
                *command,
            ],
        )
        before = _children_cpu()
        started = time.monotonic()
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        elapsed = time.monotonic() - started
        return out, elapsed, (_children_cpu() - before) / elapsed

    # Size the run to last about duration_s: a short calibration first.
    calibration, elapsed, _ = run(max(concurrency * 20, 500))
    rate = _redis_rows(calibration.stdout)[0]
    server = CpuMeter(server_pid)
    server.start()
    out, elapsed, generator_share = run(max(int(rate * duration_s), concurrency * 20))
    server_share = server.share()
    rps, p50, p99 = _redis_rows(out.stdout)
    return LoadResult(
        name=name,
        concurrency=concurrency,
        requests_per_s=rps,
        p50_ms=p50,
        p99_ms=p99,
        requests=int(rps * elapsed),
        non_2xx=0,
        errors=0,
        server_cpu=round(server_share, 3),
        generator_cpu=round(generator_share, 3),
        items_per_request=50 if batch else 1,
    )


def _redis_rows(text: str) -> tuple[float, float, float]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise RuntimeError(f"redis-benchmark printed nothing usable:\n{text}")
    row = rows[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])
