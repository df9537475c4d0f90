"""An open-loop load generator: requests at a fixed rate, latency from the scheduled time.

    python -m bench.open_loop [--server-pid PID] http|kafka HOST PORT FILE RATE SECONDS
                              [CONNECTIONS]

A closed loop (wrk, bench/kafka_load.py) sends the next request when an answer comes
back, so a slow answer delays the requests behind it and its delay is never counted:
it measures throughput. This generator sends request i at ``start + i / RATE`` whatever
happened before, and counts each latency from that scheduled time to its answer, so
time spent waiting for a free connection (queueing) is in the figure too. (The loop's
timers tick in whole milliseconds: a request that finds a connection free leaves at the
tick, up to a millisecond after its time, and is timed from when it left; one that
waits for a connection is timed from its scheduled time.)

FILE holds the requests: for ``http`` the length-prefixed msgpack bodies of
bench/workload.py (each POSTed to the write path), for ``kafka`` the size-prefixed
WriteShareGroupState frames of ``bench.kafka_load.write_frames``. CONNECTIONS
connections (64 by default) each carry one request at a time; a request due while all
are busy waits for the first one free, its clock running. The first second is warm-up
and not counted. Prints one JSON object: offered and answered rate, p50/p99/p99.9 in
ms, the requests counted and sent (the warm-up's included), errors (answers that were
not 200 or not frames), and with ``--server-pid`` the server's CPU over the counted
seconds as a share of one core (read from /proc when they begin and once every request
is answered, the server's threads included): how busy a rate keeps the server, which
is not the rate's share of its maximum when the work per request depends on the load.

Everything runs in callbacks on uvloop, a few microseconds of Python per request;
``run_open_loop`` runs it pinned to the generator CPU and returns its figures.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.system import CpuMeter, generator_cpus, pinned

WARMUP_S = 1.0
WRITE_PATH = "/v1/share-group-state/write"
# A journal flush this slow or slower counts in a row's slow flushes (the bound of a
# sharecoord_fsync_duration_seconds bucket).
SLOW_FLUSH_S = 0.001


@dataclass(frozen=True)
class CommitCounts:
    """A daemon's commit cycles so far (``sharecoord_fsync_duration_seconds``): each
    bucket's bound in seconds -> the cycles whose journal write and flush took at most
    that long, as the event loop saw them (+Inf: all of them)."""

    at_most: dict[float, int]

    @classmethod
    def parse(cls, metrics: str) -> CommitCounts:
        """From the text of a scrape of the daemon's /metrics."""
        at_most = {}
        for line in metrics.splitlines():
            if line.startswith("sharecoord_fsync_duration_seconds_bucket"):
                bound = line.split('le="', 1)[1].split('"', 1)[0]
                at_most[float(bound)] = int(float(line.rsplit(" ", 1)[1]))
        return cls(at_most)

    @property
    def cycles(self) -> int:
        return self.at_most.get(float("inf"), 0)

    def since(self, before: CommitCounts) -> CommitCounts:
        """The cycles after ``before``."""
        return CommitCounts({b: n - before.at_most.get(b, 0) for b, n in self.at_most.items()})

    def slow(self) -> int:
        """Cycles whose flush took over SLOW_FLUSH_S."""
        return self.cycles - self.at_most.get(SLOW_FLUSH_S, 0)

    def longest_at_most(self) -> float | None:
        """The smallest bucket bound no cycle's flush passed (inf past the last bound;
        None without cycles)."""
        if not self.cycles:
            return None
        return min(b for b, n in self.at_most.items() if n == self.cycles)


