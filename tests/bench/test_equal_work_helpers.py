"""The pure helpers of the equal-work peers: wire framing, request encoding, the
sharecoord side of the equality check, and the replay generator against a stand-in
server. No PostgreSQL, no Redis (tests/bench/test_equal_work_peers.py has those)."""

from __future__ import annotations

import asyncio
import os
import random
import struct

import msgpack
import pytest

from bench import equal_work
from bench.equal_work import Entry, KeyView, PostgresPeer, RedisPeer
from bench.replay import percentile, replay
from bench.wire import (
    RespError,
    pg_array,
    pg_error,
    pg_execute,
    pg_message,
    pg_messages,
    pg_parse_array,
    pg_reply_end,
    pg_reply_ok,
    pg_rows,
    resp_command,
    resp_parse,
    resp_reply_end,
    resp_reply_ok,
)
from bench.workload import TOPIC_ID, group_name, write_bodies

ACQ, ACK = 1, 2


def _data_row(*values: bytes | None) -> bytes:
    payload = struct.pack("!H", len(values))
    for value in values:
        payload += struct.pack("!i", -1) if value is None else struct.pack("!I", len(value)) + value
    return pg_message(b"D", payload)


def _pg_reply(*messages: bytes) -> bytes:
    return pg_message(b"2", b"") + b"".join(messages) + pg_message(b"Z", b"I")


def _pg_error(text: str) -> bytes:
    return pg_message(b"E", b"SERROR\0C40P01\0M" + text.encode() + b"\0\0")


# --- PostgreSQL framing -------------------------------------------------------------------


def test_pg_reply_ends_after_ready_for_query_and_waits_for_more():
    reply = _pg_reply(_data_row(b"0"), pg_message(b"C", b"SELECT 1\0"))
    assert pg_reply_end(reply) == len(reply)
    assert pg_reply_end(reply + b"2\0") == len(reply)
    for cut in range(len(reply)):
        assert pg_reply_end(reply[:cut]) is None


def test_pg_reply_ok_needs_only_zero_codes_and_no_error():
    assert pg_reply_ok(_pg_reply(_data_row(b"0")))
    assert pg_reply_ok(_pg_reply(_data_row(b"{0,0,0}")))
    assert not pg_reply_ok(_pg_reply(_data_row(b"42")))
    assert not pg_reply_ok(_pg_reply(_data_row(b"{0,124,0}")))
    assert not pg_reply_ok(_pg_reply(_data_row(None)))
    assert not pg_reply_ok(_pg_reply(_pg_error("deadlock detected")))


def test_pg_rows_and_error_read_text_values():
    reply = _pg_reply(_data_row(b"g", None, b"{1,2}"), _data_row(b"h", b"7", b"{}"))
    assert pg_rows(reply) == [["g", None, "{1,2}"], ["h", "7", "{}"]]
    assert pg_error(reply) is None
    assert pg_error(_pg_reply(_pg_error("boom"))) == "40P01: boom"


def test_pg_arrays_round_trip():
    assert pg_array([0, -1, 2**40]) == "{0,-1,1099511627776}"
    assert pg_parse_array("{0,-1,1099511627776}") == [0, -1, 2**40]
    assert pg_parse_array("{}") == []


def test_pg_execute_binds_text_parameters_then_executes_and_syncs():
    request = pg_execute("w", ["g", "{1,2}"])
    kinds = [kind for kind, _ in pg_messages(request)]
    assert kinds == [b"B", b"E", b"S"]
    bind = pg_messages(request)[0][1]
    assert bind.startswith(b"\0w\0" + struct.pack("!HH", 0, 2))
    assert b"\0\0\0\x01g\0\0\0\x05{1,2}" in bind


# --- Redis framing ------------------------------------------------------------------------


def test_resp_command_is_an_array_of_bulk_strings():
    assert resp_command("FCALL", "f", 1, b"k") == (
        b"*4\r\n$5\r\nFCALL\r\n$1\r\nf\r\n$1\r\n1\r\n$1\r\nk\r\n"
    )


