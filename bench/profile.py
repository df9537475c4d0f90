"""Where the daemon's CPU goes under the bench's write loads (py-spy, sampling).

    python -m bench.profile [--repo DIR] [--seconds S] [--label NAME] [--postgres]

Starts `sharecoord serve` from DIR (default: this checkout; another checkout profiles
an older version with the same load), initializes the bench's share-partitions, then
for single writes (c=64) and batched writes (50 per request, c=16) runs wrk while
py-spy samples the daemon. Writes, per load, the sampled stacks in collapsed form
(``bench/results/profile-<label>-<load>.collapsed``: speedscope or flamegraph.pl draw
them) and the functions with the most samples in their own code and under them
(``...txt``), and prints the latter. With ``--postgres`` the daemon is a node on the
PostgreSQL store (a primary with a synchronous standby, as bench/cluster.py runs it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.__main__ import RESULTS, WRITE, _wait_ready
from bench.cluster import replicated
from bench.loadgen import run_wrk
from bench.system import free_port, pinned, running, server_cpus
from bench.workload import build_body_files, initialize_all

LOADS = (("single", "write", 64, 1), ("batched", "write_batch", 16, 50))
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


def profile(repo: Path, seconds: float, label: str, postgres: bool = False) -> list[Path]:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sharecoord-profile-")))
        if postgres:
            primary = stack.enter_context(replicated())
            store = ["--state-store", primary.uri(), "--node-id", "1"]
        else:
            store = ["--data-dir", str(work / "data")]
        return _profile(repo, seconds, label, work, store)


def _profile(repo: Path, seconds: float, label: str, work: Path, store: list[str]) -> list[Path]:
    written = []
    bodies = build_body_files(work / "bodies")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(repo))
    argv = pinned(
        server_cpus(),
        [sys.executable, "-m", "server.commands.cli", "serve", *store,
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
    )  # fmt: skip
    # From the checkout itself: `python -m` puts the working directory first.
    with running(argv, env=env, log=str(work / "daemon.log"), cwd=str(repo)) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        initialize_all(base)
        daemon = proc.pid  # taskset execs the daemon: the same pid
        for name, body, concurrency, per_request in LOADS:
            raw = work / f"{name}.collapsed"
            stacks = RESULTS / f"profile-{label}-{name}.collapsed"
            spy = subprocess.Popen(
                [_py_spy(), "record", "--pid", str(daemon), "--duration", str(int(seconds)),
                 "--rate", "200", "--format", "raw", "--output", str(raw), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            result = run_wrk(
                f"profile {name}",
                base + WRITE,
                bodies[body],
                concurrency=concurrency,
                duration_s=seconds,
                server_pid=proc.pid,
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
    args = parser.parse_args()
    for path in profile(args.repo.resolve(), args.seconds, args.label, args.postgres):
        print(path)


if __name__ == "__main__":
    main()
