"""The CPU cost of one batch merge, on the merges real writes and real loads bring.

    python -m bench.merge_cost [--writes N] [--records N] [--rounds R] [--baseline REV]

``protocol.batches.merge_batches`` is the one function both a write's replay and a
partition's load spend on (issue 26). This captures the arguments of every merge that
two real workloads make, then times the merge alone on them, in CPU time:

* **write**: the bench's HTTP workload (bench/workload.py) through a shard, write and
  replay, as the daemon runs it: after the same warm-up as bench/entry_cost.py, the
  merges of ``--writes`` write entries (one new batch into a state a few batches long);
* **load**: the merges ``protocol.loading.StateLoader`` makes loading a log that
  bench/logs.py builds (``--records`` records, 50 writes per key).

Each merge is timed together with what its caller makes of the result (the replay keeps
the batches as a tuple; the loader hands its list to the next merge of the key), so a
change of what the merge returns is measured where its cost lands.

With ``--baseline REV`` (default ``main``), the merge of that git revision
(protocol/batches.py and protocol/sweep.py as they are there, loaded under other module
names) runs on the same merges, interleaved with this checkout's round by round, since
the machine's speed drifts: prints each one's median µs per merge and the median of the
per-round ratios. The outputs of the two are checked equal, merge for merge.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

import protocol.batches
import protocol.loading
import protocol.replay
from bench.logs import build_log
from bench.workload import GROUPS, PARTITIONS_PER_GROUP, TOPIC_ID, group_name, write_bodies
from persistence import StateLog
from persistence.store import open_in_runs
from protocol import codec
from protocol.codec import Format
from protocol.messages import InitializePartition, Rpc
from protocol.records import ShareKey
from protocol.shard import ShardConfig, ShareCoordinatorShard
from server.native import compiled_modules

# One merge as captured: (current, current_clean, new, start_offset), the batches as
# plain (first, last, state, count) tuples so that each implementation gets its own.
Fields = tuple[int, int, int, int]
Call = tuple[Sequence[Fields], bool, list[Fields], int]

REPO = Path(__file__).resolve().parent.parent


def _fields(batches: Sequence[Any]) -> list[Fields]:
    return [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in batches]


class _Capture:
    """Stands in for ``merge_batches`` in a caller's module, keeping each call's input."""

    def __init__(self, merge: Callable[..., Any]) -> None:
        self.merge = merge
        self.calls: list[Call] = []
        self.stored_as_tuple = 0

    def __call__(self, current: Any, clean: bool, new: Any, start_offset: int) -> Any:
        self.stored_as_tuple += isinstance(current, tuple)
        self.calls.append((_fields(current), clean, _fields(new), start_offset))
        return self.merge(current, clean, new, start_offset)


def _captured(module: types.ModuleType, run: Callable[[], None]) -> list[Call]:
    names = vars(module)
    capture = _Capture(names["merge_batches"])
    names["merge_batches"] = capture
    try:
        run()
    finally:
        names["merge_batches"] = capture.merge
    return capture.calls


def write_merges(writes: int, seed: int = 932) -> list[Call]:
    """The merges of ``writes`` write entries of the bench's workload, warmed up as
    bench/entry_cost.py warms its states."""
    shard = ShareCoordinatorShard(ShardConfig())
    offset = 0

    def apply(raw: bytes) -> None:
        nonlocal offset
        request = codec.decode_request(Rpc.WRITE, raw, Format.MSGPACK)
        for topic in request.topics:
            for entry in topic.partitions:
                key = ShareKey(request.group_id, topic.key_topic_id, entry.partition)
                record = shard.write(key, entry)[0]
                if record is not None:
                    shard.replay(offset, record)
                    offset += 1

    for g in range(GROUPS):
        for p in range(PARTITIONS_PER_GROUP):
            key = ShareKey(group_name(g), TOPIC_ID, p)
            record = shard.initialize(key, InitializePartition(p, 0, 0))[0]
            assert record is not None
            shard.replay(offset, record)
            offset += 1
    rng = random.Random(seed)
    for body in write_bodies(rng, 2_000, 50):
        apply(msgpack.packb(body))
    bodies = [msgpack.packb(b) for b in write_bodies(rng, max(1, writes // 50), 50)]

    def run() -> None:
        for raw in bodies:
            apply(raw)

    return _captured(protocol.replay, run)


def load_merges(records: int) -> list[Call]:
    """The merges a load of a bench/logs.py log of ``records`` records makes."""
    with tempfile.TemporaryDirectory(prefix="sharecoord-merge-cost-") as data_dir:
        built = build_log(Path(data_dir), records, progress=False)
        config = ShardConfig()

        def load() -> None:
            with StateLog.open(str(built.data_dir), 50) as log:
                for p in range(50):
                    loader = protocol.loading.StateLoader(config.records_per_snapshot)
                    open_in_runs(log.partition(p), loader.add)
                    loader.finish()

        return _captured(protocol.loading, load)


def baseline_module(rev: str) -> types.ModuleType:
    """protocol/batches.py as it is at ``rev``, with that revision's protocol/sweep.py,
    as modules of their own (this checkout's stay as they are)."""

    def source(path: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def load(name: str, path: str) -> types.ModuleType:
        spec = importlib.util.spec_from_loader(name, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        exec(compile(source(path), f"{rev}:{path}", "exec"), module.__dict__)
        return module

    own_sweep = sys.modules["protocol.sweep"]
    sys.modules["protocol.sweep"] = load("_baseline_sweep", "protocol/sweep.py")
    try:
        return load("_baseline_batches", "protocol/batches.py")
    finally:
        sys.modules["protocol.sweep"] = own_sweep


# How each caller keeps what the merge gives: the replay stores the batches as a tuple,
# the loader passes its list on to the key's next merge.
def _as_replay(module: types.ModuleType) -> Callable[[Any, bool, Any, int], object]:
    merge = module.merge_batches

    def step(current: Any, clean: bool, new: Any, start_offset: int) -> object:
        merged, now_clean = merge(current, clean, new, start_offset)
        return tuple(merged), now_clean

    return step


def _as_loader(module: types.ModuleType) -> Callable[[Any, bool, Any, int], object]:
    return module.merge_batches  # type: ignore[no-any-return]


def _inputs(module: types.ModuleType, calls: list[Call], stored: type) -> list[Any]:
    """The captured calls as ``module``'s batches; the stored ones as ``stored`` (a
    tuple for the replay's states, a list for the loader's)."""
    make = module.StateBatch
    return [
        (stored(make(*b) for b in current), clean, [make(*b) for b in new], start)
        for current, clean, new, start in calls
    ]


# Merges timed in one go before the other implementation takes its turn.
_CHUNK = 1_000


def _time(step: Callable[[Any, bool, Any, int], object], inputs: list[Any]) -> float:
    started = time.process_time()
    for current, clean, new, start in inputs:
        step(current, clean, new, start)
    return time.process_time() - started


def _same_outputs(modules: list[types.ModuleType], calls: list[Call], stored: type) -> None:
    outputs = []
    for module in modules:
        outputs.append(
            [
                (_fields(module.merge_batches(*args)[0]), module.merge_batches(*args)[1])
                for args in _inputs(module, calls, stored)
            ]
        )
    for out in outputs[1:]:
        if out != outputs[0]:
            raise SystemExit("merge_cost: the baseline's merge and this one's disagree")


def compare(
    label: str,
    calls: list[Call],
    stored: type,
    wrap: Callable[[types.ModuleType], Callable[[Any, bool, Any, int], object]],
    modules: dict[str, types.ModuleType],
    rounds: int,
) -> dict[str, float]:
    if not calls:
        print(f"{label}: no merges to time (a larger --writes or --records makes some)")
        return {}
    _same_outputs(list(modules.values()), calls, stored)
    inputs = {name: _inputs(module, calls, stored) for name, module in modules.items()}
    steps = {name: wrap(module) for name, module in modules.items()}
    times: dict[str, list[float]] = {name: [] for name in modules}
    names = list(modules)
    # Interleaved chunk by chunk, not only round by round: the machine's speed drifts
    # within a round too.
    for r in range(rounds):
        spent = dict.fromkeys(names, 0.0)
        for at in range(0, len(calls), _CHUNK):
            for name in names if (r + at // _CHUNK) % 2 == 0 else reversed(names):
                spent[name] += _time(steps[name], inputs[name][at : at + _CHUNK])
        for name in names:
            times[name].append(spent[name] / len(calls) * 1e6)
    stored_sizes = [len(c[0]) for c in calls]
    print(
        f"{label}: {len(calls):,} merges, stored batches mean "
        f"{statistics.fmean(stored_sizes):.1f} max {max(stored_sizes)}, new batches mean "
        f"{statistics.fmean(len(c[2]) for c in calls):.2f}"
    )
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name in names:
        print(
            f"  {name:>10}: {medians[name]:.3f} µs per merge (rounds: "
            + " ".join(f"{t:.3f}" for t in times[name])
            + ")"
        )
    if len(names) == 2:
        ratios = [b / a for a, b in zip(times[names[0]], times[names[1]], strict=True)]
        print(f"  {names[1]} / {names[0]}: {statistics.median(ratios):.3f} (median per round)")
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.merge_cost", description=__doc__)
    parser.add_argument("--writes", type=int, default=50_000)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--baseline", default="main", help="a git revision to compare with; '' for none"
    )
    args = parser.parse_args(argv)
    if "protocol/replay.py" in compiled_modules():
        # The write merges are captured by replacing merge_batches in the replay's module,
        # which compiled code does not look up.
        raise SystemExit(
            "bench.merge_cost: the replay is compiled in this checkout, and its merges "
            "cannot be captured; run it on the pure modules (make pure)"
        )
    modules: dict[str, types.ModuleType] = {}
    if args.baseline:
        modules[args.baseline] = baseline_module(args.baseline)
    modules["this"] = protocol.batches
    writes = write_merges(args.writes)
    compare("write", writes, tuple, _as_replay, modules, args.rounds)
    loads = load_merges(args.records)
    compare("load", loads, list, _as_loader, modules, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
