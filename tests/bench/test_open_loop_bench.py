"""bench/open_loop.py: it reads whole answers out of the byte stream, and it sends what
its schedule says, counting each request once; the server's CPU share it reports is the
CPU over the wall time it measured; the report prints both, and the share of the
daemon's commit cycles whose journal flush was slow, read from its metrics. Counted,
never timed."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from bench import kafka_null, open_loop, report
from bench.kafka_load import write_frames
from bench.open_loop import CommitCounts
from bench.system import CpuMeter
from bench.workload import write_bodies
from server.metrics import ShareCoordinatorMetrics
from server.store import cycle_recorder

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: 3\r\n\r\nabc"


def test_an_http_answer_ends_after_its_body_whichever_header_comes_last() -> None:
    length_first = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nServer: x\r\n\r\nabc"
    for answer in (OK, length_first):
        assert open_loop._http_answer_end(answer + b"HTTP/1.1 2") == len(answer)
        assert open_loop._http_answer_end(answer[:-1]) == 0  # body not whole yet
    assert open_loop._http_answer_end(OK[:20]) == 0  # head not whole yet


def test_an_http_answer_other_than_200_is_a_failure() -> None:
    answer = OK.replace(b"200 OK", b"503 Service Unavailable")
    assert open_loop._http_answer_end(answer) == -len(answer)


def test_a_kafka_answer_ends_after_its_size() -> None:
    frame = (5).to_bytes(4, "big") + b"12345"
    assert open_loop._kafka_answer_end(frame + b"\x00") == len(frame)
    assert open_loop._kafka_answer_end(frame[:-1]) == 0


def test_it_counts_each_scheduled_request_of_the_counted_second_once(tmp_path: Path) -> None:
    frames = write_frames(write_bodies(random.Random(7), 50, 1), tmp_path / "w.kafka")
    requests = open_loop.kafka_requests(frames)

    accepted: list[asyncio.BaseTransport] = []

    class Null(kafka_null._Null):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            accepted.append(transport)

    async def against_a_null_server() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Null, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            found = await open_loop._main(
                True, "127.0.0.1", port, requests, 200.0, 1.0, 4, server_pid=os.getpid()
            )
        # The server's side of each connection closes on the client's EOF, which may not
        # be read before the loop ends: closed here, or a later test's garbage
        # collection finds the transport unclosed (a ResourceWarning, an error there).
        for transport in accepted:
            transport.close()
        await asyncio.sleep(0)  # their connection_lost, which closes the sockets
        return found

    found = asyncio.run(against_a_null_server())
    # 200 a second: the warm-up second's 200 are answered but not counted, the next 200 are.
    assert found["requests"] == 200
    assert found["sent"] == 400
    assert found["errors"] == 0
    assert found["p50_ms"] <= found["p99_ms"] <= found["p999_ms"]
    assert found["server_cpu"] is not None  # the server here is this process
    assert 0 <= found["server_cpu"] <= os.cpu_count()  # type: ignore[operator]


def test_the_server_cpu_share_is_cpu_time_over_wall_time_between_start_and_share() -> None:
    watch = CpuMeter(os.getpid())  # what the generator measures the server with
    watch.start()
    spent = time.process_time() + 0.3
    while time.process_time() < spent:  # one core busy, this thread alone
        pass
    share = watch.share()
    # CPU time over wall time: at most this one thread's core (plus the clock ticks'
    # rounding), and well above nothing even on a busy machine that delays the loop.
    assert 0.1 < share < 1.2


def test_the_report_shows_the_servers_cpu_and_writes_per_fsync_where_measured() -> None:
    row = {
        "name": "sharecoord", "protocol": "kafka", "load_share": 0.5, "offered_per_s": 12000.0,
        "answered_per_s": 12000.0, "p50_ms": 0.5, "p99_ms": 2.0, "p999_ms": 5.0, "errors": 0,
    }  # fmt: skip
    measured = {
        **row, "server_cpu": 0.853, "writes_per_fsync": 3.44, "slow_flushes": 0.0067,
        "longest_flush_ms": 250.0,
    }  # fmt: skip
    lines = report._open_loop_table([measured, {**row, "name": "null server"}])
    same = "| kafka | 50% | 12,000 | 12,000 | 0.50 | 2.00 | 5.00 | 0 |"
    assert f"| sharecoord {same} 85% | 3.4 | 0.67%, longest ≤ 250 ms |" in lines
    assert f"| null server {same}  |  |  |" in lines
    assert any(line.startswith("Server CPU is") for line in lines)
    # An older result, which has neither: the table as it was, and no note.
    assert not any(line.startswith("Server CPU is") for line in report._open_loop_table([row]))


def test_slow_flushes_are_the_cycles_over_1_ms_in_the_daemons_own_scrape() -> None:
    metrics = ShareCoordinatorMetrics()
    record = cycle_recorder(metrics)
    record(2, [0.03])
    before = CommitCounts.parse(metrics.render())
    # le is "at most": a cycle of exactly 1 ms is not slow.
    for seconds in (0.0004, 0.0009, 0.001, 0.0011, 0.2):
        record(2, [seconds])
    run = CommitCounts.parse(metrics.render()).since(before)
    assert (run.cycles, run.slow(), run.longest_at_most()) == (5, 2, 0.25)
    record(2, [30.0])  # past the last bound
    assert CommitCounts.parse(metrics.render()).longest_at_most() == float("inf")
    empty = CommitCounts.parse(ShareCoordinatorMetrics().render())
    assert (empty.cycles, empty.slow(), empty.longest_at_most()) == (0, 0, None)
