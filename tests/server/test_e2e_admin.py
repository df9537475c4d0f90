"""Admin endpoints and the topic catalog through real HTTP (docs/api.md,
docs/semantics.md §A and §5).

* ``GET /v1/admin/state``: the stored state with its fencing maxima, the topic id
  echoed as the query spelled it, 404 (code 3) for a key without state, 400 naming the
  query parameter.
* ``PUT`` / ``DELETE /v1/admin/topics``: with ``--topic-catalog`` every RPC answers 3
  exactly where docs/semantics.md §5 checks metadata; a delete tombstones every
  share-partition of the topic, any group.
* ``POST /v1/admin/compaction/commit`` and ``GET /v1/admin/partitions``.
"""

from __future__ import annotations

import pytest

from protocol.routing import partition_for
from protocol.topic_id import topic_id_to_rfc4122
from tests.harness import (
    MEDIA,
    OTHER_TOPIC,
    TOPIC,
    TOPIC_RFC4122,
    batch,
    body,
    encode,
    init_entry,
    part,
    read_entry,
    write_entry,
)

UNKNOWN = 3
MSG_UNKNOWN = "This server does not host this topic-partition."


# --- GET /v1/admin/state --------------------------------------------------------------------


async def test_admin_state_shows_the_stored_state_and_fencing(serve, fmt):
    api = (await serve()).api(fmt)
    g = "admin"
    await api.rpc("initialize", body(g, (TOPIC, [init_entry(2, 4, 10)])))
    await api.rpc("read", body(g, (TOPIC, [read_entry(2, 6)])))
    await api.rpc(
        "write",
        body(
            g,
            (
                TOPIC,
                [
                    write_entry(
                        2,
                        batch(10, 14, 2, 1),
                        state_epoch=4,
                        leader_epoch=6,
                        start_offset=10,
                        delivery_complete_count=5,
                    )
                ],
            ),
        ),
    )
    # Initialize again with -1: the state stores -1, the fencing maximum keeps 4
    # (docs/semantics.md §A.1 point 8).
    reply = await api.admin_state(g, TOPIC, 2)
    assert reply.status == 200
    assert reply.format == fmt
    assert reply.body == {
        "group_id": g,
        "topic_id": TOPIC,
        "partition": 2,
        "snapshot_epoch": 0,
        "state_epoch": 4,
        "leader_epoch": 6,
        "start_offset": 10,
        "delivery_complete_count": 5,
        "state_batches": [batch(10, 14, 2, 1)],
        "fencing": {"state_epoch": 4, "leader_epoch": 6},
    }
    await api.rpc("initialize", body(g, (TOPIC, [init_entry(2, -1, -1)])))
    state = await api.state(g, TOPIC, 2)
    assert state is not None
    assert (state["snapshot_epoch"], state["state_epoch"], state["leader_epoch"]) == (1, -1, 0)
    assert state["fencing"] == {"state_epoch": 4, "leader_epoch": 6}
    assert (state["start_offset"], state["delivery_complete_count"]) == (-1, -1)


async def test_admin_state_has_no_side_effect(serve):
    api = (await serve()).api()
    g = "no-side-effect"
    await api.rpc("initialize", body(g, (TOPIC, [init_entry(0, 1, 0)])))
    metrics = await api.metrics()
    first = await api.state(g, TOPIC, 0)
    for _ in range(3):
        assert await api.state(g, TOPIC, 0) == first
    after = await api.metrics()
    name = "sharecoord_records_appended_total"
    assert [line for line in after.splitlines() if line.startswith(name)] == [
        line for line in metrics.splitlines() if line.startswith(name)
    ]


async def test_admin_state_echoes_the_topic_id_as_spelled(serve, fmt):
    api = (await serve()).api(fmt)
    await api.rpc("initialize", body("g", (TOPIC, [init_entry(1)])))
    for spelled in (TOPIC, TOPIC_RFC4122, TOPIC_RFC4122.upper()):
        assert len(spelled) in (22, 36)
        state = await api.state("g", spelled, 1)
        assert state is not None
        assert state["topic_id"] == spelled
        assert state["partition"] == 1
    assert topic_id_to_rfc4122(TOPIC) == TOPIC_RFC4122


