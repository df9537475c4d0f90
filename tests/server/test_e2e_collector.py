"""Python's cyclic garbage collector under a steady load (docs/design.md#the-shard).

A request keeps its decoded entries, results and answer alive while it waits for its
commit, and leaves nothing behind once answered. Sixteen 50-entry writes waiting on one
commit hold some ten thousand such objects at once; a young generation smaller than that
was collected again and again while it held them (every 2,000 objects: ~60 young
collections a second under the bench's batched writes, ~5% of the daemon's CPU), each
walking objects about to be freed anyway. The daemon's young threshold is above what
such a load keeps alive, so under it the collector does not run at all.

What the collector is then left to free must not hold much: garbage in cycles waits for
the next young collection. A body cut off half way is one (aiohttp keeps the failed
read's exception on the request's stream, and its traceback holds the read so far).
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    init_entry,
    metric_value,
    wait_until,
    write_entry,
)
from tests.server.conftest import ServeFactory

CONCURRENT = 16  # requests in flight, as the bench's batched row (c=16)
ENTRIES = 50  # per request, as the bench's batched row (x50)
ROUNDS = 40


def _young_collections(page: str) -> float:
    return metric_value(page, "sharecoord_gc_collections_total", generation="0")


def _writes(round_: int) -> list[dict[str, Any]]:
    first = 10 * round_
    return [
        body(
            f"g{group}",
            (
                TOPIC,
                [
                    write_entry(
                        p,
                        batch(first, first + 4, 0, 1),
                        batch(first + 5, first + 9, 2, 1),
                        start_offset=first,
                    )
                    for p in range(ENTRIES)
                ],
            ),
        )
        for group in range(CONCURRENT)
    ]


async def test_steady_batched_writes_run_no_young_collection(spawn: Any, tmp_path: Path) -> None:
    daemon = await spawn(tmp_path / "data")
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        for group in range(CONCURRENT):
            init = body(f"g{group}", (TOPIC, [init_entry(p) for p in range(ENTRIES)]))
            assert set(await api.codes("initialize", init)) == {0}
        rounds = [_writes(r) for r in range(ROUNDS + 1)]
        await asyncio.gather(*(api.codes("write", w) for w in rounds[0]))  # warmed up
        before = _young_collections(await api.metrics())
        for writes in rounds[1:]:
            answers = await asyncio.gather(*(api.codes("write", w) for w in writes))
            assert {code for codes in answers for code in codes} == {0}
        after = _young_collections(await api.metrics())
    # 640 requests, 32,000 entries: with the young threshold at 2,000 this counted
    # dozens of collections; one may still fall in the run (the metrics page, a
    # connection's setup).
    assert after - before <= 1, f"{after - before:.0f} young collections under the load"


HALF_BODY = 512 * 1024


def _big_buffers_in_cycles() -> list[str]:
    """The containers the collector finds unreachable that hold a buffer of at least
    HALF_BODY bytes (found with DEBUG_SAVEALL, then let go)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = []
        for garbage in gc.garbage:
            for held in gc.get_referents(garbage):
                if isinstance(held, (bytes, bytearray)) and len(held) >= HALF_BODY:
                    name = type(garbage).__name__
                    code = getattr(garbage, "f_code", None)
                    found.append(name if code is None else f"{name} of {code.co_name}")
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_a_body_cut_off_half_way_is_freed_without_the_collector(
    serve: ServeFactory,
) -> None:
    served = await serve()
    errors_before = await served.api().metric(
        "sharecoord_http_error_responses_total", status="400"
    )
    gc.collect()
    _, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    head = (
        "POST /v1/share-group-state/write HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {2 * HALF_BODY}\r\n\r\n"
    )
    writer.write(head.encode() + b"[" * HALF_BODY)
    await writer.drain()
    writer.transport.abort()  # gone half way: a reset, no more bytes
    # Its 400 is counted once the read failed, although nobody is left to take it.
    await wait_until(
        lambda: served.api().metric("sharecoord_http_error_responses_total", status="400"),
        "the cut-off body's refusal",
        until=lambda count: count > errors_before,
    )
    assert _big_buffers_in_cycles() == []