def test_resp_parse_every_reply_kind_and_incomplete_ones():
    reply = b"*3\r\n:0\r\n$3\r\nabc\r\n*1\r\n-ERR x\r\n"
    value, end = resp_parse(reply)  # type: ignore[misc]
    assert end == len(reply)
    assert value[:2] == [0, b"abc"]
    assert isinstance(value[2][0], RespError)
    for cut in range(len(reply)):
        assert resp_reply_end(reply[:cut]) is None
    assert resp_parse(b"$-1\r\n") == (None, 5)
    assert resp_parse(b"+OK\r\n") == (b"OK", 5)


def test_resp_reply_ok_needs_only_zero_codes():
    assert resp_reply_ok(b":0\r\n")
    assert resp_reply_ok(b"*2\r\n:0\r\n:0\r\n")
    assert not resp_reply_ok(b":74\r\n")
    assert not resp_reply_ok(b"*2\r\n:0\r\n:124\r\n")
    assert not resp_reply_ok(b"*0\r\n")
    assert not resp_reply_ok(b"-ERR script\r\n")


# --- request encoding ---------------------------------------------------------------------


def _entry(partition: int, *batches: tuple[int, int, int, int], start: int = -1) -> Entry:
    return Entry("g", TOPIC_ID, partition, 0, 0, start, -1, tuple(batches))


def test_body_entries_keep_every_field_in_order():
    body = write_bodies(random.Random(1), 1, 3)[0]
    entries = equal_work.body_entries(body)
    assert [e.partition for e in entries] == [
        p["partition"] for p in body["topics"][0]["partitions"]
    ]
    first = body["topics"][0]["partitions"][0]
    assert entries[0].start_offset == first["start_offset"]
    assert entries[0].delivery_complete_count == -1
    assert entries[0].batches == tuple(
        (b["first_offset"], b["last_offset"], b["delivery_state"], b["delivery_count"])
        for b in first["state_batches"]
    )


def test_postgres_requests_pick_the_function_by_entry_count():
    one = PostgresPeer.request([_entry(3, (0, 9, ACK, 1))])
    bind = pg_messages(one)[0][1]
    assert bind.startswith(b"\0write_one\0")
    assert b"{0,9,2,1}" in bind
    many = PostgresPeer.request([_entry(3, (0, 9, ACK, 1)), _entry(5), _entry(1, (1, 2, 0, 1))])
    bind = pg_messages(many)[0][1]
    assert bind.startswith(b"\0write_many\0")
    for text in (b"{3,5,1}", b"{1,0,1}", b"{0,9,2,1,1,2,0,1}"):
        assert text in bind


def test_redis_requests_carry_each_entrys_batch_count():
    one = RedisPeer.request([_entry(3, (0, 9, ACK, 1), start=5)])
    assert resp_parse(one)[0] == [  # type: ignore[index]
        b"FCALL", b"share_write", b"1", f"ss:{{g}}:{TOPIC_ID}:3".encode(),
        b"0", b"0", b"5", b"-1", b"1", b"0", b"9", b"2", b"1",
    ]  # fmt: skip
    many = RedisPeer.request([_entry(3), _entry(4, (1, 2, 0, 1))])
    assert resp_parse(many)[0][1:4] == [
        b"share_write_many",
        b"2",
        b"ss:{g}:" + TOPIC_ID.encode() + b":3",
    ]  # type: ignore[index]
    assert resp_parse(many)[0][5:] == [  # type: ignore[index]
        b"0", b"0", b"-1", b"-1", b"0", b"0", b"0", b"-1", b"-1", b"1", b"1", b"2", b"0", b"1",
    ]  # fmt: skip


def test_a_batched_request_covers_one_group():
    other = Entry("h", TOPIC_ID, 1, 0, 0, -1, -1, ())
    with pytest.raises(ValueError, match="one group"):
        PostgresPeer.request([_entry(1), other])
    with pytest.raises(ValueError, match="one group"):
        RedisPeer.request([_entry(1), other])


