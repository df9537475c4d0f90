"""Driving an HTTP server with wrk and reading what it says.

wrk (C, from Debian's package) replays pre-built request bodies from a file
(bench/wrk/bodies.lua), pinned to the generator CPU. Each run also measures how much of
a core the generator and the server used, so a table row can show which side was busy.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.system import CpuMeter, generator_cpus, pinned

LUA_SCRIPT = Path(__file__).parent / "wrk" / "bodies.lua"

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass
class LoadResult:
    name: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    errors: int
    server_cpu: float  # share of one core
    generator_cpu: float
    items_per_request: int = 1

    @property
    def items_per_s(self) -> float:
        return self.requests_per_s * self.items_per_request

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["items_per_s"] = self.items_per_s
        return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not match:
        raise ValueError(f"unreadable wrk duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(output: str) -> dict[str, float]:
    """Requests/s, p50/p99 (ms), request and error counts from `wrk --latency` output."""
    found: dict[str, float] = {}
    for raw in output.splitlines():
        line = raw.strip()
        if line.startswith("Requests/sec:"):
            found["requests_per_s"] = float(line.split()[1])
        elif re.match(r"^50(\.0+)?%\s", line):
            found["p50_ms"] = _ms(line.split()[1])
        elif re.match(r"^99(\.0+)?%\s", line):
            found["p99_ms"] = _ms(line.split()[1])
        elif re.match(r"^\d+ requests in", line):
            found["requests"] = float(line.split()[0])
        elif line.startswith("Non-2xx or 3xx responses:"):
            found["non_2xx"] = float(line.split(":")[1])
        elif line.startswith("Socket errors:"):
            found["errors"] = float(
                sum(int(n) for n in re.findall(r"(\d+)", line.split(":", 1)[1]))
            )
    missing = {"requests_per_s", "p50_ms", "p99_ms", "requests"} - found.keys()
    if missing:
        raise ValueError(f"wrk output lacks {sorted(missing)}:\n{output}")
    return found


def run_wrk(
    name: str,
    url: str,
    bodies: Path,
    *,
    concurrency: int,
    duration_s: float,
    server_pid: int,
    items_per_request: int = 1,
    content_type: str = "application/msgpack",
) -> LoadResult:
    threads = 1 if concurrency < 4 else 2
    argv = pinned(
        generator_cpus(),
        [
            "wrk",
            f"-t{threads}",
            f"-c{concurrency}",
            f"-d{duration_s:g}s",
            "--timeout",
            "10s",
            "--latency",
            "-s",
            str(LUA_SCRIPT),
            url,
        ],
    )
    env = dict(os.environ, BODIES=str(bodies), CONTENT_TYPE=content_type)
    server = CpuMeter(server_pid)
    server.start()
    # The generator's CPU time: what this process's reaped children used meanwhile.
    before = _children_cpu()
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    output, _ = proc.communicate(timeout=duration_s + 60)
    elapsed = time.monotonic() - started
    generator_share = (_children_cpu() - before) / elapsed
    server_share = server.share()
    text = output.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}):\n{text}")
    found = parse_wrk(text)
    return LoadResult(
        name=name,
        concurrency=concurrency,
        requests_per_s=found["requests_per_s"],
        p50_ms=found["p50_ms"],
        p99_ms=found["p99_ms"],
        requests=int(found["requests"]),
        non_2xx=int(found.get("non_2xx", 0)),
        errors=int(found.get("errors", 0)),
        server_cpu=round(server_share, 3),
        generator_cpu=round(generator_share, 3),
        items_per_request=items_per_request,
    )
