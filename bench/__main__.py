"""`make bench`: sharecoord next to its ceiling and its peers, in one run on one machine.

    python -m bench [--quick]
                    [--only http,kafka,kafka-peer,latency,peers,cluster,commit,entry,recovery,
                            memory,spark]
                    (or compact,audit,source,spark-pg: parts of spark;
                     spark-pg-read: spark-pg's raw reads alone)
                    [--duration S]

`cluster` runs writes on the PostgreSQL store beside the local one and a node's
failover (bench/cluster.py). `peers` runs both kinds of peer; `blind-peers` or
`equal-work` runs one kind alone.
`kafka-peer` runs Kafka 4.4.0's own share coordinator next to sharecoord's Kafka
listener (bench/kafka_peer.py; its jars come from `make kafka-peer`).

Writes bench/results/latest.{json,md,png} and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import entry_cost, equal_work, group_commit, peers, report
from bench.kafka_load import run_kafka_load, write_frames
from bench.loadgen import LoadResult, run_wrk
from bench.logs import build_log
from bench.open_loop import CommitCounts, OpenLoopResult, run_open_loop
from bench.system import (
    describe_machine,
    ensure_debian_packages,
    free_port,
    pinned,
    python_env,
    running,
    server_cpus,
    wait_for_port,
)
from bench.workload import build_body_files, initialize_all, write_bodies

RESULTS = Path(__file__).resolve().parent / "results"
WRITE = "/v1/share-group-state/write"
READ = "/v1/share-group-state/read"
READ_SUMMARY = "/v1/share-group-state/read-summary"


def _daemon_argv(data: Path, port: int, log_level: str, *extra: str) -> list[str]:
    """`sharecoord serve` on a data directory, pinned to the server CPU."""
    return pinned(
        server_cpus(),
        [sys.executable, "-m", "server.commands.cli", "serve", "--data-dir", str(data),
         "--listen", f"127.0.0.1:{port}", "--log-level", log_level, *extra],
    )  # fmt: skip


def _say(text: str) -> None:
    print(text, flush=True)


def http_scenarios(
    work: Path, bodies: dict[str, Path], duration: float, quick: bool
) -> list[LoadResult]:
    results: list[LoadResult] = []
    concurrencies = (1, 16, 64)

    port = free_port()
    _say("ceiling: aiohttp + msgpack decode, no work")
    with running(
        pinned(server_cpus(), [sys.executable, "-m", "bench.ceiling", str(port)]),
        env=python_env(),
        log=str(work / "ceiling.log"),
    ) as proc:
        wait_for_port(port)
        url = f"http://127.0.0.1:{port}{WRITE}"
        for c in concurrencies:
            results.append(
                run_wrk(
                    "ceiling",
                    url,
                    bodies["write"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            _say(f"  c={c}: {results[-1].requests_per_s:,.0f} req/s")

    port = free_port()
    data = work / "sharecoord-data"
    _say("sharecoord: the daemon, fresh data directory")
    with running(
        _daemon_argv(data, port, "warning"), env=python_env(), log=str(work / "sharecoord.log")
    ) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        for c in concurrencies:
            results.append(
                run_wrk(
                    "sharecoord write",
                    base + WRITE,
                    bodies["write"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            _say(
                f"  write c={c}: {results[-1].requests_per_s:,.0f} req/s, "
                f"p99 {results[-1].p99_ms:.2f} ms"
            )
        for c in (16, 64):
            results.append(
                run_wrk(
                    "sharecoord write x50",
                    base + WRITE,
                    bodies["write_batch"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                    items_per_request=50,
                )
            )
            _say(f"  batched write c={c}: {results[-1].items_per_s:,.0f} share-partitions/s")
        if not quick:
            results.append(
                run_wrk(
                    "sharecoord write json",
                    base + WRITE,
                    bodies["write_json"],
                    concurrency=16,
                    duration_s=duration,
                    server_pid=proc.pid,
                    content_type="application/json",
                )
            )
        for c in (1, 16):
            results.append(
                run_wrk(
                    "sharecoord read",
                    base + READ,
                    bodies["read"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            results.append(
                run_wrk(
                    "sharecoord read-summary",
                    base + READ_SUMMARY,
                    bodies["read_summary"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
        _check_no_errors(base)
    return results


def kafka_scenarios(work: Path, duration: float) -> list[LoadResult]:
    """The Kafka listener next to its ceiling (a null Kafka-protocol handler) and to HTTP
    on the same daemon: single writes at c=1/16/64, batched writes (50 entries)."""
    import random  # noqa: PLC0415

    rng = random.Random(1313)
    directory = work / "kafka-frames"
    directory.mkdir(parents=True, exist_ok=True)
    single = write_frames(write_bodies(rng, 20_000, 1), directory / "write-1.kafka")
    batched = write_frames(write_bodies(rng, 4_000, 50), directory / "write-50.kafka")
    bodies = build_body_files(work / "bodies")
    results: list[LoadResult] = []
    concurrencies = (1, 16, 64)

    port = free_port()
    _say("kafka ceiling: a null Kafka-protocol handler (parse the frame, fixed answer)")
    with running(
        pinned(server_cpus(), [sys.executable, "-m", "bench.kafka_null", str(port)]),
        env=python_env(),
        log=str(work / "kafka-null.log"),
    ) as proc:
        wait_for_port(port)
        for c in concurrencies:
            results.append(
                run_kafka_load(
                    "kafka ceiling",
                    port,
                    single,
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            _say(f"  c={c}: {results[-1].requests_per_s:,.0f} req/s")

    port, kafka_port = free_port(), free_port()
    data = work / "sharecoord-kafka-data"
    _say("sharecoord over the Kafka listener, and over HTTP on the same daemon")
    argv = _daemon_argv(data, port, "warning", "--kafka-listener", f"127.0.0.1:{kafka_port}")
    with running(argv, env=python_env(), log=str(work / "sharecoord-kafka.log")) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        for c in concurrencies:
            results.append(
                run_kafka_load(
                    "sharecoord kafka write",
                    kafka_port,
                    single,
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            _say(
                f"  kafka write c={c}: {results[-1].requests_per_s:,.0f} req/s, "
                f"p99 {results[-1].p99_ms:.2f} ms"
            )
        for c in (16, 64):
            results.append(
                run_kafka_load(
                    "sharecoord kafka write x50",
                    kafka_port,
                    batched,
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                    items_per_request=50,
                )
            )
            _say(f"  kafka batched write c={c}: {results[-1].items_per_s:,.0f} share-partitions/s")
        for c in concurrencies:
            results.append(
                run_wrk(
                    "sharecoord http write (same daemon)",
                    base + WRITE,
                    bodies["write"],
                    concurrency=c,
                    duration_s=duration,
                    server_pid=proc.pid,
                )
            )
            _say(f"  http write c={c}: {results[-1].requests_per_s:,.0f} req/s")
        _check_no_errors(base)
    return results


LOAD_SHARES = (0.25, 0.5, 0.75)


def latency_scenarios(work: Path, duration: float) -> tuple[list[LoadResult], list[OpenLoopResult]]:
    """Single writes at a fixed rate (bench/open_loop.py): 25%, 50% and 75% of the
    maximum each protocol reached in a closed loop (c=64) on the same daemon just before,
    over HTTP and over the Kafka listener; then aiohttp's null handler and the null
    Kafka-protocol server at the same rates. Returns the closed-loop maxima and the
    open-loop rows."""
    import random  # noqa: PLC0415

    directory = work / "latency"
    directory.mkdir(parents=True, exist_ok=True)
    kafka_frames = write_frames(write_bodies(random.Random(1313), 20_000, 1), directory / "w.kafka")
    bodies = build_body_files(work / "bodies")
    maxima: list[LoadResult] = []
    rows: list[OpenLoopResult] = []
    port, kafka_port = free_port(), free_port()
    _say("latency: single writes at 25/50/75% of the closed-loop maximum (open loop)")
    argv = _daemon_argv(
        work / "latency-data", port, "warning", "--kafka-listener", f"127.0.0.1:{kafka_port}"
    )
    with running(argv, env=python_env(), log=str(work / "latency.log")) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        http_max = run_wrk(
            "latency: sharecoord http write max", base + WRITE, bodies["write"],
            concurrency=64, duration_s=duration, server_pid=proc.pid,
        )  # fmt: skip
        kafka_max = run_kafka_load(
            "latency: sharecoord kafka write max", kafka_port, kafka_frames,
            concurrency=64, duration_s=duration, server_pid=proc.pid,
        )  # fmt: skip
        maxima += [http_max, kafka_max]
        _say(
            f"  maxima: http {http_max.requests_per_s:,.0f} req/s, "
            f"kafka {kafka_max.requests_per_s:,.0f} req/s"
        )
        for share in LOAD_SHARES:
            for protocol, at_port, requests, top in (
                ("http", port, bodies["write"], http_max.requests_per_s),
                ("kafka", kafka_port, kafka_frames, kafka_max.requests_per_s),
            ):
                rows.append(
                    run_open_loop(
                        "sharecoord", protocol, at_port, requests,
                        rate=share * top, duration_s=duration, load_share=share,
                        server_pid=proc.pid, commits=functools.partial(commit_counts, base),
                    )
                )  # fmt: skip
                _say(_open_loop_line(rows[-1]))
        _check_no_errors(base)
    for protocol, module, requests, top in (
        ("http", "bench.ceiling", bodies["write"], http_max.requests_per_s),
        ("kafka", "bench.kafka_null", kafka_frames, kafka_max.requests_per_s),
    ):
        port = free_port()
        null = pinned(server_cpus(), [sys.executable, "-m", module, str(port)])
        with running(null, env=python_env(), log=str(work / f"{module}.log")) as null_proc:
            wait_for_port(port)
            for share in LOAD_SHARES:
                rows.append(
                    run_open_loop(
                        "null server", protocol, port, requests,
                        rate=share * top, duration_s=duration, load_share=share,
                        server_pid=null_proc.pid,
                    )
                )  # fmt: skip
                _say(_open_loop_line(rows[-1]))
    return maxima, rows


def _open_loop_line(row: OpenLoopResult) -> str:
    return (
        f"  {row.name} {row.protocol} at {row.load_share:.0%} ({row.offered_per_s:,.0f}/s): "
        f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms, p99.9 {row.p999_ms:.2f} ms"
    )


def _wait_ready(base: str, deadline_s: float = 300) -> float:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{base} not ready after {deadline_s}s")


def _wait_folded(base: str, deadline_s: float = 300) -> float:
    """Seconds until no key waits for the background fold of a lazy load
    (``sharecoord_keys_unfolded`` is 0 on every partition), from now."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        unfolded = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("sharecoord_keys_unfolded{")
        )
        if unfolded == 0:
            return time.monotonic() - started
        # Each look renders every metric on the daemon's loop (~3 ms): every 20 ms took
        # a seventh of the loop from the folds it times.
        time.sleep(0.1)
    raise TimeoutError(f"{base}: keys still unfolded after {deadline_s}s")


