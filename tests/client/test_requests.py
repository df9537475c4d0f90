"""The pure parts of a call: building a coalesced request and reading its answer back,
probe keys, bootstrap addresses, entry checks and what each HTTP refusal means."""

from __future__ import annotations

import asyncio
import re

import pytest

from client import InitializePartition, ReadPartition, StateBatch, WritePartition
from client.batching import Pending
from client.calls import build_request, demultiplex
from client.retry import Failure
from client.routing import parse_bootstrap, probe_keys
from client.transport import Answer, refusal
from client.validation import check_entry, check_group_id, check_topic_id
from protocol.client_codec import Format
from protocol.messages import (
    ReadPartitionResult,
    Rpc,
    ShareGroupStateResponse,
    TopicResult,
)
from protocol.routing import partition_for_key

A, B = "AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg"


def pending(topic_id: str, partition: int) -> Pending:
    future = asyncio.get_running_loop().create_future()
    return Pending(topic_id, ReadPartition(partition, 0), future)


async def test_a_request_groups_by_topic_in_first_seen_order_and_keeps_duplicates():
    chunk = [pending(A, 0), pending(B, 5), pending(A, 1), pending(A, 0), pending(B, 5)]
    request, positions = build_request("g", chunk)
    assert [t.topic_id for t in request.topics] == [A, B]
    assert [[p.partition for p in t.partitions] for t in request.topics] == [[0, 1, 0], [5, 5]]
    assert positions == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1)]


async def test_results_go_back_to_their_entries_by_position():
    chunk = [pending(A, 0), pending(B, 5), pending(A, 0)]
    request, positions = build_request("g", chunk)
    response = ShareGroupStateResponse(
        [
            TopicResult(
                A,
                [
                    ReadPartitionResult(0, 0, None, 0, 1, []),
                    ReadPartitionResult(0, 74, None, 0, 0, []),
                ],
            ),
            TopicResult(B, [ReadPartitionResult(5, 0, None, 0, 3, [])]),
        ],
    )
    outcomes = demultiplex(request, response, positions, "http://n")
    assert outcomes == [
        ReadPartitionResult(0, 0, None, 0, 1, []),
        ReadPartitionResult(5, 0, None, 0, 3, []),
        ReadPartitionResult(0, 74, None, 0, 0, []),
    ]


@pytest.mark.parametrize(
    "results",
    [
        [TopicResult(A, [ReadPartitionResult(0, 0, None, 0, 0, [])])],  # a topic missing
        [
            TopicResult(A, [ReadPartitionResult(0, 0, None, 0, 0, [])]),
            TopicResult(B, []),
        ],  # an entry missing
        [
            TopicResult(B, [ReadPartitionResult(0, 0, None, 0, 0, [])]),
            TopicResult(A, [ReadPartitionResult(5, 0, None, 0, 0, [])]),
        ],
        [
            TopicResult(A, [ReadPartitionResult(1, 0, None, 0, 0, [])]),
            TopicResult(B, [ReadPartitionResult(5, 0, None, 0, 0, [])]),
        ],
    ],
)
async def test_an_answer_that_does_not_mirror_the_request_fails_every_entry(results):
    request, positions = build_request("g", [pending(A, 0), pending(B, 5)])
    outcomes = demultiplex(request, ShareGroupStateResponse(results), positions, "http://n")
    assert len(outcomes) == 2
    assert all(isinstance(o, Failure) and o.code == -1 and not o.retriable for o in outcomes)


@pytest.mark.parametrize("num_partitions", [1, 2, 7, 50, 1000])
def test_probe_key_p_hashes_to_state_partition_p(num_partitions):
    keys = probe_keys(num_partitions)
    assert len(keys) == num_partitions
    assert [partition_for_key(k, num_partitions) for k in keys] == list(range(num_partitions))


@pytest.mark.parametrize(
    ("bootstrap", "tls", "urls"),
    [
        ("http://127.0.0.1:9095", False, ["http://127.0.0.1:9095"]),
        ("http://127.0.0.1:9095/", False, ["http://127.0.0.1:9095"]),
        ("127.0.0.1:9095", False, ["http://127.0.0.1:9095"]),
        ("127.0.0.1:9095", True, ["https://127.0.0.1:9095"]),
        ("https://coordinator.example", False, ["https://coordinator.example:443"]),
        ("http://[::1]:9095", False, ["http://[::1]:9095"]),
        (["a:1", "http://a:1", "b:2"], False, ["http://a:1", "http://b:2"]),
    ],
)
def test_bootstrap_addresses_become_base_urls(bootstrap, tls, urls):
    assert parse_bootstrap(bootstrap, tls=tls) == urls