@dataclass
class OpenLoopResult:
    name: str
    protocol: str
    offered_per_s: float
    answered_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    requests: int
    errors: int
    load_share: float = 0.0  # the offered rate as a share of the measured maximum
    sent: int = 0  # every request sent, the warm-up's included
    server_cpu: float | None = None  # share of one core over the counted seconds
    writes_per_fsync: float | None = None  # sharecoord's: sent / its commit cycles
    # sharecoord's: the share of its commit cycles whose journal write and flush took
    # over 1 ms (the disk's slow spells, in the same run as the latencies they explain),
    # and the bucket bound the longest of them stayed within, in ms
    slow_flushes: float | None = None
    longest_flush_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def http_requests(path: Path, host: str, port: int) -> list[bytes]:
    """Each body of a bench/workload.py body file as a whole HTTP/1.1 POST."""
    from bench.workload import read_frames  # noqa: PLC0415

    head = (
        f"POST {WRITE_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/msgpack\r\nContent-Length: "
    ).encode()
    return [head + b"%d\r\n\r\n" % len(body) + body for body in read_frames(path)]


def kafka_requests(path: Path) -> list[bytes]:
    from bench.kafka_load import read_frames  # noqa: PLC0415

    return read_frames(str(path))


def _http_answer_end(buf: bytes) -> int:
    """Where the first whole HTTP answer in ``buf`` ends (0: not whole yet; -1: it
    is not a 200)."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return 0
    head = buf[: head_end + 2].lower()  # every header line ends in CRLF
    at = head.find(b"\r\ncontent-length:")
    length = int(head[at + 17 : head.find(b"\r\n", at + 2)]) if at >= 0 else 0
    end = head_end + 4 + length
    if len(buf) < end:
        return 0
    return end if buf[9:12] == b"200" else -end


def _kafka_answer_end(buf: bytes) -> int:
    if len(buf) < 4:
        return 0
    end = 4 + int.from_bytes(buf[:4], "big")
    return end if len(buf) >= end else 0


class _Connection(asyncio.Protocol):
    def __init__(self, run: _Run) -> None:
        self.run = run
        self.buf = b""
        self.due = 0.0  # when the request in flight is timed from
        self.scheduled = 0.0  # its place in the schedule (whether it is counted)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.run.idle.append(self)

    def send(self, request: bytes, due: float, scheduled: float) -> None:
        self.due = due
        self.scheduled = scheduled
        assert self.transport is not None
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        end = self.run.answer_end(buf)
        if end == 0:
            self.buf = buf
            return
        self.buf = buf[abs(end) :]
        self.run.answered(self, time.perf_counter(), failed=end < 0)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.run.stopped:
            self.run.errors += 1


class _Run:
    def __init__(self, requests: list[bytes], rate: float, seconds: float, kafka: bool) -> None:
        self.requests = requests
        self.interval = 1.0 / rate
        self.seconds = seconds
        self.answer_end = _kafka_answer_end if kafka else _http_answer_end
        self.idle: collections.deque[_Connection] = collections.deque()
        self.backlog: collections.deque[float] = collections.deque()  # due times waiting
        self.latencies: list[float] = []
        self.errors = 0
        self.sent = 0
        self.answers = 0
        self.stopped = False
        self.all_sent = False
        self.start = 0.0
        self.count_from = 0.0
        self.done: asyncio.Future[None] | None = None

    def tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send every request due by now (on a free connection, or into the backlog)."""
        now = time.perf_counter()
        end = self.start + self.seconds
        while True:
            due = self.start + self.sent * self.interval
            if due > now or due >= end:
                break
            self.sent += 1
            if self.idle and not self.backlog:
                # A free connection: the request leaves now. The loop's timers tick
                # in whole milliseconds, so now may be up to one past its due time;
                # that lateness is the generator's, and is not counted.
                self._send(self.idle.popleft(), now, due)
            else:
                self.backlog.append(due)
        if due >= end:
            self.all_sent = True
            self._check_done(now)
            return
        loop.call_later(due - time.perf_counter(), self.tick, loop)

    def _send(self, connection: _Connection, due: float, scheduled: float) -> None:
        request = self.requests[self.sent % len(self.requests)]
        connection.send(request, due, scheduled)

    def answered(self, connection: _Connection, now: float, failed: bool) -> None:
        self.answers += 1
        if failed:
            self.errors += 1
        elif connection.scheduled >= self.count_from:
            self.latencies.append(now - connection.due)
        if self.backlog:
            due = self.backlog.popleft()
            self._send(connection, due, due)
        else:
            self.idle.append(connection)
        self._check_done(now)

    def _check_done(self, now: float) -> None:
        done = self.done
        if self.all_sent and self.answers >= self.sent and done is not None and not done.done():
            done.set_result(None)


