"""The five RPCs through real HTTP, in JSON and in msgpack (docs/api.md, docs/semantics.md
§5 and §A).

The app is built with ``create_app`` and served on a loopback socket; every test that
takes ``fmt`` runs once per body format.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    OTHER_TOPIC,
    TOPIC,
    TOPIC_RFC4122,
    batch,
    body,
    init_entry,
    part,
    read_entry,
    write_entry,
)
from tests.server.conftest import Served, ServeFactory, StoreUnderTest

WORKED_EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "kip932-worked-example.json"

MSG_READ_UNINITIALIZED = "Read operation on uninitialized share partition not allowed."
MSG_WRITE_UNINITIALIZED = "Write operation on uninitialized share partition not allowed."
MSG_NEGATIVE_PARTITION = "The partition id cannot be a negative number."
MSG_FENCED_LEADER = "The leader epoch in the request is older than the epoch on the broker."
MSG_FENCED_STATE = "The coordinator rejected the request because the state epoch did not match."
READ_ERROR_DEFAULTS = {"state_epoch": 0, "start_offset": 0, "state_batches": []}
SUMMARY_ERROR_DEFAULTS = {
    "state_epoch": 0,
    "leader_epoch": 0,
    "start_offset": 0,
    "delivery_complete_count": -1,
}


@pytest.fixture
def serve(serve: ServeFactory, store: StoreUnderTest) -> ServeFactory:
    """Every node of this module on each state store (the ``store`` fixture)."""

    async def start(**flags: Any) -> Served:
        return await serve(**{**store.flags, **flags})

    return start


# --- happy paths ----------------------------------------------------------------------------


async def test_the_five_rpcs_round_trip(serve, fmt):
    api = (await serve()).api(fmt)
    g = "round-trip"

    assert await api.rpc("initialize", body(g, (TOPIC, [init_entry(0, 3, 100)]))) == {
        "results": [
            {
                "topic_id": TOPIC,
                "partitions": [{"partition": 0, "error_code": 0, "error_message": None}],
            }
        ]
    }
    read = await api.results("read", body(g, (TOPIC, [read_entry(0, 2)])))
    assert read == [
        {
            "partition": 0,
            "error_code": 0,
            "error_message": None,
            "state_epoch": 3,
            "start_offset": 100,
            "state_batches": [],
        }
    ]
    write = write_entry(
        0,
        batch(100, 109, 1, 1),
        batch(110, 119, 0, 2),
        state_epoch=3,
        leader_epoch=2,
        start_offset=100,
        delivery_complete_count=4,
    )
    assert await api.results("write", body(g, (TOPIC, [write]))) == [
        {"partition": 0, "error_code": 0, "error_message": None}
    ]
    # No delivery_complete_count (optional, -1): the stored value stays (§A.1 point 7).
    no_count = write_entry(0, state_epoch=3, leader_epoch=2)
    assert await api.codes("write", body(g, (TOPIC, [no_count]))) == [0]
    read = await api.results("read", body(g, (TOPIC, [read_entry(0, 2)])))
    assert read[0]["state_batches"] == [batch(100, 109, 1, 1), batch(110, 119, 0, 2)]
    summary = await api.results("read-summary", body(g, (TOPIC, [read_entry(0, -1)])))
    assert summary == [
        {
            "partition": 0,
            "error_code": 0,
            "error_message": None,
            "state_epoch": 3,
            "leader_epoch": 2,
            "start_offset": 100,
            "delivery_complete_count": 4,
        }
    ]
    assert await api.results("delete", body(g, (TOPIC, [part(0)]))) == [
        {"partition": 0, "error_code": 0, "error_message": None}
    ]
    # After delete: read is 42 with Kafka's text, the summary is a success (-1, 0, 0).
    assert await api.results("read", body(g, (TOPIC, [read_entry(0, 2)]))) == [
        {
            "partition": 0,
            "error_code": 42,
            "error_message": MSG_READ_UNINITIALIZED,
            **READ_ERROR_DEFAULTS,
        }
    ]
    assert await api.results("read-summary", body(g, (TOPIC, [part(0)]))) == [
        {
            "partition": 0,
            "error_code": 0,
            "error_message": None,
            "state_epoch": 0,
            "leader_epoch": 0,
            "start_offset": -1,
            "delivery_complete_count": -1,
        }
    ]
    assert await api.state(g, TOPIC, 0) is None
    # Deleting a key with no state is a success too (docs/semantics.md §5.4).
    assert await api.codes("delete", body(g, (TOPIC, [part(0)]))) == [0]


async def test_kip932_worked_example_replays_exactly(serve, fmt, store):
    """tests/data's worked example, every request and expected answer as the file says
    (JSON), and the same objects through msgpack; on either state store."""
    example = json.loads(await asyncio.to_thread(WORKED_EXAMPLE.read_text))
    api = (await serve(**store.flags)).api(fmt)
    for step in example["steps"]:
        method, path = step["http"].split(" ")
        assert method == "POST"
        reply = await api.post(path, step["request"])
        assert reply.status == 200, (step["step"], reply.body)
        assert reply.body == step["expected_response"], step["description"]
        then = step.get("then_read")
        if then:
            reply = await api.post(then["http"].split(" ")[1], then["request"])
            assert reply.body == then["expected_response"], step["description"]
    # The admin view agrees with the last read.
    state = await api.state(example["group_id"], example["topic_id"], example["partition"])
    last = example["steps"][-1]["then_read"]["expected_response"]["results"][0]["partitions"][0]
    assert state is not None
    assert state["start_offset"] == last["start_offset"]
    assert state["state_batches"] == last["state_batches"]
    if store.kind == "postgres":  # the records went there, not to a data directory
        assert await asyncio.to_thread(store.postgres_records) >= len(example["steps"]) - 1


async def test_both_topic_id_spellings_name_one_topic_and_are_echoed_as_sent(serve, fmt):
    api = (await serve()).api(fmt)
    g = "spellings"
    answer = await api.rpc("initialize", body(g, (TOPIC_RFC4122, [init_entry(4, 1, 7)])))
    assert answer["results"][0]["topic_id"] == TOPIC_RFC4122
    upper = TOPIC_RFC4122.upper()
    answer = await api.rpc("read", body(g, (TOPIC, [read_entry(4)]), (upper, [read_entry(4)])))
    assert [t["topic_id"] for t in answer["results"]] == [TOPIC, upper]
    for topic in answer["results"]:
        assert topic["partitions"][0]["start_offset"] == 7
    state = await api.state(g, TOPIC_RFC4122, 4)
    assert state is not None
    assert state["topic_id"] == TOPIC_RFC4122
    assert (await api.state(g, TOPIC, 4))["topic_id"] == TOPIC  # type: ignore[index]


# --- results mirror the request -------------------------------------------------------------


async def test_results_mirror_the_request_order_topics_and_partitions(serve, fmt):
    api = (await serve()).api(fmt)
    g = "order"
    request = body(
        g,
        (OTHER_TOPIC, [init_entry(p, 0, p) for p in (9, 2, 31, 0, 7)]),
        (TOPIC, [init_entry(p, 0, p) for p in (5, 1, 3)]),
        (TOPIC_RFC4122, []),
    )
    answer = await api.rpc("initialize", request)
    assert [t["topic_id"] for t in answer["results"]] == [OTHER_TOPIC, TOPIC, TOPIC_RFC4122]
    assert [r["partition"] for r in answer["results"][0]["partitions"]] == [9, 2, 31, 0, 7]
    assert [r["partition"] for r in answer["results"][1]["partitions"]] == [5, 1, 3]
    # A topic entry with no partitions gets a result with none (docs/semantics.md §A.1 point 4).
    assert answer["results"][2] == {"topic_id": TOPIC_RFC4122, "partitions": []}
    # The same order for the read, whose keys live on different state partitions.
    request = body(g, (TOPIC, [read_entry(p, -1) for p in (3, 5, 1)]))
    answer = await api.results("read-summary", request)
    assert [(r["partition"], r["start_offset"]) for r in answer] == [(3, 3), (5, 5), (1, 1)]


async def test_empty_topics_answer_200_with_empty_results(serve, fmt):
    api = (await serve()).api(fmt)
    for rpc in ("initialize", "read", "write", "delete", "read-summary"):
        assert await api.rpc(rpc, {"group_id": "g", "topics": []}) == {"results": []}


async def test_duplicate_entries_run_twice_in_order(serve, fmt):
    api = (await serve()).api(fmt)
    g = "duplicates"
    # Initialize twice: the second sees the first (snapshot epoch 1), then a lower state
    # epoch in the same request is fenced by the one just written.
    codes = await api.codes(
        "initialize",
        body(g, (TOPIC, [init_entry(0, 2, 10), init_entry(0, 2, 20), init_entry(0, 1)])),
    )
    assert codes == [0, 0, 124]
    state = await api.state(g, TOPIC, 0)
    assert state is not None
    assert (state["snapshot_epoch"], state["start_offset"]) == (1, 20)

    # The same write twice, then one that depends on both: sequential merge.
    first = write_entry(0, batch(20, 29, 1, 1), leader_epoch=-1, state_epoch=-1, start_offset=20)
    second = write_entry(0, batch(22, 23, 2, 1), leader_epoch=-1, state_epoch=-1)
    codes = await api.codes("write", body(g, (TOPIC, [first, first, second, second])))
    assert codes == [0, 0, 0, 0]
    read = await api.results("read", body(g, (TOPIC, [read_entry(0, 0)])))
    assert read[0]["state_batches"] == [
        batch(20, 21, 1, 1),
        batch(22, 23, 2, 1),
        batch(24, 29, 1, 1),
    ]

    # A read with a higher leader epoch records it; the next entry with a lower one is
    # fenced by it; the same epoch again passes.
    read = await api.results(
        "read", body(g, (TOPIC, [read_entry(0, 5), read_entry(0, 4), read_entry(0, 5)]))
    )
    assert [r["error_code"] for r in read] == [0, 74, 0]
    assert read[1] == {
        "partition": 0,
        "error_code": 74,
        "error_message": MSG_FENCED_LEADER,
        **READ_ERROR_DEFAULTS,
    }

    # Delete then delete again: both succeed (the second finds nothing).
    assert await api.codes("delete", body(g, (TOPIC, [part(0), part(0)]))) == [0, 0]
    # Initialize after a delete within one request is a fresh start (snapshot epoch 0).
    assert await api.codes("initialize", body(g, (TOPIC, [init_entry(0, 0, 5)]))) == [0]
    state = await api.state(g, TOPIC, 0)
    assert state is not None
    assert state["snapshot_epoch"] == 0


# --- error codes in results -----------------------------------------------------------------


async def test_uninitialized_read_and_write_answer_42_with_kafkas_texts(serve, fmt):
    api = (await serve()).api(fmt)
    g = "uninitialized"
    assert await api.results("write", body(g, (TOPIC, [write_entry(3)]))) == [
        {"partition": 3, "error_code": 42, "error_message": MSG_WRITE_UNINITIALIZED}
    ]
    assert await api.results("read", body(g, (TOPIC, [read_entry(3)]))) == [
        {
            "partition": 3,
            "error_code": 42,
            "error_message": MSG_READ_UNINITIALIZED,
            **READ_ERROR_DEFAULTS,
        }
    ]
    # Nothing was stored by either.
    assert await api.state(g, TOPIC, 3) is None


async def test_fencing_answers_74_and_124(serve, fmt):
    api = (await serve()).api(fmt)
    g = "fencing"
    assert await api.codes("initialize", body(g, (TOPIC, [init_entry(0, 5, 0)]))) == [0]
    assert await api.codes("read", body(g, (TOPIC, [read_entry(0, 3)]))) == [0]
    results = await api.results(
        "write",
        body(
            g,
            (
                TOPIC,
                [
                    write_entry(0, state_epoch=5, leader_epoch=2),  # older leader epoch
                    write_entry(0, state_epoch=4, leader_epoch=3),  # older state epoch
                    write_entry(0, state_epoch=-1, leader_epoch=-1),  # -1: exempt
                    write_entry(0, state_epoch=9, leader_epoch=9),  # newer: accepted
                ],
            ),
        ),
    )
    assert results == [
        {"partition": 0, "error_code": 74, "error_message": MSG_FENCED_LEADER},
        {"partition": 0, "error_code": 124, "error_message": MSG_FENCED_STATE},
        {"partition": 0, "error_code": 0, "error_message": None},
        {"partition": 0, "error_code": 0, "error_message": None},
    ]
    # A write never moves the epochs (docs/semantics.md §5.3).
    state = await api.state(g, TOPIC, 0)
    assert state is not None
    assert state["fencing"] == {"state_epoch": 5, "leader_epoch": 3}
    # Read fences -1 too (no exemption); initialize fences an older state epoch.
    assert await api.codes("read", body(g, (TOPIC, [read_entry(0, -1)]))) == [74]
    assert await api.results("initialize", body(g, (TOPIC, [init_entry(0, 4)]))) == [
        {"partition": 0, "error_code": 124, "error_message": MSG_FENCED_STATE}
    ]


async def test_edge_checks_fail_one_entry_with_42_and_the_rest_succeed(serve, fmt):
    api = (await serve()).api(fmt)
    g = "edge"
    assert await api.codes("initialize", body(g, (TOPIC, [init_entry(0), init_entry(1)]))) == [0, 0]
    bad = {
        "negative partition": (write_entry(-1), MSG_NEGATIVE_PARTITION),
        "inverted batch": (
            write_entry(0, batch(9, 3)),
            "first_offset 9 is greater than last_offset 3",
        ),
        "negative first offset": (write_entry(0, batch(-5, 3)), "first_offset"),
        "unknown delivery state": (write_entry(0, batch(0, 3, 3)), "delivery_state"),
        "negative delivery count": (write_entry(0, batch(0, 3, 0, -1)), "delivery_count"),
        "start offset below -1": (write_entry(0, start_offset=-2), "start_offset"),
        "leader epoch below -1": (write_entry(0, leader_epoch=-2), "leader_epoch"),
        "state epoch below -1": (write_entry(0, state_epoch=-2), "state_epoch"),
        "complete count below -1": (
            write_entry(0, delivery_complete_count=-2),
            "delivery_complete_count",
        ),
        # Edge checks come first: an uninitialized key still fails with the edge text.
        "bad entry of an uninitialized key": (write_entry(7, batch(5, 1)), "first_offset"),
    }
    good = write_entry(1, batch(0, 9, 2, 1), start_offset=0)
    entries = [good] + [entry for entry, _ in bad.values()] + [good]
    results = await api.results("write", body(g, (TOPIC, entries)))
    assert [r["partition"] for r in results] == [e["partition"] for e in entries]
    assert results[0] == results[-1] == {"partition": 1, "error_code": 0, "error_message": None}
    for result, (name, (_, text)) in zip(results[1:-1], bad.items(), strict=True):
        assert result["error_code"] == 42, name
        assert text in result["error_message"], (name, result)
    # Nothing of the bad entries reached the state; the good ones did.
    state = await api.state(g, TOPIC, 0)
    assert state is not None
    assert (state["start_offset"], state["state_batches"]) == (0, [])
    assert (await api.state(g, TOPIC, 1))["state_batches"] == [batch(0, 9, 2, 1)]  # type: ignore[index]
    assert await api.state(g, TOPIC, 7) is None


async def test_edge_checks_of_every_rpc(serve, fmt):
    api = (await serve()).api(fmt)
    g = "edge-rpcs"
    cases = {
        "initialize": ([init_entry(-3), init_entry(0, -2), init_entry(0, 0, -2)], None),
        "read": ([read_entry(-3), read_entry(0, -2)], READ_ERROR_DEFAULTS),
        "delete": ([part(-3)], None),
        # read-summary's leader epoch is ignored, but checked like every epoch.
        "read-summary": ([read_entry(-3), read_entry(0, -2)], SUMMARY_ERROR_DEFAULTS),
    }
    for rpc, (entries, defaults) in cases.items():
        results = await api.results(rpc, body(g, (TOPIC, entries)))
        assert [r["error_code"] for r in results] == [42] * len(entries), rpc
        assert results[0]["error_message"] == MSG_NEGATIVE_PARTITION
        assert results[0]["partition"] == -3
        for result in results[1:]:
            assert "must be -1 or greater" in result["error_message"], (rpc, result)
        for result in results:
            for name, value in (defaults or {}).items():
                assert result[name] == value, (rpc, name, result)
    assert await api.state(g, TOPIC, 0) is None


# The topic catalog lives in the data directory only (the PostgreSQL store refuses it).
@pytest.mark.parametrize("store", ["local"], indirect=True)
async def test_read_summary_error_results_carry_the_schema_defaults(serve, fmt):
    """With the catalog on, an unknown topic's summary fails (3) with 0/0/0/-1."""
    api = (await serve(topic_catalog=True)).api(fmt)
    results = await api.results("read-summary", body("g", (TOPIC, [read_entry(0, 1)])))
    assert results == [
        {
            "partition": 0,
            "error_code": 3,
            "error_message": "This server does not host this topic-partition.",
            **SUMMARY_ERROR_DEFAULTS,
        }
    ]


async def test_a_write_past_max_state_batches_per_share_partition_answers_42(serve):
    served = await serve(max_state_batches_per_share_partition=3)
    api = served.api("json")
    assert await api.codes("initialize", body("capped", (TOPIC, [init_entry(0)]))) == [0]
    three = write_entry(0, batch(0, 0), batch(2, 2), batch(4, 4))
    assert await api.codes("write", body("capped", (TOPIC, [three]))) == [0]
    (result,) = await api.results("write", body("capped", (TOPIC, [write_entry(0, batch(6, 6))])))
    assert result["error_code"] == 42
    assert "over the limit of 3 (max_state_batches_per_share_partition)" in result["error_message"]
    state = await api.state("capped", TOPIC, 0)
    assert state is not None and len(state["state_batches"]) == 3