@pytest.mark.parametrize(
    ("bootstrap", "problem"),
    [
        ([], "at least one"),
        ("ftp://h:1", "expected http"),
        ("http://h:1/v1", "no path"),
        ("http://h:99999", "out of range"),
    ],
)
def test_bad_bootstrap_addresses_are_refused(bootstrap, problem):
    with pytest.raises(ValueError, match=problem):
        parse_bootstrap(bootstrap, tls=False)


@pytest.mark.parametrize(
    ("rpc", "entry", "problem"),
    [
        (Rpc.READ, InitializePartition(0, 0, 0), "must be a ReadPartition"),
        (
            Rpc.READ,
            ReadPartition(2**31, 0),
            "partition: expected an integer in int32 range, got 2147483648",
        ),
        (Rpc.INITIALIZE, InitializePartition(0, 0, 2**63), "start_offset: .* int64"),
        (Rpc.WRITE, WritePartition(0, 0, 0, 0, [], 1.5), "delivery_complete_count"),  # type: ignore[arg-type]
        (Rpc.WRITE, WritePartition(0, 0, 0, 0, [StateBatch(0, 1, 2, 2**15)]), "int16"),
        (Rpc.WRITE, WritePartition(0, 0, 0, 0, [(0, 1, 2)]), r"state_batches\[0\]"),  # type: ignore[list-item]
        (Rpc.WRITE, WritePartition(0, 0, 0, 0, None), "expected a list"),  # type: ignore[arg-type]
        (Rpc.WRITE, WritePartition(0, 0, 0, 0, [StateBatch(0, 0, 0, 0)] * 3), "limit of 2"),
    ],
)
def test_an_entry_the_daemon_would_refuse_whole_is_caught_first(rpc, entry, problem):
    assert re.search(problem, check_entry(rpc, entry, max_state_batches=2) or "")


def test_entries_the_daemon_judges_itself_pass():
    # A negative partition or an inverted batch fails that entry alone, with Kafka's text.
    assert check_entry(Rpc.DELETE, ReadPartition(-1, 0), 10) is not None  # wrong type
    assert check_entry(Rpc.READ, ReadPartition(-1, -5), 10) is None
    assert check_entry(Rpc.WRITE, WritePartition(0, 0, 0, 0, [StateBatch(9, 1, 3, -1)]), 10) is None


def test_group_and_topic_ids_are_checked():
    assert check_group_id("g") is None
    assert "non-empty" in (check_group_id("") or "")
    assert "UTF-8" in (check_group_id("g\udcff") or "")
    assert check_topic_id("5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d")[0] == "WwwvDo06T2ueIXxNGis8TQ"
    assert check_topic_id("nope")[0] is None


def answer(status: int, body: bytes, fmt: Format = Format.JSON) -> Answer:
    return Answer("http://n:1", status, body, fmt)


@pytest.mark.parametrize(
    ("status", "body", "code", "retriable"),
    [
        (400, b'{"error_code": 42, "error_message": "topics: a list"}', 42, False),
        (413, b'{"error_code": 42, "error_message": "too big"}', 42, False),
        (415, b'{"error_code": 42, "error_message": "Content-Type"}', 42, False),
        (401, b'{"error_code": 31, "error_message": "no"}', 31, False),
        (421, b'{"error_code": 16, "error_message": "elsewhere"}', 16, True),
        (503, b'{"error_code": 14, "error_message": "loading"}', 14, True),
        (503, b'{"error_code": 15, "error_message": "failed"}', 15, True),
        (502, b"<html>Bad Gateway</html>", 15, True),
        (500, b'{"error_code": -1, "error_message": "a bug"}', -1, True),
        (404, b'{"error_code": 3, "error_message": "no such endpoint"}', -1, False),
        (302, b"", -1, False),
    ],
)
def test_what_each_refusal_means_for_the_entries(status, body, code, retriable):
    failure = refusal(answer(status, body))
    assert (failure.code, failure.retriable) == (code, retriable)


def test_a_400_keeps_the_daemons_message_as_is():
    failure = refusal(answer(400, b'{"error_code": 42, "error_message": "topics: a list"}'))
    assert failure.message == "topics: a list"
    assert "Bad Gateway" in refusal(answer(502, b"<html>Bad Gateway</html>")).message