def commit_counts(base: str) -> CommitCounts:
    """The daemon's commit cycles so far, by how long their journal flush took."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        return CommitCounts.parse(response.read().decode())


def commit_cycles(base: str) -> int:
    """The daemon's group commit cycles so far, from its metrics."""
    return commit_counts(base).cycles


def _check_no_errors(base: str) -> None:
    """Every partition entry of the runs must have succeeded: a benchmark of errors
    measures nothing."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    failed = [
        line
        for line in text.splitlines()
        if line.startswith("sharecoord_partition_results_total")
        and 'error_code="0"' not in line
        and not line.endswith(" 0")
        and not line.endswith(" 0.0")
    ]
    if failed:
        raise RuntimeError("sharecoord answered errors during the benchmark:\n" + "\n".join(failed))


def peer_scenarios(
    work: Path, bodies: dict[str, Path], duration: float, *, blind: bool, equal: bool
) -> list[LoadResult]:
    """PostgreSQL 15 and Redis 7: the blind overwrite (pgbench, redis-benchmark) and the
    equal-work peers (bench/equal_work.py), each kind on the same server instance."""
    ensure_debian_packages(
        {
            "redis-server": "redis-server",
            "redis-benchmark": "redis-tools",
            "postgres": "postgresql-15",
            "pgbench": "postgresql-15",
        }
    )
    results: list[LoadResult] = []
    pg_dir = work / "postgres"
    pg_dir.mkdir()
    with peers.postgres(pg_dir) as (port, pid):
        if blind:
            _say("PostgreSQL 15: INSERT ... ON CONFLICT DO UPDATE, synchronous_commit on")
            for c in (1, 16, 64):
                results.append(
                    peers.run_pgbench(
                        "postgres upsert",
                        port,
                        pid,
                        pg_dir,
                        concurrency=c,
                        duration_s=duration,
                        batch=False,
                    )
                )
                _say(f"  c={c}: {results[-1].requests_per_s:,.0f} tps")
            for c in (16, 64):
                results.append(
                    peers.run_pgbench(
                        "postgres upsert x50",
                        port,
                        pid,
                        pg_dir,
                        concurrency=c,
                        duration_s=duration,
                        batch=True,
                    )
                )
                _say(f"  x50 c={c}: {results[-1].items_per_s:,.0f} rows/s")
        if equal:
            _say("PostgreSQL 15, equal work: PL/pgSQL fence + Kafka's merge, synchronous_commit on")
            results += equal_work.scenarios(
                equal_work.PostgresPeer(port),
                "postgres equal-work",
                pid,
                bodies,
                work / "equal-work",
                duration,
            )
    with peers.redis(work) as (port, pid):
        if blind:
            _say("Redis 7: SET / MSET, appendfsync always")
            for c in (1, 16, 64):
                results.append(
                    peers.run_redis_benchmark(
                        "redis set", port, pid, concurrency=c, duration_s=duration, batch=False
                    )
                )
                _say(f"  c={c}: {results[-1].requests_per_s:,.0f} req/s")
            for c in (16, 64):
                results.append(
                    peers.run_redis_benchmark(
                        "redis mset x50", port, pid, concurrency=c, duration_s=duration, batch=True
                    )
                )
                _say(f"  x50 c={c}: {results[-1].items_per_s:,.0f} keys/s")
        if equal:
            _say("Redis 7, equal work: a Lua function (fence + Kafka's merge), appendfsync always")
            results += equal_work.scenarios(
                equal_work.RedisPeer(port),
                "redis equal-work",
                pid,
                bodies,
                work / "equal-work",
                duration,
            )
    return results


def recovery_scenario(work: Path, records: int) -> dict[str, Any]:
    _say(f"recovery: building a log of {records:,} records")
    data = work / "recovery-data"
    built = build_log(data, records, progress=False)
    _say(
        f"  built {built.records:,} records, {built.bytes / 2**20:.0f} MiB, "
        f"in {built.seconds:.0f}s; starting the daemon on it"
    )
    port = free_port()
    log = work / "recovery.log"
    with running(_daemon_argv(data, port, "info"), env=python_env(), log=str(log)):
        _wait_ready(f"http://127.0.0.1:{port}")
        folded = _wait_folded(f"http://127.0.0.1:{port}")
    match = re.search(r"loaded \d+ state partitions in ([\d.]+)s", log.read_text())
    if not match:
        raise RuntimeError(f"the daemon did not report its load time:\n{log.read_text()[-2000:]}")
    seconds = float(match.group(1))
    _say(f"  loaded in {seconds:.2f}s; every key folded {folded:.2f}s after ready")
    return {
        "name": "daemon load (records read and checked; the merges follow in the background)",
        "records": built.records,
        "seconds": seconds,
        "records_per_s": built.records / seconds,
        "note": f"{built.keys:,} share-partitions, {built.bytes / 2**20:.0f} MiB of log; "
        f"every key folded {folded:.1f} s after ready",
    }


def ready_scenario(work: Path, share_partitions: int) -> dict[str, Any]:
    """A node's failover time: from the daemon's start to /readyz 200 on a log of
    `share_partitions` keys (each initialized and written twice, as the memory row's
    log), process start, journal catch-up and every partition's load included."""
    writes = 3
    _say(f"recovery: building a log of {share_partitions:,} share-partitions")
    built = build_log(
        work / "ready-data", share_partitions * writes, writes_per_key=writes, progress=False
    )
    port = free_port()
    started = time.monotonic()
    with running(_daemon_argv(built.data_dir, port, "warning"), env=python_env(), log=os.devnull):
        _wait_ready(f"http://127.0.0.1:{port}")
        seconds = time.monotonic() - started
        folded = _wait_folded(f"http://127.0.0.1:{port}")
    _say(f"  ready in {seconds:.2f}s; every key folded {folded:.2f}s after")
    return {
        "name": f"node ready, {built.keys:,} share-partitions (start to /readyz 200)",
        "records": built.records,
        "seconds": seconds,
        "records_per_s": built.records / seconds,
        "note": f"{built.bytes / 2**20:.0f} MiB of log; goal <= 3 s; "
        f"every key folded {folded:.1f} s after ready",
    }


