"""Cluster mode's rows (issue 23): the PostgreSQL store beside the local one, and a node's
failover.

* ``write_rows``: the same write bodies (bench/workload.py) to a daemon on a data
  directory and to a node on PostgreSQL (a primary with a synchronous standby, as
  docs/operations.md recommends for zero loss), one after the other, twice over in the
  same run, single writes and batched ones (50 share-partitions a request). Each daemon
  is pinned to the server CPU; PostgreSQL's servers are not (they share the machine
  with the load generator).
* ``failover_runs``: two nodes on that PostgreSQL (the default lease, 5 s); the leader
  of one share-partition SIGKILLed, then a write of it through the client library, which
  finds the new leader by its retry: the seconds from the kill to that write's success,
  ``RUNS`` times (the killed node started again between runs).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.loadgen import LoadResult, run_wrk
from bench.system import free_port, pinned, python_env, running, server_cpus
from bench.workload import TOPIC_ID, group_name, initialize_all
from client import ShareCoordinatorClient
from protocol.routing import partition_for
from protocol.state_batch import StateBatch
from tests.postgres import PostgresServer, running_servers, server_root

WRITE = "/v1/share-group-state/write"
STATE_PARTITIONS = 50  # serve's default, as the local daemon of the other rows
RUNS = 5
ROUNDS = 2  # of the write rows, the stores alternating
SCHEMA_WRITES = "bench_writes"
SCHEMA_FAILOVER = "bench_failover"
Ready = Callable[[str], object]
# (row name, body file of bench/workload.py, share-partitions per request)
WRITE_ROWS = (("write", "write", 1), ("write x50", "write_batch", 50))


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def replicated() -> Iterator[PostgresServer]:
    """A PostgreSQL primary with a synchronous standby; yields the primary."""
    with server_root() as root, running_servers() as servers:
        primary = PostgresServer.primary(root, "bench-primary")
        servers.append(primary)
        servers.append(primary.standby("bench-standby", synchronous=True))
        yield primary


def _serve(port: int, *store: str) -> list[str]:
    return [sys.executable, "-m", "server.commands.cli", "serve", "--listen",
            f"127.0.0.1:{port}", "--log-level", "warning", *store]  # fmt: skip


def write_rows(
    work: Path, bodies: dict[str, Path], duration: float, primary: PostgresServer, ready: Ready
) -> list[LoadResult]:
    """Each store's rows, ROUNDS times, the stores alternating (the machine's speed
    drifts: a ratio is taken within a round, between runs minutes apart)."""
    results: list[LoadResult] = []
    for round_ in range(1, ROUNDS + 1):
        stores = {
            "local store": ["--data-dir", str(work / f"local-store-data-{round_}")],
            "postgres store": ["--state-store", primary.uri(), "--state-store-schema",
                               f"{SCHEMA_WRITES}_{round_}",
                               "--data-dir", str(work / f"postgres-store-data-{round_}")],
        }  # fmt: skip
        for name, flags in stores.items():
            port = free_port()
            _say(f"{name}, round {round_}: single and batched writes")
            argv = pinned(server_cpus(), _serve(port, *flags))
            log = str(work / f"{name.replace(' ', '-')}-{round_}.log")
            with running(argv, env=python_env(), log=log) as proc:
                base = f"http://127.0.0.1:{port}"
                ready(base)
                initialize_all(base)
                for rows, bodies_file, items in WRITE_ROWS:
                    results.append(
                        run_wrk(
                            f"{name} {rows} (round {round_})",
                            base + WRITE,
                            bodies[bodies_file],
                            concurrency=16,
                            duration_s=duration,
                            server_pid=proc.pid,
                            items_per_request=items,
                        )
                    )
                    _say(f"  {rows} c=16: {results[-1].items_per_s:,.0f} share-partitions/s")
    return results


def batched_ratio(rows: list[LoadResult]) -> dict[str, float]:
    """PostgreSQL over local, batched, in each round."""
    by_name = {r.name: r.items_per_s for r in rows}
    out: dict[str, float] = {}
    for round_ in range(1, ROUNDS + 1):
        local = by_name.get(f"local store write x50 (round {round_})")
        postgres = by_name.get(f"postgres store write x50 (round {round_})")
        if local and postgres:
            out[f"PostgreSQL store / local store, batched writes c=16, round {round_}"] = (
                postgres / local
            )
    return out


# --- failover -----------------------------------------------------------------------------


class Node:
    """One node process on the PostgreSQL store, killed and started again on its port."""

    def __init__(self, work: Path, node_id: int, uri: str, ready: Ready) -> None:
        self.ready = ready
        self.node_id = node_id
        self.port = free_port()
        self.argv = _serve(self.port, "--state-store", uri, "--state-store-schema",
                           SCHEMA_FAILOVER, "--node-id", str(node_id),
                           "--data-dir", str(work / f"node{node_id}"))  # fmt: skip
        self.log = open(work / f"failover-node{node_id}.log", "ab")  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=python_env()
        )
        self.ready(self.url)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def _leader_of(primary: PostgresServer, state_partition: int) -> int | None:
    row = primary.execute(
        f"SELECT node_id FROM {SCHEMA_FAILOVER}.sharecoord_leaders "
        f"WHERE state_partition = {state_partition} AND lease_expiry > clock_timestamp()"
    )
    return int(row) if row else None


async def _write(client: ShareCoordinatorClient, partition: int, start: int) -> None:
    await client.write(group_name(0), TOPIC_ID, partition, state_epoch=-1, leader_epoch=-1,
                       start_offset=start, state_batches=[StateBatch(start, start + 9, 0, 1)],
                       delivery_complete_count=0)  # fmt: skip


def failover_runs(work: Path, primary: PostgresServer, ready: Ready) -> dict[str, Any]:
    """Kill -> first successful write through the new leader, ``RUNS`` times."""
    nodes = [Node(work, node_id, primary.uri(), ready) for node_id in (0, 1)]
    partition = 0
    state_partition = partition_for(group_name(0), TOPIC_ID, partition, STATE_PARTITIONS)
    seconds: list[float] = []
    try:
        for node in nodes:
            node.start()

        async def runs() -> None:
            bootstrap = [node.url for node in nodes]
            async with ShareCoordinatorClient(bootstrap, retry_backoff_max_ms=100) as client:
                await client.initialize(group_name(0), TOPIC_ID, partition, state_epoch=1,
                                        start_offset=0)  # fmt: skip
                for run in range(RUNS):
                    await _write(client, partition, 100 * run + 1)  # the leader answers
                    leader = await asyncio.to_thread(_leader_of, primary, state_partition)
                    victim = next(node for node in nodes if node.node_id == leader)
                    await asyncio.to_thread(victim.kill)
                    killed_at = time.monotonic()
                    await _write(client, partition, 100 * run + 50)
                    seconds.append(time.monotonic() - killed_at)
                    _say(f"  failover {run + 1}: {seconds[-1]:.2f} s from the kill")
                    await asyncio.to_thread(victim.start)

        asyncio.run(runs())
    finally:
        for node in nodes:
            node.stop()
    return {
        "name": "node SIGKILL -> first write through the new leader",
        "runs": len(seconds),
        "lease_ms": 5000,
        "p50_s": round(statistics.median(seconds), 2),
        "max_s": round(max(seconds), 2),
        "seconds": [round(s, 2) for s in seconds],
    }


def scenarios(
    work: Path, bodies: dict[str, Path], duration: float, ready: Ready
) -> tuple[list[LoadResult], dict[str, Any]]:
    """The write rows of both stores, then the failover runs, on one replicated server.
    ``ready(base_url)`` returns once a daemon's /readyz answers 200."""
    with replicated() as primary:
        rows = write_rows(work, bodies, duration, primary, ready)
        _say("failover: a node SIGKILLed, a write through the new leader")
        failover = failover_runs(work, primary, ready)
    return rows, failover
