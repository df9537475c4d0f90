"""Where the daemon's CPU goes under the bench's write loads (py-spy, sampling).

    python -m bench.profile [--repo DIR] [--seconds S] [--label NAME] [--postgres]
                            [--kafka] [--only LOAD,...] [--native]

Starts `sharecoord serve` from DIR (default: this checkout; another checkout profiles
an older version with the same load), initializes the bench's share-partitions, then
for single writes (c=64) and batched writes (50 per request, c=16) runs wrk while
py-spy samples the daemon; with ``--kafka``, also single writes over the Kafka listener
(bench/kafka_load.py, 64 connections with one request in flight each: the load
``kafka-single``). ``--only`` profiles the named loads alone (``--only kafka-single``).
Writes, per load, the sampled stacks in collapsed form
(``bench/results/profile-<label>-<load>.collapsed``: speedscope or flamegraph.pl draw
them) and the functions with the most samples in their own code and under them
(``...txt``), and prints the latter. With ``--postgres`` the daemon is a node on the
PostgreSQL store (a primary with a synchronous standby, as bench/cluster.py runs it).
With ``--native``, py-spy unwinds C frames too: what the compiled mode's extension
modules, uvloop and msgpack spend, which Python-only sampling charges to the line that
called them (py-spy then stops the daemon for each sample, which slows it: read the
shares, not the rate).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.__main__ import RESULTS, WRITE, _wait_ready
from bench.cluster import replicated
from bench.kafka_load import run_kafka_load, write_frames
from bench.loadgen import LoadResult, run_wrk
from bench.system import free_port, pinned, running, server_cpus
from bench.workload import build_body_files, initialize_all, write_bodies

LOADS = (("single", "write", 64, 1), ("batched", "write_batch", 16, 50))
# Over the Kafka listener (--kafka): its frames, its connections, entries per request.
KAFKA_LOAD = ("kafka-single", "write", 64, 1)
TOP = 25


def _py_spy() -> str:
    return str(Path(sys.executable).with_name("py-spy"))


def summarize(collapsed: str) -> str:
    """The functions with the most samples: in their own code (self), and anywhere in
    the stack (total), from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    lines = [f"{samples} samples", "", "self %  function (own code)"]
    lines += [f"{100 * n / samples:6.1f}  {f}" for f, n in own.most_common(TOP)]
    lines += ["", "total %  function (with what it calls)"]
    lines += [f"{100 * n / samples:6.1f}  {f}" for f, n in total.most_common(TOP)]
    return "\n".join(lines) + "\n"


def profile(
    repo: Path,
    seconds: float,
    label: str,
    postgres: bool = False,
    kafka: bool = False,
    only: frozenset[str] | None = None,
    native: bool = False,
) -> list[Path]:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sharecoord-profile-")))
        if postgres:
            primary = stack.enter_context(replicated())
            store = ["--state-store", primary.uri(), "--node-id", "1"]
        else:
            store = ["--data-dir", str(work / "data")]
        loads = [*LOADS, KAFKA_LOAD] if kafka else list(LOADS)
        if only is not None:
            loads = [load for load in loads if load[0] in only]
        return _profile(repo, seconds, label, work, store, loads, native)


def _profile(
    repo: Path,
    seconds: float,
    label: str,
    work: Path,
    store: list[str],
    loads: list[tuple[str, str, int, int]],
    native: bool,
) -> list[Path]:
    written = []
    bodies = build_body_files(work / "bodies")
    port, kafka_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=str(repo))
    kafka = KAFKA_LOAD in loads
    listener = ["--kafka-listener", f"127.0.0.1:{kafka_port}"] if kafka else []
    argv = pinned(
        server_cpus(),
        [sys.executable, "-m", "server.commands.cli", "serve", *store,
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *listener],
    )  # fmt: skip
    # From the checkout itself: `python -m` puts the working directory first.
    with running(argv, env=env, log=str(work / "daemon.log"), cwd=str(repo)) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        daemon = proc.pid  # taskset execs the daemon: the same pid
        for name, body, concurrency, per_request in loads:
            raw = work / f"{name}.collapsed"
            stacks = RESULTS / f"profile-{label}-{name}.collapsed"
            spy = subprocess.Popen(
                [_py_spy(), "record", "--pid", str(daemon), "--duration", str(int(seconds)),
                 "--rate", "200", "--format", "raw", "--output", str(raw),
                 # py-spy stops the process for a native stack: it cannot do both.
                 *(["--native"] if native else ["--nonblocking"])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            result: LoadResult
            if name == KAFKA_LOAD[0]:
                frames = write_frames(
                    write_bodies(random.Random(1313), 20_000, per_request), work / "w.kafka"
                )
                result = run_kafka_load(
                    f"profile {name}",
                    kafka_port,
                    frames,
                    concurrency=concurrency,
                    duration_s=seconds,
                    server_pid=daemon,
                    items_per_request=per_request,
                )
            else:
                result = run_wrk(
                    f"profile {name}",
                    base + WRITE,
                    bodies[body],
                    concurrency=concurrency,
                    duration_s=seconds,
                    server_pid=daemon,
                    items_per_request=per_request,
                )
            spy.wait(timeout=seconds + 60)
            collapsed = raw.read_text()
            stacks.write_text(collapsed)
            text = RESULTS / f"profile-{label}-{name}.txt"
            header = (
                f"{label}, {name} writes ({per_request} per request, c={concurrency}): "
                f"{result.items_per_s:,.0f} share-partitions/s, "
                f"p99 {result.p99_ms:.2f} ms, {seconds:.0f} s sampled at 200 Hz\n"
            )
            text.write_text(header + summarize(collapsed))
            print(text.read_text())
            written += [stacks, text]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--label", default="now")
    parser.add_argument("--postgres", action="store_true", help="a node on PostgreSQL")
    parser.add_argument(
        "--kafka", action="store_true", help="single writes over the Kafka listener too"
    )
    parser.add_argument("--only", default=None, help="these loads alone (comma-separated)")
    parser.add_argument("--native", action="store_true", help="sample C frames too (py-spy)")
    args = parser.parse_args()
    names = {load[0] for load in (*LOADS, KAFKA_LOAD)}
    only = None if args.only is None else frozenset(args.only.split(","))
    if only is not None and not only <= names:
        parser.error(f"--only: unknown loads {sorted(only - names)}; known: {sorted(names)}")
    kafka = args.kafka or (only is not None and KAFKA_LOAD[0] in only)
    written = profile(
        args.repo.resolve(), args.seconds, args.label, args.postgres, kafka, only, args.native
    )
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