async def _main(
    kafka: bool, host: str, port: int, requests: list[bytes], rate: float, seconds: float,
    connections: int, server_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    loop = asyncio.get_running_loop()
    run = _Run(requests, rate, seconds + WARMUP_S, kafka)
    run.done = loop.create_future()
    opened = [_Connection(run) for _ in range(connections)]
    await asyncio.gather(*(loop.create_connection(lambda c=c: c, host, port) for c in opened))
    run.start = time.perf_counter()
    run.count_from = run.start + WARMUP_S
    # The server's CPU from the counted seconds' start, read from /proc in a thread (off
    # the loop that sends), until every request is answered.
    server = CpuMeter(server_pid) if server_pid is not None else None
    started: list[asyncio.Future[None]] = []
    if server is not None:
        loop.call_later(
            WARMUP_S, lambda: started.append(loop.run_in_executor(None, server.start))
        )
    server_cpu = None
    run.tick(loop)
    try:
        await asyncio.wait_for(run.done, seconds + WARMUP_S + 60)
        if server is not None:
            await asyncio.gather(*started)
            server_cpu = await loop.run_in_executor(None, server.share)
    finally:
        run.stopped = True
        for c in opened:
            if c.transport is not None:
                c.transport.close()
    latencies = sorted(run.latencies)
    count = len(latencies)

    def at(q: float) -> float:
        return latencies[min(count - 1, int(count * q))] * 1000 if count else 0.0

    return {
        "offered_per_s": rate,
        "answered_per_s": count / seconds,
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "requests": count,
        "errors": run.errors,
        "sent": run.sent,
        "server_cpu": server_cpu,
    }


def main() -> None:
    import uvloop  # noqa: PLC0415

    args = sys.argv[1:]
    server_pid = None
    if args[:1] == ["--server-pid"]:
        server_pid, args = int(args[1]), args[2:]
    protocol, host, port_text, path, rate, seconds = args[:6]
    connections = int(args[6]) if len(args) > 6 else 64
    port = int(port_text)
    kafka = protocol == "kafka"
    requests = kafka_requests(Path(path)) if kafka else http_requests(Path(path), host, port)
    found = uvloop.run(
        _main(
            kafka, host, port, requests, float(rate), float(seconds), connections, server_pid
        )
    )
    print(json.dumps(found))


def run_open_loop(
    name: str, protocol: str, port: int, requests: Path, *, rate: float, duration_s: float,
    load_share: float, server_pid: int | None = None,
    commits: Callable[[], CommitCounts] | None = None,
) -> OpenLoopResult:  # fmt: skip
    """One open-loop run of ``rate`` requests/s for ``duration_s`` (after the warm-up),
    the generator pinned to its CPU. With ``server_pid``, the server's CPU share over
    the counted seconds; with ``commits`` (the server's commit cycles so far:
    ``bench.__main__.commit_counts``), the requests sent per cycle, the share of slow
    flushes and the longest flush over the whole run."""
    watch = ["--server-pid", str(server_pid)] if server_pid is not None else []
    argv = pinned(
        generator_cpus(),
        [sys.executable, "-m", "bench.open_loop", *watch, protocol, "127.0.0.1", str(port),
         str(requests), f"{rate:.1f}", f"{duration_s:g}"],
    )  # fmt: skip
    before = commits() if commits is not None else None
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=duration_s + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.open_loop failed ({done.returncode}):\n{done.stderr}")
    found = json.loads(done.stdout)
    if commits is not None and before is not None:
        run = commits().since(before)
        if run.cycles > 0:
            longest = run.longest_at_most()
            found["writes_per_fsync"] = found["sent"] / run.cycles
            found["slow_flushes"] = run.slow() / run.cycles
            found["longest_flush_ms"] = None if longest is None else longest * 1000
    return OpenLoopResult(name=name, protocol=protocol, load_share=load_share, **found)


if __name__ == "__main__":
    main()
