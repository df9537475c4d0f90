"""The daemon's CPU time per request, two versions interleaved (an A/B of one change).

    python -m bench.request_cost [--kafka | --http] [--base REF] [--a DIR] [--b DIR]
                                 [--requests N] [--rounds R] [--concurrency C]
                                 [--latency SHARE [--seconds S]] [--out FILE]

A is the commit REF of this repository (default ``main``, exported with ``git archive``)
or the checkout DIR; B is this checkout, or DIR. Both daemons run at once, each pinned
to the server CPU and idle while the other is measured, with the bench's
share-partitions initialized. Then, R rounds (3 by default) in the order A B, B A,
A B, ...: a warm-up load, then the daemon's CPU time (utime + stime of /proc/PID/stat,
every thread) is read before and after N single writes, and divided by N. The load is
bench/kafka_load.py over the Kafka listener (``--kafka``: exactly N requests, C
connections with one request in flight each) or wrk over HTTP (``--http``: C
connections for as long as N requests take at A's first rate, divided by the requests
wrk counted). Each side's requests/s is shown too, but the figure is the CPU time: it
holds when the machine's speed drifts less than rates do, and reading A and B
alternately in one run cancels most of the drift that is left.

With ``--latency SHARE`` it measures latency at a fixed load instead: A's closed-loop
maximum first (C connections, S seconds), then, in the same alternating order,
bench/open_loop.py at SHARE of that rate against each side for S seconds: p50, p99 and
p99.9 from each request's scheduled time, both sides at the same offered rate.

Prints one line per measurement and a summary (each side's median, B/A), and writes
them as JSON to FILE when given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.__main__ import WRITE, _wait_ready, commit_cycles
from bench.kafka_load import run_kafka_load, write_frames
from bench.loadgen import LoadResult, run_wrk
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.system import cpu_seconds, free_port, pinned, running, server_cpus
from bench.workload import build_body_files, initialize_all, write_bodies

REPO = Path(__file__).resolve().parents[1]
WARMUP_S = 2.0


@dataclass
class Measurement:
    side: str  # "A" or "B"
    round: int
    requests: int
    cpu_s: float
    requests_per_s: float
    p99_ms: float
    cycles: int = 0  # group commit cycles meanwhile (sharecoord_group_commit_partitions)

    @property
    def us_per_request(self) -> float:
        return 1e6 * self.cpu_s / self.requests if self.requests else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "us_per_request": self.us_per_request}


@dataclass
class _Daemon:
    side: str
    pid: int
    http: str
    kafka_port: int


@contextlib.contextmanager
def exported(ref: str) -> Iterator[Path]:
    """The tree of commit ``ref`` of this repository, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="sharecoord-base-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", ref],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise SystemExit(f"git archive {ref}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield Path(tmp)


@contextlib.contextmanager
def daemon(side: str, repo: Path, work: Path) -> Iterator[_Daemon]:
    """`sharecoord serve` from ``repo`` with a Kafka listener, pinned to the server CPU."""
    port, kafka_port = free_port(), free_port()
    argv = pinned(
        server_cpus(),
        [sys.executable, "-m", "server.commands.cli", "serve",
         "--data-dir", str(work / f"data-{side}"), "--listen", f"127.0.0.1:{port}",
         "--kafka-listener", f"127.0.0.1:{kafka_port}", "--log-level", "warning"],
    )  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(repo))
    # From the checkout itself: `python -m` puts the working directory first.
    log = str(work / f"daemon-{side}.log")
    with running(argv, env=env, log=log, cwd=str(repo)) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        yield _Daemon(side, proc.pid, base, kafka_port)


@contextlib.contextmanager
def both(a: Path, b: Path) -> Iterator[tuple[Path, Path, dict[str, _Daemon]]]:
    """The single-write loads (Kafka frames, HTTP bodies) and a daemon from each of
    ``a`` and ``b``, running side by side."""
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sharecoord-cost-")))
        frames = write_frames(write_bodies(random.Random(1313), 20_000, 1), work / "w.kafka")
        bodies = build_body_files(work / "bodies")["write"]
        daemons = {
            "A": stack.enter_context(daemon("A", a, work)),
            "B": stack.enter_context(daemon("B", b, work)),
        }
        yield frames, bodies, daemons