async def test_admin_state_of_a_key_without_state_is_404_code_3(serve, fmt):
    api = (await serve()).api(fmt)
    for group, topic, partition in (("g", TOPIC, 0), ("g", TOPIC_RFC4122, 99), ("h", TOPIC, -1)):
        reply = await api.admin_state(group, topic, partition)
        assert reply.status == 404
        assert reply.format == fmt
        assert reply.body["error_code"] == UNKNOWN
        assert topic in reply.body["error_message"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"topic_id": TOPIC, "partition": "0"}, "group_id"),
        ({"group_id": "", "topic_id": TOPIC, "partition": "0"}, "group_id"),
        ({"group_id": "g", "partition": "0"}, "topic_id"),
        ({"group_id": "g", "topic_id": "nope", "partition": "0"}, "topic_id"),
        ({"group_id": "g", "topic_id": TOPIC}, "partition"),
        ({"group_id": "g", "topic_id": TOPIC, "partition": "x"}, "partition"),
        ({"group_id": "g", "topic_id": TOPIC, "partition": "1.0"}, "partition"),
        ({"group_id": "g", "topic_id": TOPIC, "partition": "--5"}, "partition"),
        ({"group_id": "g", "topic_id": TOPIC, "partition": "-"}, "partition"),
        ({"group_id": "g", "topic_id": TOPIC, "partition": str(2**31)}, "partition"),
    ],
)
async def test_admin_state_query_errors_are_400_naming_the_parameter(serve, query, named):
    api = (await serve()).api()
    reply = await api.request("GET", "/v1/admin/state", params=query)
    assert reply.status == 400, reply.body
    assert reply.body["error_code"] == 42
    assert named in reply.body["error_message"], reply.body


# --- the topic catalog ----------------------------------------------------------------------


async def register(api, topic_id: str, count: int) -> None:
    reply = await api.register_topic(topic_id, count)
    assert (reply.status, reply.body) == (200, {"error_code": 0}), reply.body


async def delete_topic(api, topic_id: str):
    return await api.delete_topic(topic_id)


async def test_catalog_unregistered_topic_answers_3_for_every_rpc(serve, fmt):
    api = (await serve(topic_catalog=True)).api(fmt)
    g = "catalog"
    entries = {
        "initialize": init_entry(0),
        "read": read_entry(0),
        "write": write_entry(0),
        "delete": part(0),
        "read-summary": read_entry(0),
    }
    expected = {
        # read and write check existence first (42), then fencing, then metadata.
        "initialize": UNKNOWN,
        "read": 42,
        "write": 42,
        "delete": UNKNOWN,
        "read-summary": UNKNOWN,
    }
    for rpc, entry in entries.items():
        results = await api.results(rpc, body(g, (TOPIC, [entry])))
        assert results[0]["error_code"] == expected[rpc], rpc
        if expected[rpc] == UNKNOWN:
            assert results[0]["error_message"] == MSG_UNKNOWN
    assert await api.state(g, TOPIC, 0) is None


async def test_catalog_partition_past_the_count_answers_3(serve, fmt):
    api = (await serve(topic_catalog=True)).api(fmt)
    g = "counts"
    await register(api, TOPIC, 2)
    codes = await api.codes("initialize", body(g, (TOPIC, [init_entry(p) for p in (0, 1, 2, 3)])))
    assert codes == [0, 0, UNKNOWN, UNKNOWN]
    # Registered by its RFC 4122 spelling, the topic is the same.
    await register(api, TOPIC_RFC4122, 4)
    assert await api.codes("initialize", body(g, (TOPIC, [init_entry(3)]))) == [0]
    # Shrink it: key 3 exists but is now out of range.
    await register(api, TOPIC, 2)
    results = {
        rpc: (await api.codes(rpc, body(g, (TOPIC, [entry]))))[0]
        for rpc, entry in {
            "read": read_entry(3, 0),
            "write": write_entry(3, leader_epoch=0, state_epoch=0),
            "read-summary": read_entry(3),
            "initialize": init_entry(3, 0),
        }.items()
    }
    assert results == dict.fromkeys(results, UNKNOWN)


async def test_catalog_order_fencing_before_metadata_and_delete_before_existence(serve, fmt):
    api = (await serve(topic_catalog=True)).api(fmt)
    g = "order"
    await register(api, TOPIC, 8)
    await api.rpc("initialize", body(g, (TOPIC, [init_entry(6, 5)])))
    await api.rpc("read", body(g, (TOPIC, [read_entry(6, 3)])))
    await register(api, TOPIC, 4)  # key 6 is now past the count
    codes = await api.codes(
        "write",
        body(
            g,
            (
                TOPIC,
                [
                    write_entry(6, state_epoch=5, leader_epoch=2),  # fenced first: 74
                    write_entry(6, state_epoch=4, leader_epoch=3),  # fenced first: 124
                    write_entry(6, state_epoch=5, leader_epoch=3),  # then metadata: 3
                    write_entry(7, state_epoch=5, leader_epoch=3),  # existence first: 42
                ],
            ),
        ),
    )
    assert codes == [74, 124, UNKNOWN, 42]
    assert await api.codes("read", body(g, (TOPIC, [read_entry(6, 2), read_entry(6, 3)]))) == [
        74,
        UNKNOWN,
    ]
    assert await api.codes(
        "initialize", body(g, (TOPIC, [init_entry(6, 4), init_entry(6, 5)]))
    ) == [
        124,
        UNKNOWN,
    ]
    # Delete checks metadata before existence: an unknown key past the count is 3, a key
    # that exists past the count is 3 too, and nothing is deleted.
    assert await api.codes("delete", body(g, (TOPIC, [part(7), part(6)]))) == [UNKNOWN, UNKNOWN]
    assert await api.state(g, TOPIC, 6) is not None
    # In range: a delete of a key with no state succeeds.
    assert await api.codes("delete", body(g, (TOPIC, [part(3)]))) == [0]


