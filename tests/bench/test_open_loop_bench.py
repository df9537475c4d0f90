"""bench/open_loop.py: it reads whole answers out of the byte stream, and it sends what
its schedule says, counting each request once. Counted, never timed."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from bench import kafka_null, open_loop
from bench.kafka_load import write_frames
from bench.workload import write_bodies

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
            found = await open_loop._main(True, "127.0.0.1", port, requests, 200.0, 1.0, 4)
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
    assert found["errors"] == 0
    assert found["p50_ms"] <= found["p99_ms"] <= found["p999_ms"]