def _load(
    d: _Daemon, kafka: bool, frames: Path, bodies: Path, requests: int, concurrency: int,
    seconds: float,
) -> LoadResult:  # fmt: skip
    if kafka:
        return run_kafka_load(
            f"request cost {d.side}", d.kafka_port, frames, concurrency=concurrency,
            duration_s=max(seconds * 20, 60.0), server_pid=d.pid, requests=requests,
        )  # fmt: skip
    return run_wrk(
        f"request cost {d.side}", d.http + WRITE, bodies, concurrency=concurrency,
        duration_s=seconds, server_pid=d.pid,
    )  # fmt: skip


def measure(
    a: Path, b: Path, *, kafka: bool, requests: int, rounds: int, concurrency: int
) -> list[Measurement]:
    out: list[Measurement] = []
    with both(a, b) as (frames, bodies, daemons):
        # HTTP runs for a time (wrk): as long as `requests` take at A's first rate.
        seconds = 0.0
        for index in range(rounds):
            for side in ("A", "B") if index % 2 == 0 else ("B", "A"):
                d = daemons[side]
                warm = max(requests // 5, 1000)
                _load(d, kafka, frames, bodies, warm, concurrency, WARMUP_S)
                if not kafka and seconds == 0.0:
                    probe = _load(d, kafka, frames, bodies, warm, concurrency, WARMUP_S)
                    seconds = max(1.0, requests / probe.requests_per_s)
                cycles = commit_cycles(d.http)
                before = cpu_seconds([d.pid])
                result = _load(d, kafka, frames, bodies, requests, concurrency, seconds)
                used = cpu_seconds([d.pid]) - before
                cycles = commit_cycles(d.http) - cycles
                if result.errors or result.non_2xx:
                    raise SystemExit(
                        f"{side}: {result.errors} errors, {result.non_2xx} non-2xx answers; "
                        f"see the daemon's log"
                    )
                row = Measurement(
                    side, index, result.requests, used, result.requests_per_s, result.p99_ms,
                    cycles,
                )  # fmt: skip
                out.append(row)
                print(
                    f"round {index} {side}: {row.requests} requests, "
                    f"{row.us_per_request:.1f} us CPU/request, "
                    f"{row.requests_per_s:,.0f} req/s, p99 {row.p99_ms:.2f} ms, "
                    f"{row.requests / max(row.cycles, 1):.1f} requests per commit cycle",
                    flush=True,
                )
    return out


def measure_latency(
    a: Path, b: Path, *, kafka: bool, share: float, seconds: float, rounds: int,
    concurrency: int,
) -> tuple[float, list[tuple[str, int, OpenLoopResult]]]:  # fmt: skip
    """A's maximum, then open-loop rows at ``share`` of it, A and B alternately."""
    out: list[tuple[str, int, OpenLoopResult]] = []
    with both(a, b) as (frames, bodies, daemons):
        first = daemons["A"]
        if kafka:
            top = run_kafka_load(
                "max A", first.kafka_port, frames, concurrency=concurrency,
                duration_s=seconds, server_pid=first.pid,
            )  # fmt: skip
        else:
            top = run_wrk(
                "max A", first.http + WRITE, bodies, concurrency=concurrency,
                duration_s=seconds, server_pid=first.pid,
            )  # fmt: skip
        rate = share * top.requests_per_s
        print(f"A's maximum: {top.requests_per_s:,.0f} req/s; offered: {rate:,.0f} req/s")
        for index in range(rounds):
            for side in ("A", "B") if index % 2 == 0 else ("B", "A"):
                d = daemons[side]
                row = run_open_loop(
                    side, "kafka" if kafka else "http", d.kafka_port if kafka else
                    int(d.http.rsplit(":", 1)[1]), frames if kafka else bodies,
                    rate=rate, duration_s=seconds, load_share=share,
                )  # fmt: skip
                out.append((side, index, row))
                print(
                    f"round {index} {side}: p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms, "
                    f"p99.9 {row.p999_ms:.2f} ms, {row.answered_per_s:,.0f} answered/s, "
                    f"{row.errors} errors",
                    flush=True,
                )
        return top.requests_per_s, out


def summary(rows: list[Measurement]) -> dict[str, Any]:
    def median(side: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in rows if r.side == side)

    a_us, b_us = median("A", "us_per_request"), median("B", "us_per_request")
    a_rate, b_rate = median("A", "requests_per_s"), median("B", "requests_per_s")
    return {
        "a_us_per_request": a_us,
        "b_us_per_request": b_us,
        "b_over_a_cpu": b_us / a_us,
        "a_requests_per_s": a_rate,
        "b_requests_per_s": b_rate,
        "b_over_a_rate": b_rate / a_rate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cost", description=__doc__)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--kafka", action="store_true", help="over the Kafka listener (default)")
    which.add_argument("--http", action="store_true", help="over HTTP (wrk)")
    parser.add_argument("--base", default="main", help="A: this commit (git archive)")
    parser.add_argument("--a", type=Path, help="A: this checkout instead of --base")
    parser.add_argument("--b", type=Path, default=REPO, help="B: this checkout (default: here)")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, help="open loop at this share of A's maximum")
    parser.add_argument("--seconds", type=float, default=10.0, help="per --latency run")
    parser.add_argument("--out", type=Path, help="write the measurements here (JSON)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--requests, --rounds and --concurrency must be at least 1")
    if args.latency is not None and not 0 < args.latency <= 1:
        parser.error("--latency: a share of the maximum, above 0 and at most 1")
    kafka = not args.http
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.latency is not None:
        return _latency_main(args, kafka, started)
    with contextlib.ExitStack() as stack:
        a = args.a.resolve() if args.a else stack.enter_context(exported(args.base))
        protocol = "kafka" if kafka else "http"
        print(
            f"A: {args.a or args.base}; B: {args.b}; {protocol} single writes, "
            f"{args.requests} per measurement, c={args.concurrency}",
            flush=True,
        )
        rows = measure(
            a, args.b.resolve(), kafka=kafka, requests=args.requests, rounds=args.rounds,
            concurrency=args.concurrency,
        )  # fmt: skip
    found = summary(rows)
    print(
        f"median CPU/request: A {found['a_us_per_request']:.1f} us, "
        f"B {found['b_us_per_request']:.1f} us, B/A {found['b_over_a_cpu']:.3f}; "
        f"median rate: A {found['a_requests_per_s']:,.0f}, B {found['b_requests_per_s']:,.0f} "
        f"req/s, B/A {found['b_over_a_rate']:.3f}"
    )
    _write_out(
        args, kafka, started, found, requests=args.requests, concurrency=args.concurrency,
        rows=[r.as_dict() for r in rows],
    )  # fmt: skip
    return 0


