"""The equal-work peers' load generator: pre-built requests replayed at a fixed concurrency.

    python -m bench.replay --protocol pg|redis --port P --requests FILE [--setup FILE]
        --concurrency C --duration S --server-pid PID --out RESULT.json

wrk's model, for the wire protocols wrk cannot speak: C connections, each with one request
in flight, taking the next request of one shared sequence (the file's order, wrapping
around) as soon as its reply is in. Requests and setup steps (PostgreSQL's startup and
Parse) are bytes prepared by bench/equal_work.py, so the generator encodes nothing; it
finds where each reply ends and checks that it says success (a reply byte-equal to a
success seen before needs no parsing). It measures its own CPU and the server's over
the timed window only, so connecting and loading the file count for neither side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import uvloop

from bench.system import CpuMeter
from bench.wire import pg_error, pg_reply_end, pg_reply_ok, resp_reply_end, resp_reply_ok
from bench.workload import read_frames

PROTOCOLS: dict[str, tuple[Callable[[bytes | bytearray], int | None], Callable[[bytes], bool]]] = {
    "pg": (pg_reply_end, pg_reply_ok),
    "redis": (resp_reply_end, resp_reply_ok),
}


def percentile(values: list[int], pct: float) -> float:
    """Nearest rank, as bench.peers computes pgbench's."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))])


class _Run:
    def __init__(self, requests: list[bytes], ok: Callable[[bytes], bool]) -> None:
        self.requests = requests
        self.next = 0
        self.ok = ok
        self.ok_replies: set[bytes] = set()
        self.running = False
        self.latencies_ns: list[int] = []
        self.errors = 0
        self.first_error: str | None = None
        self.in_flight = 0
        self.drained: asyncio.Future[None] | None = None

    def take(self) -> bytes:
        request = self.requests[self.next]
        self.next = (self.next + 1) % len(self.requests)
        return request

    def check(self, reply: bytes) -> None:
        if reply in self.ok_replies:
            return
        if self.ok(reply):
            self.ok_replies.add(reply)
            return
        self.errors += 1
        if self.first_error is None:
            self.first_error = pg_error(reply) or repr(reply[:200])


class _Client(asyncio.Protocol):
    def __init__(
        self,
        run: _Run,
        setup: list[bytes],
        reply_end: Callable[[bytes | bytearray], int | None],
        ready: asyncio.Future[None],
    ) -> None:
        self.run = run
        self.setup = list(setup)
        self.reply_end = reply_end
        self.ready = ready
        self.buf = bytearray()
        self.sent_at = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they write.
        self.transport = cast(asyncio.Transport, transport)
        if self.setup:
            self.transport.write(self.setup[0])
        else:
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection lost during setup: {exc}"))
            return
        # The server hung up: an error of the run, and no reply will come.
        run = self.run
        run.errors += 1
        run.first_error = run.first_error or f"connection lost: {exc}"
        if self.sent_at:
            run.in_flight -= 1
            if not run.in_flight and run.drained is not None and not run.drained.done():
                run.drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self.buf and self.reply_end(data) == len(data):
            self._reply(data)  # the usual case: one whole reply per read
            return
        self.buf += data
        while (end := self.reply_end(self.buf)) is not None:
            reply = bytes(self.buf[:end])
            del self.buf[:end]
            self._reply(reply)

    def send_next(self) -> None:
        assert self.transport is not None
        self.run.in_flight += 1
        self.sent_at = time.perf_counter_ns()
        self.transport.write(self.run.take())

    def _replied(self) -> None:
        self.run.in_flight -= 1
        self.sent_at = 0

    def _reply(self, reply: bytes) -> None:
        if self.setup:
            error = pg_error(reply)
            if error is not None:
                self.ready.set_exception(RuntimeError(f"setup failed: {error}"))
                return
            self.setup.pop(0)
            if self.setup:
                assert self.transport is not None
                self.transport.write(self.setup[0])
            else:
                self.ready.set_result(None)
            return
        run = self.run
        latency = time.perf_counter_ns() - self.sent_at
        self._replied()
        if not run.running:
            run.check(reply)  # past the window: not timed, but an error is still one
            if not run.in_flight and run.drained is not None and not run.drained.done():
                run.drained.set_result(None)
            return
        run.latencies_ns.append(latency)
        run.check(reply)
        self.send_next()


async def replay(
    protocol: str,
    port: int,
    requests: list[bytes],
    setup: list[bytes],
    *,
    concurrency: int,
    duration_s: float,
    server_pid: int,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    reply_end, ok = PROTOCOLS[protocol]
    run = _Run(requests, ok)
    clients: list[_Client] = []
    for _ in range(concurrency):
        ready: asyncio.Future[None] = loop.create_future()
        _, client = await loop.create_connection(
            lambda ready=ready: _Client(run, setup, reply_end, ready),  # type: ignore[misc]
            "127.0.0.1",
            port,
        )
        await asyncio.wait_for(ready, timeout=60)
        clients.append(client)
    server = CpuMeter(server_pid)
    own_before = _own_cpu()
    server.start()
    started = time.monotonic()
    run.running = True
    for client in clients:
        client.send_next()
    await asyncio.sleep(duration_s)
    run.running = False
    elapsed = time.monotonic() - started
    generator_cpu = (_own_cpu() - own_before) / elapsed
    server_cpu = server.share()
    run.drained = loop.create_future()
    if run.in_flight:
        await asyncio.wait_for(run.drained, timeout=60)
    for client in clients:
        if client.transport is not None:
            client.transport.close()
    latencies = run.latencies_ns
    return {
        "requests": len(latencies),
        "elapsed_s": elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) / 1e6,
        "p99_ms": percentile(latencies, 99) / 1e6,
        "errors": run.errors,
        "first_error": run.first_error,
        "server_cpu": server_cpu,
        "generator_cpu": generator_cpu,
    }


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", type=Path, required=True)
    parser.add_argument("--setup", type=Path)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    requests = read_frames(args.requests)
    setup = read_frames(args.setup) if args.setup else []
    result = uvloop.run(
        replay(
            args.protocol,
            args.port,
            requests,
            setup,
            concurrency=args.concurrency,
            duration_s=args.duration,
            server_pid=args.server_pid,
        )
    )
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