def test_reply_codes_per_entry():
    assert PostgresPeer.codes(_pg_reply(_data_row(b"124"))) == [124]
    assert PostgresPeer.codes(_pg_reply(_data_row(b"{0,42}"))) == [0, 42]
    assert RedisPeer.codes(b":74\r\n") == [74]
    assert RedisPeer.codes(b"*2\r\n:0\r\n:42\r\n") == [0, 42]
    with pytest.raises(RuntimeError, match="boom"):
        PostgresPeer.codes(_pg_reply(_pg_error("boom")))


# --- the sharecoord side of the check -----------------------------------------------------


def test_sharecoord_states_follow_the_shard():
    # docs/semantics.md §14 rows 3 and 4, after an initialize with start offset 0.
    writes = [_entry(0, (0, 9, ACQ, 1), start=0), _entry(0, (0, 4, ACK, 1))]
    codes, states = equal_work.sharecoord_states(writes)
    assert codes == [0, 0]
    assert states == {
        ("g", TOPIC_ID, 0): KeyView(0, 0, 0, 0, 0, 0, 0, 1, ((0, 4, ACK, 1), (5, 9, ACQ, 1)))
    }


def test_sharecoord_states_answer_42_for_keys_never_initialized():
    codes, states = equal_work.sharecoord_states(
        [_entry(0, (0, 9, ACQ, 1)), _entry(1)], initialized=[("g", TOPIC_ID, 1)]
    )
    assert codes == [42, 0]
    assert set(states) == {("g", TOPIC_ID, 1)}


def test_differences_name_keys_missing_on_either_side():
    view = KeyView(0, 0, 0, 0, 0, 0, 0, None, ())
    other = KeyView(0, 0, 0, 5, 0, 0, 0, None, ())
    a, b, c = ("g", "t", 0), ("g", "t", 1), ("g", "t", 2)
    found = equal_work.differences({a: view, b: view}, {a: view, b: other, c: view})
    assert len(found) == 2
    assert found[0].startswith(str(b)) and found[1].startswith(str(c))


def test_redis_keys_use_the_group_as_hash_tag():
    assert equal_work.redis_key(group_name(3), TOPIC_ID, 7) == f"ss:{{bench-group-3}}:{TOPIC_ID}:7"


# --- the generator ------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    # The rule bench.peers applies to pgbench's latencies, so the rows compare.
    assert percentile(list(range(100, 0, -1)), 50) == 50
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([], 50) != percentile([], 50)  # nan


async def test_replay_sends_requests_in_order_and_counts_failed_replies(blockbuster):
    # Reading /proc for the CPU figures blocks; fine for a load generator, so let it.
    blockbuster.deactivate()
    seen: list[bytes] = []
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await reader.readuntil(b"\r\n")
            except asyncio.IncompleteReadError:
                break
            seen.append(request)
            writer.write(b":74\r\n" if request == b"bad\r\n" else b"*2\r\n:0\r\n:0\r\n")
        writer.close()
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    requests = [b"a\r\n", b"b\r\n", b"bad\r\n"]
    async with server:
        result = await replay(
            "redis", port, requests, [], concurrency=1, duration_s=0.3, server_pid=os.getpid()
        )
        await asyncio.wait_for(closed.wait(), timeout=10)
    assert seen[:6] == requests * 2
    assert result["requests"] >= 3
    assert result["errors"] == sum(1 for r in seen if r == b"bad\r\n")
    assert result["first_error"] == repr(b":74\r\n")
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_stored_redis_state_decodes_into_a_key_view():
    raw = msgpack.packb([1, 0, 0, 5, -1, 0, 0, -1, 5, 9, 2, 1])
    view = equal_work._view([*msgpack.unpackb(raw)[:7], None], msgpack.unpackb(raw)[8:])
    assert view == KeyView(1, 0, 0, 5, -1, 0, 0, None, ((5, 9, 2, 1),))
