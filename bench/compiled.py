"""`make bench`: the benchmark of the compiled mode, the mode a deployment that cares
for speed runs (server/native.py).

    python -m bench.compiled [python -m bench's arguments]

Builds the compiled mode in place when the tree is pure (or its build is older than
its source), runs ``python -m bench`` in a process of its own (so that everything it
imports, the in-process rows included, is the build), and then leaves the tree as it
found it: a build it made is removed, even when the run is interrupted. Where there is
no C compiler there is no compiled mode: it says so and benches the pure modules; the
report names the mode either way. ``python -m bench`` alone benches the tree as it is.
"""

from __future__ import annotations

import subprocess
import sys

from server import native


def _build_if_needed() -> bool | None:
    """True when this run built the compiled mode from a pure tree (and removes it
    after), False when the tree was compiled already (a stale build is built again,
    and kept), None when there is no compiler."""
    was_compiled = bool(native.compiled_modules())
    if was_compiled and native.stale_build() is None:
        print("bench: the compiled mode is built already; benching it", flush=True)
        return False
    if not native.has_compiler():
        print("bench: no C compiler (cc), so no compiled mode; benching pure Python", flush=True)
        return None
    if was_compiled:
        print("bench: the compiled modules are older than their source; building again", flush=True)
    else:
        print("bench: building the compiled mode for this run (removed after it)", flush=True)
    if native.build() != 0:
        raise SystemExit("bench: the compiled mode did not build; `make bench` stops here")
    return not was_compiled


def main(argv: list[str]) -> int:
    built = _build_if_needed()
    try:
        return subprocess.run([sys.executable, "-m", "bench", *argv], check=False).returncode
    except KeyboardInterrupt:
        return 130
    finally:
        if built:
            native.remove(quiet=True)
            print("bench: the compiled modules this run built are removed (pure mode again)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
