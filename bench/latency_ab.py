"""Latency at a fixed load, two versions interleaved (an A/B of one change to the write
path or the group commit).

    python -m bench.latency_ab [--base REF] [--a DIR] [--b DIR] [--rates R1,R2]
                               [--protocols http,kafka] [--seconds S] [--rounds N]

A is the commit REF of this repository (default ``main``, exported with ``git archive``)
or the checkout DIR; B is this checkout, or DIR. Each round starts a daemon of each side
in the order A B, B A, ... (pinned to the server CPU, on a fresh data directory, with the
Kafka listener), initializes the bench's share-partitions, and offers single writes at
each rate over each protocol with bench/open_loop.py (latency counted from each
request's scheduled time). Prints one line per run and each side's medians of p50, p99
and p99.9 per protocol and rate, and the commit cycles per second the daemon ran
(``sharecoord_fsync_duration_seconds_count``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench.__main__ import _wait_ready
from bench.kafka_load import write_frames
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.request_cost import REPO, exported
from bench.system import free_port, pinned, running, server_cpus
from bench.workload import initialize_all, save_bodies, write_bodies

_CYCLES = re.compile(r"^sharecoord_fsync_duration_seconds_count (\S+)$", re.MULTILINE)


def cycles_so_far(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as answer:
        found = _CYCLES.search(answer.read().decode())
    return float(found.group(1)) if found else 0.0


def one_side(
    repo: Path, work: Path, requests: dict[str, Path], rates: list[float], seconds: float
) -> list[tuple[str, float, OpenLoopResult, float]]:
    """(protocol, rate, the open loop's figures, commit cycles per second) per run."""
    port, kafka_port = free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="data-", dir=work))
    argv = pinned(
        server_cpus(),
        [sys.executable, "-m", "server.commands.cli", "serve", "--data-dir", str(data),
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning",
         "--kafka-listener", f"127.0.0.1:{kafka_port}"],
    )  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(repo))
    out = []
    with running(argv, env=env, log=os.devnull, cwd=str(repo)):
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        for protocol, at in (("http", port), ("kafka", kafka_port)):
            if protocol not in requests:
                continue
            for rate in rates:
                before = cycles_so_far(base)
                row = run_open_loop(
                    "ab", protocol, at, requests[protocol],
                    rate=rate, duration_s=seconds, load_share=0.0,
                )  # fmt: skip
                # The open loop runs a second of warm-up before the counted seconds.
                per_s = (cycles_so_far(base) - before) / (seconds + 1.0)
                out.append((protocol, rate, row, per_s))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_ab", description=__doc__)
    parser.add_argument("--base", default="main", help="A: this commit (git archive)")
    parser.add_argument("--a", type=Path, help="A: this checkout instead of --base")
    parser.add_argument("--b", type=Path, default=REPO, help="B: this checkout (default: here)")
    parser.add_argument("--rates", default="1000,2000", help="single writes per second")
    parser.add_argument("--protocols", default="http,kafka")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    protocols = args.protocols.split(",")
    with contextlib.ExitStack() as stack:
        a = args.a or stack.enter_context(exported(args.base))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sharecoord-lat-")))
        bodies = write_bodies(random.Random(1313), 20_000, 1)
        requests = {}
        if "http" in protocols:
            requests["http"] = save_bodies(bodies, work / "w.http")
        if "kafka" in protocols:
            requests["kafka"] = write_frames(bodies, work / "w.kafka")
        runs: dict[tuple[str, str, float], list[tuple[OpenLoopResult, float]]] = {}
        for round_ in range(args.rounds):
            order = [("A", a), ("B", args.b)]
            for side, repo in order if round_ % 2 == 0 else order[::-1]:
                for protocol, rate, row, per_s in one_side(
                    repo, work, requests, rates, args.seconds
                ):
                    runs.setdefault((side, protocol, rate), []).append((row, per_s))
                    print(
                        f"round {round_ + 1} {side} {protocol} {rate:,.0f}/s: "
                        f"p50 {row.p50_ms:.2f} p99 {row.p99_ms:.2f} p99.9 {row.p999_ms:.2f} ms, "
                        f"{per_s:,.0f} cycles/s, {row.errors} errors",
                        flush=True,
                    )
        print("medians:")
        for (side, protocol, rate), rows in sorted(runs.items(), key=lambda kv: kv[0][1:]):

            def median(values: list[float]) -> float:
                return statistics.median(values)

            print(
                f"  {side} {protocol} {rate:,.0f}/s: "
                f"p50 {median([r.p50_ms for r, _ in rows]):.2f} "
                f"p99 {median([r.p99_ms for r, _ in rows]):.2f} "
                f"p99.9 {median([r.p999_ms for r, _ in rows]):.2f} ms, "
                f"{median([c for _, c in rows]):,.0f} cycles/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