def _resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _rss_when_ready(data: Path) -> int:
    """The daemon's resident set once it has loaded `data`, serves, and has folded every
    key (after a moment for the load's garbage to be collected)."""
    port = free_port()
    with running(_daemon_argv(data, port, "warning"), env=python_env(), log=os.devnull) as proc:
        _wait_ready(f"http://127.0.0.1:{port}")
        _wait_folded(f"http://127.0.0.1:{port}")  # no tail held for a fold any more
        time.sleep(1.0)
        return _resident_bytes(proc.pid)


def memory_scenario(work: Path, share_partitions: int) -> dict[str, Any]:
    """Resident memory per idle share-partition: the daemon's RSS after loading a log of
    `share_partitions` keys (each initialized and then written three times, so it holds
    a few in-flight batches), less its RSS on an empty data directory."""
    writes = 3
    _say(f"memory: building a log of {share_partitions:,} share-partitions")
    built = build_log(
        work / "memory-data",
        share_partitions * writes,
        writes_per_key=writes,
        progress=False,
    )
    empty = _rss_when_ready(work / "memory-empty")
    loaded = _rss_when_ready(built.data_dir)
    per_key = (loaded - empty) / built.keys
    _say(f"  {per_key:,.0f} bytes resident per share-partition")
    # bench/gc_pause.py, in a fresh interpreter: the same state, loaded the same way.
    pause = json.loads(
        subprocess.run(
            [sys.executable, "-m", "bench.gc_pause", str(built.data_dir)],
            env=python_env(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    _say(
        f"  a full garbage collection: {pause['full_collection_ms']:.1f} ms, "
        f"{pause['tracked_objects']:,} tracked objects"
    )
    return {
        "name": "resident memory per idle share-partition",
        "share_partitions": built.keys,
        "rss_empty_mib": empty / 2**20,
        "rss_loaded_mib": loaded / 2**20,
        "bytes_per_share_partition": per_key,
        "full_collection_ms": pause["full_collection_ms"],
        "tracked_objects": pause["tracked_objects"],
        "note": f"{built.records:,} records: one initialize and {writes} writes each",
    }


# Each peer row family: (label in the ratios, single-entry row name, batched row name).
PEER_ROWS = (
    ("Redis appendfsync always", "redis set", "redis mset x50"),
    ("PostgreSQL", "postgres upsert", "postgres upsert x50"),
    ("equal-work Redis", "redis equal-work", "redis equal-work x50"),
    ("equal-work PostgreSQL", "postgres equal-work", "postgres equal-work x50"),
)


def ratios(http: list[LoadResult]) -> dict[str, float]:
    def best(name: str) -> float | None:
        return max((r.items_per_s for r in http if r.name == name), default=None)

    out: dict[str, float] = {}
    sc_batch = best("sharecoord write x50")
    sc_single = best("sharecoord write")
    ceiling = best("ceiling")
    for label, single, batched in PEER_ROWS:
        peer_batch = best(batched)
        peer_single = best(single)
        if sc_batch and peer_batch:
            out[f"batched writes, sharecoord / {label}"] = sc_batch / peer_batch
        if sc_single and peer_single:
            out[f"single writes, sharecoord / {label}"] = sc_single / peer_single
    if sc_single and ceiling:
        out["single writes, sharecoord / ceiling (best of each)"] = sc_single / ceiling

    def at(name: str, concurrency: int) -> float | None:
        rows = [r for r in http if r.name == name and r.concurrency == concurrency]
        return rows[0].requests_per_s if rows else None

    kafka_64 = at("sharecoord kafka write", 64)
    http_64 = at("sharecoord http write (same daemon)", 64)
    null_64 = at("kafka ceiling", 64)
    if kafka_64 and http_64:
        out["single writes c=64, Kafka listener / HTTP (same daemon)"] = kafka_64 / http_64
    if kafka_64 and null_64:
        out["single writes c=64, Kafka listener / null Kafka handler"] = kafka_64 / null_64
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, small logs")
    parser.add_argument(
        "--only",
        default="http,kafka,kafka-peer,latency,peers,cluster,commit,entry,recovery,memory,spark",
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds per load run")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    duration = args.duration or (3.0 if args.quick else 10.0)
    ensure_debian_packages({"wrk": "wrk"})
    if "cluster" in only:
        ensure_debian_packages({"initdb": "postgresql"})
    with tempfile.TemporaryDirectory(prefix="sharecoord-bench-") as tmp:
        work = Path(tmp)
        results: dict[str, Any] = {
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": describe_machine(tmp),
            "duration_s": duration,
            "http": [],
            "notes": [
                "A server's CPU is one core at most (all pinned to one CPU); the generator's "
                "CPU share shows it had room to spare.",
                "The blind-overwrite peers (upsert, set, mset) replace a 100-byte blob per "
                "share-partition: the storage floor. sharecoord also fences and merges the "
                "write's batches into the stored state.",
                "The equal-work peers do what sharecoord does per write (fence, Kafka's merge, "
                "store) in PL/pgSQL and a Redis function, replaying sharecoord's own request "
                "bodies in order with bench/replay.py; before their runs each one stored the "
                "same states as sharecoord's shard after the first "
                f"{equal_work.SAMPLE_SINGLE + 50 * equal_work.SAMPLE_BATCHED} writes.",
                "Kafka rows: bench/kafka_load.py keeps one request in flight per connection "
                "(as Kafka's persister does), pre-encoded WriteShareGroupState v1 frames; "
                "'kafka ceiling' is bench/kafka_null.py, which parses each frame and answers "
                "a fixed response, so its rate is also the generator's own ceiling.",
                "Kafka 4.4.0 rows: Kafka's own share coordinator (a single KRaft broker, "
                "kafka_peer/, 512 MiB heap, its defaults: __share_group_state at replication "
                "factor 1 and, as Kafka does by default, no fsync of its log) next to "
                "sharecoord's Kafka listener (an fsync before every answer), the same "
                "frames from the same generator; each server pinned to CPU 0, and again on "
                "both CPUs (', 2 cores' rows, the generator then sharing CPU 1).",
            ],
        }
        http: list[LoadResult] = []
        blind = bool(only & {"peers", "blind-peers"})
        equal = bool(only & {"peers", "equal-work"})
        if "http" in only or "cluster" in only or blind or equal:
            bodies = build_body_files(work / "bodies")
        if "http" in only:
            http += http_scenarios(work, bodies, duration, args.quick)
        if "kafka" in only:
            http += kafka_scenarios(work, duration)
        restarts: list[dict[str, Any]] = []
        if "kafka-peer" in only:
            from bench import kafka_peer  # noqa: PLC0415 - needs the broker's jars

            _say("Kafka's own share coordinator next to sharecoord's Kafka listener")
            peer_rows, restarts = kafka_peer.scenarios(work, duration)
            http += peer_rows
        if "latency" in only:
            maxima, open_loop = latency_scenarios(work, duration)
            http += maxima
            results["open_loop"] = [row.as_dict() for row in open_loop]
        if blind or equal:
            http += peer_scenarios(work, bodies, duration, blind=blind, equal=equal)
        if "cluster" in only:
            from bench import cluster  # noqa: PLC0415 - needs the postgres extra

            _say("cluster mode: the PostgreSQL store beside the local store, a node's failover")
            cluster_rows, results["failover"] = cluster.scenarios(
                work, bodies, duration, _wait_ready
            )
            http += cluster_rows
        results["http"] = [r.as_dict() for r in http]
        results["ratios"] = ratios(http)
        if "cluster" in only:
            results["ratios"].update(cluster.batched_ratio(cluster_rows))
        if "kafka-peer" in only:
            results["ratios"].update(kafka_peer.ratios(http))
            results["recovery"] = restarts
        if "commit" in only:
            results["group_commit"] = commit_scenario(work, args.quick)
        if "entry" in only:
            results["entry_cost"] = entry_cost_scenario(args.quick)
        if "recovery" in only:
            results["recovery"] = [
                recovery_scenario(work, 100_000 if args.quick else 1_000_000),
                ready_scenario(work, 20_000 if args.quick else 200_000),
                *results.get("recovery", []),
            ]
        if "memory" in only:
            results["memory"] = [memory_scenario(work, 20_000 if args.quick else 200_000)]
        if only & {"spark", "compact", "audit", "source", "spark-pg", "spark-pg-read"}:
            results["spark"] = spark_scenarios(work, args.quick, only)
    paths = report.save(results, RESULTS)
    print(paths["markdown"].read_text())
    print(f"results: {paths['json']}, {paths['markdown']}, {paths['png']}")
    return 0


def commit_scenario(work: Path, quick: bool) -> list[dict[str, Any]]:
    """bench/group_commit.py: a commit cycle with the journal against one fdatasync per
    state partition, for 1, 16 and 50 dirty partitions."""
    _say("group commit: one journal flush per cycle vs one fdatasync per partition")
    rows = group_commit.measure(str(work), cycles=100 if quick else 500)
    for row in rows:
        _say(
            f"  {row['way']}, {row['dirty_partitions']} dirty: "
            f"{row['ms_per_cycle']:.2f} ms per cycle"
        )
    return rows


def entry_cost_scenario(quick: bool) -> list[dict[str, Any]]:
    """bench/entry_cost.py: CPU per write entry without HTTP and fsync, single and
    batched."""
    _say("entry cost: CPU per write entry, in process")
    rows = []
    for per_request in (1, 50):
        requests = (20_000 if per_request == 1 else 400) * (1 if quick else 5)
        cost = entry_cost.measure(requests, per_request)
        rows.append(
            {"per_request": per_request, "entries": cost.entries, "us_per_entry": cost.us_per_entry}
        )
        _say(f"  {per_request} per request: {cost.us_per_entry:.2f} µs per entry")
    return rows


def spark_scenarios(work: Path, quick: bool, only: set[str]) -> list[dict[str, Any]]:
    """`spark` runs them all: compaction 1M and 10M, the audit of 1M in full and from a
    checkpoint, the data source's scan; `compact`, `audit` and `source` run one each."""
    from bench import spark  # noqa: PLC0415 - pyspark loads only when asked

    rows = []
    for name, scenario in (
        ("compact", spark.compact_scenarios),
        ("audit", spark.audit_scenarios),
        ("source", spark.source_scenarios),
    ):
        if "spark" in only or name in only:
            rows += scenario(work, quick)
    if "spark" in only or "spark-pg" in only:
        from bench import spark_pg  # noqa: PLC0415 - psycopg and pyspark only when asked

        rows += spark_pg.run(work, quick)
    elif "spark-pg-read" in only:
        from bench import spark_pg  # noqa: PLC0415

        rows += spark_pg.run(work, quick, reads_only=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
