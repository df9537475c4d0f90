"""The compiled pass of `make test`: the conformance and model tests, and the daemon
over both transports, run again with the request path compiled (server/native.py).

    python -m tests.compiled [pytest arguments]

The build goes into a copy of the tree (build/compiled-tree), so the working tree stays
as it was: a developer's edits never meet a build of older source there. Without a C
compiler there is no compiled mode, and the pass says so and succeeds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from server import native

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "compiled-tree"
# Set for the pass's pytest: tests/test_compiled_mode.py then checks it runs compiled.
COMPILED_PASS = "SHARECOORD_COMPILED_PASS"

# What must hold in each mode: the combiner and the codecs against their references,
# the shard's rules and model, Kafka's own share coordinator answering the same requests,
# the log and its group commit, the RPCs end to end over HTTP and the Kafka protocol,
# what an answer waits for, and bad input refused in one line.
TESTS = (
    "tests/protocol",
    "tests/persistence",
    "tests/shard",
    "tests/kafka_peer",
    "tests/server/test_e2e_rpc.py",
    "tests/server/test_e2e_http.py",
    "tests/server/test_e2e_kafka.py",
    "tests/server/test_long_work.py",
    "tests/server/test_lazy_load.py",
    "tests/server/test_service_durability.py",
    "tests/server/test_cli_bad_input.py",
    "tests/test_compiled_mode.py",
)

# Not copied: what is the checkout's own (git, the venv, builds, data, caches) and what
# a build makes. Kafka's jars (make kafka-peer) are linked, not copied.
_TOP_LEVEL_SKIPPED = {".git", ".venv", "build", "dist", "data", "spark-warehouse", "metastore_db"}
_SKIPPED = shutil.ignore_patterns(
    "__pycache__", "*.so", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"
)


def _skip(directory: str, names: list[str]) -> set[str]:
    skipped = set(_SKIPPED(directory, names))
    here = Path(directory)
    if here == ROOT:
        skipped |= _TOP_LEVEL_SKIPPED.intersection(names)
    elif here == ROOT / "kafka_peer":
        skipped.add("cache")
    return skipped


def _copy_tree() -> None:
    if TREE.exists():
        shutil.rmtree(TREE)
    shutil.copytree(ROOT, TREE, ignore=_skip)
    cache = ROOT / "kafka_peer" / "cache"
    if cache.is_dir():
        (TREE / "kafka_peer" / "cache").symlink_to(cache, target_is_directory=True)


def main(argv: list[str]) -> int:
    if not native.has_compiler():
        print("make test: no C compiler (cc), so no compiled mode to test; skipped")
        return 0
    _copy_tree()
    built = subprocess.run([sys.executable, "-m", "server.native", "build"], cwd=TREE, check=False)
    if built.returncode != 0:
        return built.returncode
    print("== the compiled pass: " + " ".join(TESTS), flush=True)
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *TESTS, *argv],
        cwd=TREE,
        env={**os.environ, COMPILED_PASS: "1"},
        check=False,
    )
    return tested.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
