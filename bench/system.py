"""The machine and its processes: what the benchmark runs on, and how busy each side was.

Servers run pinned to one core and load generators to another (when there are two), so
a generator competes with no server for CPU; every run records each side's CPU use from
/proc, which is how the report shows the generator was not the bottleneck.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from server import native

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_env() -> dict[str, str]:
    """The environment for a `python -m bench...` or `-m server...` child: this checkout
    first on the import path, whatever the working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def cores() -> int:
    return len(os.sched_getaffinity(0))


def server_cpus() -> str:
    return "0"


def generator_cpus() -> str:
    return "1" if cores() > 1 else "0"


def pinned(cpus: str, argv: Sequence[str]) -> list[str]:
    """argv run on the given CPUs (taskset), or as is where taskset is missing."""
    if shutil.which("taskset"):
        return ["taskset", "-c", cpus, *argv]
    return list(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {deadline_s}s")


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (PostgreSQL's backends, say)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes (and their reaped children)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime are fields 14-17 (1-based) of the full line.
        total += sum(int(x) for x in fields[11:15])
    return total / CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU use of a process tree over an interval, as a share of one core."""

    root_pid: int
    started_cpu: float = 0.0
    started_at: float = 0.0

    def start(self) -> None:
        self.started_cpu = cpu_seconds(process_tree(self.root_pid))
        self.started_at = time.monotonic()

    def share(self) -> float:
        elapsed = time.monotonic() - self.started_at
        used = cpu_seconds(process_tree(self.root_pid)) - self.started_cpu
        return used / elapsed if elapsed > 0 else 0.0


def fdatasync_latency_ms(directory: str, rounds: int = 200) -> float:
    """Mean time of a 4 KiB append + fdatasync on the disk under `directory`."""
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        block = b"x" * 4096
        started = time.perf_counter()
        for _ in range(rounds):
            os.write(fd, block)
            os.fdatasync(fd)
        return (time.perf_counter() - started) / rounds * 1000
    finally:
        os.close(fd)
        os.unlink(path)


def _first_line(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def describe_machine(scratch_dir: str) -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu_model,
        "cores": cores(),
        "memory_gib": round(memory_gib, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "fdatasync_ms": round(fdatasync_latency_ms(scratch_dir), 3),
        "filesystem": _first_line(["stat", "-f", "-c", "%T", scratch_dir]),
        "wrk": _first_line(["wrk", "--version"]),
        "postgres": _first_line([postgres_bin("postgres"), "--version"]),
        "redis": _first_line(["redis-server", "--version"]),
        "pinning": f"servers on CPU {server_cpus()}, load generators on CPU {generator_cpus()}",
        "code": code_mode(),
    }


def code_mode() -> str:
    """Whether the daemons this run starts (from this checkout) run compiled modules."""
    compiled = native.compiled_modules()
    if not compiled:
        return "pure Python"
    return f"compiled mode ({len(compiled)} of {len(native.MODULES)} modules, make compiled)"


def postgres_bin(name: str) -> str:
    """A PostgreSQL 15 server binary (Debian keeps them out of PATH)."""
    found = shutil.which(name)
    if found and name != "postgres":
        return found
    candidate = f"/usr/lib/postgresql/15/bin/{name}"
    return candidate if os.path.exists(candidate) else (found or name)


def ensure_debian_packages(binaries: dict[str, str]) -> None:
    """Install the Debian package of each missing binary (binary -> package)."""
    missing = sorted({package for binary, package in binaries.items() if not _have(binary)})
    if not missing:
        return
    print(f"installing from Debian packages: {' '.join(missing)}", flush=True)
    prefix = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run([*prefix, "apt-get", "update", "-q"], check=True, env=env)
    subprocess.run([*prefix, "apt-get", "install", "-y", "-q", *missing], check=True, env=env)


def _have(binary: str) -> bool:
    return shutil.which(binary) is not None or os.path.exists(postgres_bin(binary))


@contextlib.contextmanager
def running(
    argv: Sequence[str], *, env: dict[str, str] | None = None, log: str, cwd: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process for the duration of the block, stopped with SIGTERM after it."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
