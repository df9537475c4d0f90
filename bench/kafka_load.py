"""A load generator that speaks Kafka's protocol: what wrk is to the HTTP scenarios.

    python -m bench.kafka_load HOST PORT FRAMES CONCURRENCY SECONDS [REQUESTS]

FRAMES is a file of pre-encoded WriteShareGroupState requests (``write_frames`` builds it
from bench/workload.py's bodies), each with its size prefix. CONCURRENCY connections
each keep one request in flight, as Kafka's persister does per connection: the next one
goes out when the answer to the last arrives; with REQUESTS, the run ends once that many
have been sent and answered (or SECONDS have passed, whichever comes first). Everything
runs in callbacks on uvloop (no coroutine per request), so the generator's cost per
request is a few microseconds of Python. It prints one JSON object: requests, seconds,
requests/s, p50/p99 in ms, and errors (answers that were not frames, or connections
lost).

``run_kafka_load`` runs it pinned to the generator CPU and returns a ``LoadResult`` with
the server's and the generator's CPU share, as ``bench.loadgen.run_wrk`` does for wrk.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.loadgen import LoadResult, _children_cpu
from bench.system import CpuMeter, generator_cpus, pinned


def write_frames(bodies: list[dict[str, Any]], path: Path, version: int = 1) -> Path:
    """Pre-encode HTTP-API write bodies as Kafka WriteShareGroupState request frames."""
    import msgspec  # noqa: PLC0415 - only when building the file

    from protocol import kafka_messages as km  # noqa: PLC0415
    from protocol.messages import Rpc, ShareGroupStateRequest, WritePartition  # noqa: PLC0415

    decode = msgspec.convert
    with open(path, "wb") as out:
        for i, body in enumerate(bodies):
            request = decode(body, ShareGroupStateRequest[WritePartition])
            payload = km.encode_state_request(Rpc.WRITE, version, request)
            out.write(km.encode_request_frame(85, version, i, payload, "bench"))
    return path


def read_frames(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        frames.append(data[pos : pos + 4 + size])
        pos += 4 + size
    return frames


class _Connection(asyncio.Protocol):
    def __init__(self, run: _Run, offset: int) -> None:
        self.run = run
        self.next = offset
        self.buf = b""
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send()

    def _send(self) -> None:
        run = self.run
        if run.limit is not None:
            if run.sent >= run.limit:
                run.finished(self)
                return
            run.sent += 1
        frames = run.frames
        frame = frames[self.next % len(frames)]
        self.next += 1
        self.sent_at = time.perf_counter()
        assert self.transport is not None
        self.transport.write(frame)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if len(buf) < 4:
            self.buf = buf
            return
        (size,) = struct.unpack_from(">i", buf, 0)
        if len(buf) < 4 + size:
            self.buf = buf
            return
        self.buf = buf[4 + size :]
        now = time.perf_counter()
        run = self.run
        run.latencies.append(now - self.sent_at)
        if now < run.stop_at:
            self._send()
        else:
            run.finished(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.run.open:  # lost before the run was over for it
            self.run.errors += 1
            self.run.finished(self)


class _Run:
    def __init__(self, frames: list[bytes], seconds: float, limit: int | None = None) -> None:
        self.frames = frames
        self.seconds = seconds
        self.limit = limit  # requests to send in all, or None: until the time is up
        self.sent = 0
        self.latencies: list[float] = []
        self.errors = 0
        self.stop_at = 0.0
        self.done: asyncio.Future[None] | None = None
        self.open: set[_Connection] = set()

    def finished(self, connection: _Connection) -> None:
        self.open.discard(connection)
        if not self.open and self.done is not None and not self.done.done():
            self.done.set_result(None)


async def _main(
    host: str,
    port: int,
    frames: list[bytes],
    concurrency: int,
    seconds: float,
    limit: int | None = None,
) -> Any:
    loop = asyncio.get_running_loop()
    run = _Run(frames, seconds, limit)
    run.done = loop.create_future()
    run.stop_at = time.perf_counter() + seconds + 60  # set for real once all are open
    connections = []
    for i in range(concurrency):
        offset = i * len(frames) // concurrency
        run.open.add(connection := _Connection(run, offset))
        connections.append(connection)
    started = time.perf_counter()
    run.stop_at = started + seconds
    await asyncio.gather(*(loop.create_connection(lambda c=c: c, host, port) for c in connections))
    await asyncio.wait_for(run.done, seconds + 60)
    elapsed = time.perf_counter() - started
    for c in connections:
        if c.transport is not None:
            c.transport.close()
    latencies = sorted(run.latencies)
    count = len(latencies)
    return {
        "requests": count,
        "seconds": elapsed,
        "requests_per_s": count / elapsed,
        "p50_ms": latencies[count // 2] * 1000 if count else 0.0,
        "p99_ms": latencies[min(count - 1, int(count * 0.99))] * 1000 if count else 0.0,
        "errors": run.errors,
    }


def main() -> None:
    import uvloop  # noqa: PLC0415

    host, port, path, concurrency, seconds = sys.argv[1:6]
    limit = int(sys.argv[6]) if len(sys.argv) > 6 else None
    frames = read_frames(path)
    result = uvloop.run(_main(host, int(port), frames, int(concurrency), float(seconds), limit))
    print(json.dumps(result))


def run_kafka_load(
    name: str,
    port: int,
    frames: Path,
    *,
    concurrency: int,
    duration_s: float,
    server_pid: int,
    items_per_request: int = 1,
    requests: int | None = None,
) -> LoadResult:
    """A run of ``duration_s``, or of ``requests`` requests (``duration_s`` then caps it)."""
    argv = pinned(
        generator_cpus(),
        [sys.executable, "-m", "bench.kafka_load", "127.0.0.1", str(port), str(frames),
         str(concurrency), f"{duration_s:g}", *([] if requests is None else [str(requests)])],
    )  # fmt: skip
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    server = CpuMeter(server_pid)
    server.start()
    before = _children_cpu()
    started = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=duration_s + 120, check=False
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"bench.kafka_load failed ({done.returncode}):\n{done.stderr}")
    found = json.loads(done.stdout)
    return LoadResult(
        name=name,
        concurrency=concurrency,
        requests_per_s=found["requests_per_s"],
        p50_ms=found["p50_ms"],
        p99_ms=found["p99_ms"],
        requests=found["requests"],
        non_2xx=0,
        errors=found["errors"],
        server_cpu=round(server.share(), 3),
        generator_cpu=round((_children_cpu() - before) / elapsed, 3),
        items_per_request=items_per_request,
    )


if __name__ == "__main__":
    main()