async def test_deleting_a_topic_tombstones_all_its_share_partitions(serve, fmt):
    served = await serve(topic_catalog=True)
    api = served.api(fmt)
    await register(api, TOPIC, 16)
    await register(api, OTHER_TOPIC, 16)
    keys = [(g, p) for g in ("g1", "g2", "g3") for p in range(0, 16, 3)]
    for g in ("g1", "g2", "g3"):
        entries = [init_entry(p, 1, p) for gg, p in keys if gg == g]
        await api.rpc("initialize", body(g, (TOPIC, entries), (OTHER_TOPIC, [init_entry(1)])))
    # Deleted by its RFC 4122 spelling.
    reply = await delete_topic(api, TOPIC_RFC4122)
    assert reply.status == 200, reply.body
    assert reply.format == fmt
    assert reply.body == {"error_code": 0, "deleted_share_partitions": len(keys)}
    for g, p in keys:
        assert await api.state(g, TOPIC, p) is None
    for g in ("g1", "g2", "g3"):
        assert await api.state(g, OTHER_TOPIC, 1) is not None
    # The topic is gone from the catalog: RPCs answer 3, a second delete is 404 code 3.
    assert await api.codes("initialize", body("g1", (TOPIC, [init_entry(0)]))) == [UNKNOWN]
    reply = await delete_topic(api, TOPIC)
    assert reply.status == 404
    assert reply.body["error_code"] == UNKNOWN
    # A restart finds the same: the tombstones and the catalog are durable.
    await served.server.close()
    again = await serve(topic_catalog=True, data_dir=served.config.data_dir)
    api = again.api(fmt)
    for g, p in keys:
        assert await api.state(g, TOPIC, p) is None
    assert await api.state("g2", OTHER_TOPIC, 1) is not None
    assert await api.codes("read-summary", body("g1", (TOPIC, [read_entry(0)]))) == [UNKNOWN]


async def test_topic_admin_errors(serve, fmt):
    api = (await serve(topic_catalog=True)).api(fmt)
    reply = await delete_topic(api, OTHER_TOPIC)
    assert (reply.status, reply.body["error_code"]) == (404, UNKNOWN)
    assert reply.format == fmt
    reply = await delete_topic(api, "not-a-topic-id")
    assert (reply.status, reply.body["error_code"]) == (400, 42)
    assert "topic_id" in reply.body["error_message"]
    for bad, field in (
        ({"topic_id": TOPIC}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": 0}, "partition_count"),
        ({"topic_id": TOPIC, "partition_count": True}, "partition_count"),
        ({"topic_id": "x", "partition_count": 1}, "topic_id"),
        ({"partition_count": 1}, "topic_id"),
    ):
        reply = await api.request(
            "PUT",
            "/v1/admin/topics",
            data=encode(bad, fmt),
            headers={"Content-Type": MEDIA[fmt]},
        )
        assert (reply.status, reply.body["error_code"]) == (400, 42), bad
        assert reply.body["error_message"].startswith(field), reply.body


async def test_without_the_catalog_there_are_no_metadata_checks(serve, fmt):
    api = (await serve()).api(fmt)
    assert await api.codes("initialize", body("g", (TOPIC, [init_entry(2**31 - 1)]))) == [0]
    assert await api.codes("delete", body("g", (OTHER_TOPIC, [part(5)]))) == [0]


# --- compaction commit and partitions -------------------------------------------------------


async def test_compaction_commit_with_nothing_staged(serve, fmt):
    api = (await serve()).api(fmt)
    reply = await api.request("POST", "/v1/admin/compaction/commit", headers={"Accept": MEDIA[fmt]})
    assert reply.status == 200
    assert reply.format == fmt
    assert reply.body == {"committed": [], "stale": []}


async def test_partitions_lists_every_owned_state_partition(serve, fmt):
    served = await serve(partitions=4)
    api = served.api(fmt)
    await api.rpc("initialize", body("g", (TOPIC, [init_entry(p) for p in range(3)])))
    reply = await api.request("GET", "/v1/admin/partitions", headers={"Accept": MEDIA[fmt]})
    assert reply.status == 200
    assert reply.format == fmt
    partitions = reply.body["partitions"]
    assert [p["partition"] for p in partitions] == [0, 1, 2, 3]
    for p in partitions:
        assert set(p) == {
            "partition",
            "status",
            "log_start_offset",
            "log_end_offset",
            "segments",
            "bytes",
            "keys",
            "error",
        }
        assert (p["status"], p["error"], p["log_start_offset"]) == ("active", None, 0)
        assert p["segments"] == 1
    keys = {p["partition"]: p["keys"] for p in partitions}
    for partition in range(3):
        owner = partition_for("g", TOPIC, partition, 4)
        assert keys[owner] >= 1
    assert sum(keys.values()) == 3
    assert sum(p["log_end_offset"] for p in partitions) == 3
    assert all(p["bytes"] > 0 for p in partitions if p["keys"])
