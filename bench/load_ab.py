"""A node's load, two versions interleaved (an A/B of one change to loading).

    python -m bench.load_ab [--base REF] [--a DIR] [--b DIR] [--records N]
                            [--writes-per-key W] [--rounds R]

A is the commit REF of this repository (default ``main``, exported with ``git archive``)
or the checkout DIR; B is this checkout, or DIR. One data directory of about N records
(``bench.logs.build_log``: W records per share-partition, its initialize and then writes) is
loaded R times by each side in the order A B, B A, ...: the seconds from the daemon's
start to ``/readyz`` 200, then until ``sharecoord_keys_unfolded`` is 0 on every partition
(a version without the lazy load reports 0 at once). Prints one line per start and each
side's median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.__main__ import _wait_folded, _wait_ready
from bench.logs import WRITES_PER_KEY, build_log
from bench.request_cost import REPO, exported
from bench.system import free_port, running


def start_to_ready(repo: Path, data: Path) -> tuple[float, float]:
    """(start to ready, ready to every key folded) for a daemon of ``repo`` on ``data``."""
    port = free_port()
    argv = [
        sys.executable, "-m", "server.commands.cli", "serve", "--data-dir", str(data),
        "--listen", f"127.0.0.1:{port}", "--log-level", "warning",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(repo))
    started = time.monotonic()
    with running(argv, env=env, log=os.devnull, cwd=str(repo)):
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base)
        ready = time.monotonic() - started
        return ready, _wait_folded(base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_ab", description=__doc__)
    parser.add_argument("--base", default="main", help="A: this commit (git archive)")
    parser.add_argument("--a", type=Path, help="A: this checkout instead of --base")
    parser.add_argument("--b", type=Path, default=REPO, help="B: this checkout (default: here)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--writes-per-key", type=int, default=WRITES_PER_KEY)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        a = args.a or stack.enter_context(exported(args.base))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sharecoord-load-")))
        built = build_log(
            work / "data", args.records, writes_per_key=args.writes_per_key, progress=False
        )
        print(f"{built.records:,} records of {built.keys:,} share-partitions", flush=True)
        ready: dict[str, list[float]] = {"A": [], "B": []}
        for index in range(args.rounds):
            for side in ("A", "B") if index % 2 == 0 else ("B", "A"):
                seconds, folded = start_to_ready(a if side == "A" else args.b, built.data_dir)
                ready[side].append(seconds)
                print(f"round {index} {side}: ready {seconds:.2f} s, folded +{folded:.2f} s")
        medians = {side: statistics.median(times) for side, times in ready.items()}
        print(
            f"median start to ready: A {medians['A']:.2f} s, B {medians['B']:.2f} s "
            f"(A/B {medians['A'] / medians['B']:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