def _write_out(
    args: argparse.Namespace, kafka: bool, started: str, found: dict[str, Any], **fields: Any
) -> None:
    """The run as JSON into ``--out``, if given: what was compared, ``fields``, the
    summary."""
    if args.out is None:
        return
    written = {
        "started": started,
        "a": str(args.a or args.base),
        "b": str(args.b),
        "protocol": "kafka" if kafka else "http",
        **fields,
        "summary": found,
    }
    args.out.write_text(json.dumps(written, indent=2) + "\n")


def _latency_main(args: argparse.Namespace, kafka: bool, started: str) -> int:
    with contextlib.ExitStack() as stack:
        a = args.a.resolve() if args.a else stack.enter_context(exported(args.base))
        top, rows = measure_latency(
            a, args.b.resolve(), kafka=kafka, share=args.latency, seconds=args.seconds,
            rounds=args.rounds, concurrency=args.concurrency,
        )  # fmt: skip
    found: dict[str, Any] = {"a_max_per_s": top}
    for side in ("A", "B"):
        mine = [row for s, _, row in rows if s == side]
        for field in ("p50_ms", "p99_ms", "p999_ms"):
            found[f"{side.lower()}_{field}"] = statistics.median(getattr(r, field) for r in mine)
    print(
        f"median over {args.rounds} rounds at {args.latency:.0%} of {top:,.0f} req/s: "
        f"A p50 {found['a_p50_ms']:.2f} p99 {found['a_p99_ms']:.2f} ms; "
        f"B p50 {found['b_p50_ms']:.2f} p99 {found['b_p99_ms']:.2f} ms"
    )
    _write_out(
        args, kafka, started, found, share=args.latency,
        rows=[{"side": s, "round": i, **r.as_dict()} for s, i, r in rows],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
