"""The optional compiled mode: the request path's modules built by mypyc from their own
source into extension modules beside it, which Python imports in the source's place.
Nothing else changes: one source, pure Python wherever there is no build.

    python -m server.native build     # `make compiled`: needs a C compiler
    python -m server.native remove    # `make pure`
    python -m server.native status

A build records the digest of each source it compiled (``MANIFEST``). The daemon checks
it at start (``stale_build``) and refuses to run a build older than its source: an
extension module would otherwise keep running the code as it was when it was built,
whatever the file says now.

What it gains is in README.md, "Performance" (interleaved with the pure modules on one
machine): about half the CPU of a single write and of a batched entry.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What runs per request. A msgspec Struct stays in a module Python runs: its constraints
# (Annotated[int, Meta(...)]) are not kept in the class's annotations of a compiled
# module, where msgspec and the Spark jobs read them. So the merge and the replay rules
# (batches.py, replay.py) are compiled while their Structs live beside them
# (state_batch.py, key_state.py): a batched entry 5.41 against 6.04 µs of CPU
# (bench.entry_cost, medians of 8 interleaved runs, 2026-11-28). The partition's log
# (persistence/partition.py) is in: its Struct (PendingBatch) has no constraints, and each
# entry's append, the failure check before it and the offsets read after it were
# interpreted calls from compiled code (bench.entry_cost, 8 interleaved pairs on
# 2026-11-28: 0.90x batched, 0.92x single). Its one write on the event loop goes through
# FileOps.write_on_loop, in a module Python runs, where the suite's blocking-call detector
# finds the Python frame it allows.
# The group commit (persistence/commit.py) is in: what it does per request (the
# durability barrier, the journal-size check, the waiters' release) ran interpreted
# between compiled callers; Kafka listener single writes at c=64, 6 interleaved pairs on
# 2026-11-28: 0.986x the CPU per request, lower in each pair. GroupCommitter is then a
# native class, which a parameter typed to it takes alone: the service takes a protocol
# (server/service.py's Commits), which the tests' stand-in fits too.
# Tried and left out as they gain nothing (2026-11-27, interleaved on one machine): the
# commit path (commit, journal, kernel_flush, fileops, statelog, partition) compiled beside
# these: Kafka listener single writes at c=64 21,040-22,095 against 21,644-22,311 req/s
# (its time is system calls and C); on 2026-11-28, journal and statelog beside commit and
# partition gained nothing over those two (3 rounds); batches.py and replay.py compiled
# with their Structs in place (which also loses the constraints): the in-process Kafka
# path 20.8-21.7 against 20.0-20.8 µs a request, slower;
# protocol/loading.py: the daemon's load of 1M records 1.74-1.88 against 1.50-1.55 s,
# slower; the commit path again at 3,000 open-loop writes/s, where a cycle carries one
# write: 172 against 164-170 µs of CPU a write. A compiled module reaches a msgspec
# Struct's fields through the generic attribute lookup, and calls interpreted functions
# through the C API, where Python 3.11's interpreter has specialized, inline paths for
# both. What does pay is typing what a compiled loop unpacks (persistence/frame.py's
# header: 450 against 690 ns a frame).
# The runtime's generators, which mypyc does not compile, are in server/folds.py.
MODULES = (
    "persistence/commit.py",
    "persistence/frame.py",
    "persistence/partition.py",
    "protocol/batches.py",
    "protocol/codec.py",
    "protocol/kafka_messages.py",
    "protocol/kafka_primitives.py",
    "protocol/kafka_wire.py",
    "protocol/replay.py",
    "protocol/routing.py",
    "protocol/shard.py",
    "protocol/sweep.py",
    "protocol/update_value.py",
    "server/kafka/connection.py",
    "server/kafka/handlers.py",
    "server/runtime.py",
    "server/service.py",
    "server/turns.py",
)
# The library the compiled modules share, inside this package so that an installed
# (editable) sharecoord finds it from any working directory; and the manifest of the
# build beside it. (Built from parts: the documentation scanner would take whole names
# for references to files a checkout does not have until it builds.)
GROUP = f"{__package__}.native_group"
MANIFEST = Path(__package__ or "server") / "native-build.json"
LOG = "build/native.log"


def _digest(path: Path) -> str | None:
    """The source's SHA-256, or None when it cannot be read (say, deleted)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _module_name(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def _built_files(root: Path) -> list[Path]:
    """The extension modules a build leaves in the tree (any Python version's)."""
    found = []
    for source in MODULES:
        path = root / source
        found += sorted(path.parent.glob(f"{path.stem}.*.so"))
    package, _, name = GROUP.rpartition(".")
    found += sorted((root / package.replace(".", "/")).glob(f"{name}__mypyc.*.so"))
    return found


def has_compiler() -> bool:
    """Whether this machine has the C compiler a build needs (``$CC``, else ``cc``)."""
    return shutil.which(os.environ.get("CC", "cc")) is not None


def compiled_modules() -> list[str]:
    """The modules of ``MODULES`` that this interpreter imports as extension modules."""
    out = []
    for source in MODULES:
        spec = importlib.util.find_spec(_module_name(source))
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            out.append(source)
    return out


def stale_build(root: Path = ROOT) -> str | None:
    """Why the compiled modules cannot run (one line), or None: no build, or a build
    of the sources as they are."""
    compiled = compiled_modules()
    if not compiled:
        return None
    manifest = root / MANIFEST
    try:
        built = json.loads(manifest.read_text())
    except (OSError, ValueError):
        built = {}
    changed = [s for s in compiled if built.get(s) is None or built[s] != _digest(root / s)]
    if not changed:
        return None
    return (
        f"compiled modules older than their source ({', '.join(changed)}): "
        "run `make compiled` again, or `make pure` to run the source"
    )


def build(root: Path = ROOT) -> int:
    """Compile ``MODULES`` in place; 0 when built. gcc's output goes to ``LOG``."""
    remove(root, quiet=True)
    log_path = root / LOG
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "server.native", "setup"],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = log_path.read_text().splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        print(f"compiled mode: the build failed (the whole output: {LOG})", file=sys.stderr)
        return 1
    digests = {source: _digest(root / source) for source in MODULES}
    (root / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"compiled mode: {len(MODULES)} modules built (make pure removes them)")
    return 0


def remove(root: Path = ROOT, quiet: bool = False) -> int:
    built = _built_files(root)
    for path in built:
        path.unlink()
    (root / MANIFEST).unlink(missing_ok=True)
    if not quiet:
        print(f"pure mode: {len(built)} compiled files removed" if built else "pure mode already")
    return 0


def _setup() -> int:
    """What ``build`` runs in a child process: setuptools' build_ext over mypycify."""
    from mypyc.build import mypycify  # noqa: PLC0415 - only in a build
    from setuptools import setup  # type: ignore[import-untyped]  # noqa: PLC0415

    sys.argv = [sys.argv[0], "build_ext", "--inplace"]
    setup(
        name="sharecoord-native",
        ext_modules=mypycify(list(MODULES), group_name=GROUP),
        packages=[],
        py_modules=[],
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "status"
    if command == "build":
        return build()
    if command == "remove":
        return remove()
    if command == "setup":
        return _setup()
    if command == "status":
        stale = stale_build()
        compiled = compiled_modules()
        print(stale or f"compiled modules: {len(compiled)} of {len(MODULES)}")
        return 1 if stale else 0
    print(f"usage: python -m server.native build|remove|status (not {command!r})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
