"""The Kafka listener end to end (docs/api.md#the-kafka-listener), driven by ``kio``, an
implementation of Kafka's wire format independent of ours (tests/kafka_client.py).

* the KIP-932 worked example gives, over Kafka's protocol, exactly the answers its file
  expects over HTTP;
* random RPC sequences give the same answers over both listeners of one daemon (each
  listener on its own group, the same operations);
* ApiVersions, FindCoordinator, pipelining, empty requests, and the requests Kafka
  closes the connection for.

Every test on the ``kafka`` fixture runs once per state store: the data directory, and
PostgreSQL in `make reliability`; the worked example and the random sequences on both in
`make test` too (``BOTH_STORES``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.kafka.listener import CLOSES_SHOWN
from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    init_entry,
    metric_value,
    part,
    read_entry,
    wait_until,
    write_entry,
)
from tests.hostile_strings import HOSTILE_STRINGS
from tests.kafka_client import (
    STRING_POSITIONS,
    KafkaClient,
    find_coordinator_frame,
    kafka_address,
    message_class,
    raw_request,
    schema,
    share_request,
)
from tests.server.test_metrics import FAMILIES

# Both stores in `make test` (the fixture's parameters given here carry no slow mark).
BOTH_STORES = pytest.mark.parametrize("store_postgres_slow", ["local", "postgres"], indirect=True)
WORKED_EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "kip932-worked-example.json"


@pytest.fixture
async def kafka(spawn, tmp_path, store_postgres_slow):
    """A daemon with a Kafka listener: (daemon, host, port); on each state store, the
    PostgreSQL one in `make reliability` (``BOTH_STORES`` marks the slice that runs on
    both in `make test`)."""
    flags = store_postgres_slow.daemon_flags()
    daemon = await spawn(tmp_path / "data", "--kafka-listener", "127.0.0.1:0", *flags)
    host, port = kafka_address(daemon.stdout_lines)
    return daemon, host, port


async def connect(kafka) -> KafkaClient:
    _, host, port = kafka
    return await KafkaClient.connect(host, port)


@BOTH_STORES
async def test_kip932_worked_example_over_the_kafka_protocol(kafka):
    example = json.loads(await asyncio.to_thread(WORKED_EXAMPLE.read_text))
    client = await connect(kafka)
    try:
        for step in example["steps"]:
            answer = await client.rpc(step["rpc"], step["request"])
            assert answer == step["expected_response"], step["description"]
            then = step.get("then_read")
            if then:
                answer = await client.rpc("read", then["request"])
                assert answer == then["expected_response"], step["description"]
    finally:
        await client.close()


def random_op(rng: random.Random, partitions: list[int]) -> tuple[str, list[dict[str, Any]]]:
    """One random RPC over a few partitions; values reach into the edge checks."""
    rpc = rng.choice(["initialize", "read", "write", "write", "delete", "read-summary"])
    entries = []
    for p in rng.sample(partitions, rng.randint(1, len(partitions))):
        epoch = rng.randint(-2, 3)
        if rpc == "initialize":
            entries.append(init_entry(p, epoch, rng.choice([-1, 0, 5, 50])))
        elif rpc in ("read", "read-summary"):
            entries.append(read_entry(p, epoch))
        elif rpc == "delete":
            entries.append(part(p))
        else:
            first = rng.randint(-1, 60)
            batches = [
                batch(
                    first,
                    first + rng.randint(-1, 9),
                    rng.choice([0, 1, 2, 4, 3]),
                    rng.randint(-1, 3),
                )
                for _ in range(rng.randint(0, 3))
            ]
            entries.append(
                write_entry(
                    p,
                    *batches,
                    state_epoch=rng.randint(-1, 3),
                    leader_epoch=epoch,
                    start_offset=rng.choice([-1, 0, 10, 30]),
                    delivery_complete_count=rng.choice([-1, 0, 7]),
                )
            )
    return rpc, entries


@BOTH_STORES
@pytest.mark.parametrize("seed", range(3))
async def test_random_sequences_answer_the_same_over_kafka_and_http(kafka, session, seed):
    daemon, _, _ = kafka
    api = Api(session, daemon.url, "msgpack")
    client = await connect(kafka)
    rng = random.Random(seed)
    partitions = list(range(6))
    try:
        for _ in range(60):
            rpc, entries = random_op(rng, partitions)
            over_http = await api.rpc(rpc, body(f"http-{seed}", (TOPIC, entries)))
            over_kafka = await client.rpc(rpc, body(f"kafka-{seed}", (TOPIC, entries)))
            assert over_kafka == over_http, (rpc, entries)
    finally:
        await client.close()


async def test_every_version_of_every_rpc(kafka):
    client = await connect(kafka)
    g = "versions"
    try:
        for version in (0, 1):
            entry = write_entry(0, batch(5, 9, 2, 1), start_offset=5, delivery_complete_count=3)
            await client.rpc("initialize", body(g, (TOPIC, [init_entry(0)])), 0)
            assert (await client.rpc("write", body(g, (TOPIC, [entry])), version))["results"][0][
                "partitions"
            ][0]["error_code"] == 0
            summary = await client.rpc("read-summary", body(g, (TOPIC, [part(0)])), version)
            (result,) = summary["results"][0]["partitions"]
            # v1 of the write carries the count and v1 of the summary shows it; v0 of the
            # summary has no such field.
            assert result.get("delivery_complete_count", "absent") == (
                "absent" if version == 0 else 3
            )
            assert result["start_offset"] == 5
            read = await client.rpc("read", body(g, (TOPIC, [read_entry(0)])), 0)
            assert read["results"][0]["partitions"][0]["state_batches"] == [batch(5, 9, 2, 1)]
            assert (await client.rpc("delete", body(g, (TOPIC, [part(0)])), 0))["results"]
    finally:
        await client.close()


async def test_empty_group_topics_or_partitions_get_an_empty_answer(kafka):
    client = await connect(kafka)
    try:
        for request in (
            body("", (TOPIC, [part(0)])),
            body("g"),
            body("g", (TOPIC, [part(0)]), (TOPIC, [])),
        ):
            for rpc in ("initialize", "read", "write", "delete", "read-summary"):
                entries = request["topics"]
                shaped = {
                    "group_id": request["group_id"],
                    "topics": [
                        {
                            "topic_id": t["topic_id"],
                            "partitions": [_entry(rpc, 0) for _ in t["partitions"]],
                        }
                        for t in entries
                    ],
                }
                assert await client.rpc(rpc, shaped) == {"results": []}
    finally:
        await client.close()


RPCS = ("initialize", "read", "write", "delete", "read-summary")


def _entry(rpc: str, p: int) -> dict[str, Any]:
    return {
        "initialize": init_entry(p),
        "read": read_entry(p),
        "write": write_entry(p),
        "delete": part(p),
        "read-summary": part(p),
    }[rpc]


async def test_pipelined_requests_are_answered_in_order(kafka):
    client = await connect(kafka)
    g = "pipeline"
    try:
        await client.rpc("initialize", body(g, (TOPIC, [init_entry(p) for p in range(8)])))
        requests = []
        for i in range(20):
            p = i % 8
            requests.append(share_request("write", body(g, (TOPIC, [write_entry(p, batch(i, i))]))))
            requests.append(share_request("read", body(g, (TOPIC, [read_entry(p)]))))
        answers = await client.pipeline(requests)
        for i in range(20):
            read = answers[2 * i + 1].results[0].partitions[0]
            # Each read sees the write just before it: requests run in order too.
            assert [(b.first_offset, b.last_offset) for b in read.state_batches][-1] == (i, i)
    finally:
        await client.close()


async def test_small_and_large_answers_of_one_connection_keep_request_order(kafka):
    """Pipelined requests whose answers differ in size by a hundred times (a read of a
    key with 2,000 batches between small writes and summaries): the answers arrive
    whole and in request order."""
    client = await connect(kafka)
    g = "sizes"
    try:
        await client.rpc("initialize", body(g, (TOPIC, [init_entry(p) for p in range(4)])))
        many = [batch(2 * i, 2 * i, i % 3, 1 + i % 4) for i in range(2_000)]
        written = await client.rpc("write", body(g, (TOPIC, [write_entry(0, *many)])))
        assert written["results"][0]["partitions"][0]["error_code"] == 0
        requests = []
        for i in range(30):
            requests.append(share_request("read", body(g, (TOPIC, [read_entry(0)]))))
            requests.append(share_request("read-summary", body(g, (TOPIC, [part(1 + i % 3)]))))
            requests.append(share_request("write", body(g, (TOPIC, [write_entry(2, batch(i, i))]))))
        frames = [client.frame(r) for r in requests]
        assert len(client.frame(requests[0])[0]) < 100  # a small request, a large answer
        client.writer.write(b"".join(data for data, _ in frames))
        sizes = []
        for request, (_, correlation_id) in zip(requests, frames, strict=True):
            data = await client.read_frame()
            sizes.append(len(data))
            client.decode(request, data, correlation_id)  # asserts the correlation id
        assert min(sizes[0::3]) > 16 * 1024
        assert max(sizes[1::3] + sizes[2::3]) < 1024
    finally:
        await client.close()


async def test_api_versions_every_version_and_one_too_new(kafka):
    client = await connect(kafka)
    try:
        for version in range(5):
            request = message_class("api_versions", version, "request")
            fields = (
                {"client_software_name": "t", "client_software_version": "1"}
                if version >= 3
                else {}
            )
            answer = await client.send(request(**fields))
            keys = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
            assert keys[85] == (0, 1) and keys[87] == (0, 1) and keys[10] == (0, 6)
        # A bad software name is error 42, and the connection stays open.
        bad = message_class("api_versions", 3, "request")(
            client_software_name="-bad-", client_software_version="1"
        )
        assert int((await client.send(bad)).error_code) == 42
        # Version 9: header v2, error 35 in a v0 body naming ApiVersions' range.
        frame = raw_request(18, 9, 77, b"\x00")
        client.writer.write(frame)
        data = await client.read_frame()
        assert data[:4] == (77).to_bytes(4, "big")
        answer, _ = _read(message_class("api_versions", 0, "response"), data[4:])
        assert int(answer.error_code) == 35
        assert [(a.api_key, a.min_version, a.max_version) for a in answer.api_keys] == [(18, 0, 4)]
    finally:
        await client.close()


def _read(cls: Any, data: bytes) -> Any:
    from kio.serial import entity_reader  # noqa: PLC0415

    return entity_reader(cls)(data, 0)


async def test_find_coordinator_answers_the_kafka_listener_of_this_node(kafka):
    _, host, port = kafka
    client = await connect(kafka)
    key = f"g:{TOPIC}:0"
    try:
        fc6 = message_class("find_coordinator", 6, "request")
        answer = await client.send(fc6(key_type=2, coordinator_keys=(key, "nonsense")))
        good, bad = answer.coordinators
        assert (good.key, good.node_id, good.host, good.port, int(good.error_code)) == (
            key, 0, host, port, 0,
        )  # fmt: skip
        assert (bad.node_id, bad.host, bad.port, int(bad.error_code)) == (-1, "", -1, 42)
        # A share key needs v6 (Kafka: 42); group and transaction keys are not ours (15).
        fc5 = message_class("find_coordinator", 5, "request")
        (old,) = (await client.send(fc5(key_type=2, coordinator_keys=(key,)))).coordinators
        assert int(old.error_code) == 42
        (group,) = (await client.send(fc6(key_type=0, coordinator_keys=("g",)))).coordinators
        assert int(group.error_code) == 15
        v0 = await client.send(message_class("find_coordinator", 0, "request")(key="g"))
        assert int(v0.error_code) == 15
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("what", "frame"),
    [
        ("unknown api key", raw_request(999, 0, 1, b"")),
        ("unsupported version", raw_request(85, 7, 1, b"\x02g\x01\x00")),
        ("truncated body", raw_request(85, 0, 1, b"\x05g")),
        ("trailing bytes", raw_request(86, 0, 1, b"\x02g\x01\x00\x00")),
        ("size over the limit", (10**8).to_bytes(4, "big") + b"\x00" * 16),
        ("negative size", (-5).to_bytes(4, "big", signed=True)),
    ],
)
async def test_what_kafka_closes_the_connection_for(kafka, session, what, frame):
    daemon, _, _ = kafka
    client = await connect(kafka)
    client.writer.write(frame)
    assert await client.closed_by_peer(), what
    await client.close()
    # The daemon serves everyone else.
    other = await connect(kafka)
    try:
        assert await other.rpc("read-summary", body("after", (TOPIC, [part(0)])))
    finally:
        await other.close()
    text = await Api(session, daemon.url).metrics()
    assert (
        metric_value(text, "sharecoord_kafka_connections_closed_total", reason="malformed")
        + (metric_value(text, "sharecoord_kafka_connections_closed_total", reason="unsupported"))
        + metric_value(text, "sharecoord_kafka_connections_closed_total", reason="too_large")
        >= 1
    )


async def test_a_group_id_over_the_limit_closes_the_connection_as_other_limits_do(kafka, session):
    """docs/api.md "The Kafka listener": more than a limit allows closes the connection,
    nothing run; the group id limit (255 UTF-8 bytes) is one of them, in every RPC and in
    FindCoordinator's keys. Exactly the limit is served."""
    daemon, _, _ = kafka
    at_the_limit = "€" * 85  # 255 bytes
    client = await connect(kafka)
    try:
        request = body(at_the_limit, (TOPIC, [init_entry(0)]))
        assert (await client.rpc("initialize", request))["results"][0]["partitions"][0] == {
            "partition": 0, "error_code": 0, "error_message": None,
        }  # fmt: skip
        fc6 = message_class("find_coordinator", 6, "request")
        keys = (f"{at_the_limit}:{TOPIC}:0",)
        (found,) = (await client.send(fc6(key_type=2, coordinator_keys=keys))).coordinators
        assert int(found.error_code) == 0
    finally:
        await client.close()
    over = at_the_limit + "g"
    requests = [share_request(rpc, body(over, (TOPIC, [_entry(rpc, 0)]))) for rpc in RPCS]
    requests.append(share_request("write", body(over)))  # no topics: still over the limit
    requests.append(fc6(key_type=2, coordinator_keys=(f"{over}:{TOPIC}:0",)))
    for request in requests:
        client = await connect(kafka)
        client.writer.write(client.frame(request)[0])
        assert await client.closed_by_peer(), request
        await client.close()
    text = await Api(session, daemon.url).metrics()
    closed = metric_value(text, "sharecoord_kafka_connections_closed_total", reason="malformed")
    assert closed == len(requests)
    reply = await Api(session, daemon.url).request("GET", "/v1/admin/partitions")
    assert sum(p["log_end_offset"] for p in reply.body["partitions"]) == 1  # the initialize


async def test_metrics_count_kafka_requests_by_api_version_and_outcome(kafka, session):
    daemon, _, _ = kafka
    client = await connect(kafka)
    try:
        await client.rpc("initialize", body("m", (TOPIC, [init_entry(0)])))
        await client.rpc("write", body("m", (TOPIC, [write_entry(0)])), 1)
    finally:
        await client.close()
    text = await Api(session, daemon.url).metrics()
    labels = {"api": "WriteShareGroupState", "version": "1", "outcome": "ok"}
    assert metric_value(text, "sharecoord_kafka_requests_total", **labels) == 1
    assert (
        metric_value(
            text, "sharecoord_kafka_request_latency_seconds_count", api="WriteShareGroupState"
        )
        == 1
    )
    # The HTTP families keep their meaning: these entries are counted as results only.
    assert metric_value(text, "sharecoord_rpc_requests_total", rpc="write", outcome="ok") == 0
    assert (
        metric_value(text, "sharecoord_partition_results_total", rpc="write", error_code="0") == 1
    )
    # A running daemon's page, HTTP and Kafka families alike, parses with
    # prometheus_client's own parser and names every family the daemon ever exported.
    exported = {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in text_string_to_metric_families(text)
    }
    assert exported == {name: kind for name, (kind, _) in FAMILIES.items()}


async def test_idle_and_slow_connections_are_cut(spawn, tmp_path):
    daemon = await spawn(
        tmp_path / "data", "--kafka-listener", "127.0.0.1:0", "--request-timeout-s", "0.5"
    )
    host, port = kafka_address(daemon.stdout_lines)
    idle = await KafkaClient.connect(host, port)
    slow = await KafkaClient.connect(host, port)
    slow.writer.write(raw_request(18, 0, 1, b"")[:7])  # a frame that never completes
    assert await idle.closed_by_peer(timeout=10)
    assert await slow.closed_by_peer(timeout=10)
    await idle.close()
    await slow.close()


def test_schema_helper_knows_the_share_messages():
    assert schema("write_share_group_state", 1, "request").PartitionData


async def test_a_client_that_half_closes_gets_every_answer_then_eof(kafka):
    client = await connect(kafka)
    requests = [share_request("read-summary", body("eof", (TOPIC, [part(p)]))) for p in range(40)]
    frames = [client.frame(r) for r in requests]
    client.writer.write(b"".join(data for data, _ in frames))
    client.writer.write_eof()
    for request, (_, correlation_id) in zip(requests, frames, strict=True):
        answer = client.decode(request, await client.read_frame(), correlation_id)
        assert int(answer.results[0].partitions[0].error_code) == 0
    assert await client.reader.read() == b""
    await client.close()


async def test_a_wildcard_kafka_listener_is_advertised_by_the_advertised_host(spawn, tmp_path):
    """FindCoordinator of a node alone names its Kafka listener's port at an address a
    client can connect to: the --advertised-listener's host, not 0.0.0.0."""
    daemon = await spawn(
        tmp_path / "data",
        "--kafka-listener",
        "0.0.0.0:0",
        "--advertised-listener",
        "coord.example:19095",
    )
    _, port = kafka_address(daemon.stdout_lines)
    client = await KafkaClient.connect("127.0.0.1", port)
    key = f"g:{TOPIC}:0"
    try:
        fc6 = message_class("find_coordinator", 6, "request")
        (found,) = (await client.send(fc6(key_type=2, coordinator_keys=(key,)))).coordinators
        assert (found.host, found.port, int(found.error_code)) == ("coord.example", port, 0)
    finally:
        await client.close()


# --- hostile strings, and the log of the closes they cause ------------------------------------

CLOSED = re.compile(
    r"^(\S+) INFO sharecoord\.kafka Kafka listener: connection closed "
    r"reason=(\S+) peer=(\S+) detail=(.*)$",
    re.MULTILINE,
)
NOT_SHOWN = re.compile(r"Kafka listener: more connections closed than shown not_shown=(\d+)")


def closes_logged(text: str) -> int:
    """The closes the log accounts for: one line each, or counted in a summary line."""
    return len(CLOSED.findall(text)) + sum(int(n) for n in NOT_SHOWN.findall(text))


async def answer_or_close(kafka, frame: bytes) -> bytes | None:
    """The first answer to ``frame`` on a fresh connection, or None if the daemon
    closed it without one."""
    client = await connect(kafka)
    try:
        client.writer.write(frame)
        try:
            return await asyncio.wait_for(client.read_frame(), 30)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
    finally:
        await client.close()


async def test_bytes_that_are_not_utf8_in_any_string_close_the_connection(kafka, session):
    """docs/api.md "The Kafka listener": a string that is not UTF-8 (overlong forms and
    encoded surrogates too) closes the connection, unanswered, wherever it is; the
    daemon logs each close at info with no trace and serves on. The client id, which
    the daemon never reads, is no reason to close; NUL is a character like any other."""
    daemon, _, _ = kafka
    closed = 0
    for where, frame_with, decoded in STRING_POSITIONS:
        assert await answer_or_close(kafka, frame_with(b"g")) is not None, where
        if decoded and "Sasl" not in where:  # NUL is no SASL mechanism we offer
            assert await answer_or_close(kafka, frame_with(b"g\x00h")) is not None, where
        for kind, (raw, _) in HOSTILE_STRINGS.items():
            answer = await answer_or_close(kafka, frame_with(raw))
            assert (answer is None) is decoded, (where, kind, answer)
            closed += decoded
    api = Api(session, daemon.url)
    text = await api.metrics()
    assert metric_value(text, "sharecoord_kafka_connections_closed_total", reason="malformed") == (
        closed
    )
    faults = sum(
        metric_value(text, "sharecoord_kafka_connections_closed_total", reason=reason)
        for reason in ("malformed", "unsupported", "unauthenticated", "authentication_failed")
    )
    log = await wait_until(
        lambda: asyncio.to_thread(daemon.stderr_text),
        f"{faults} closed connections in the log",
        until=lambda text: closes_logged(text) == faults,
    )
    assert "Traceback" not in log
    shown = CLOSED.findall(log)
    assert any("not UTF-8" in detail for _, reason, _, detail in shown if reason == "malformed")
    assert await connect_and_read_summary(kafka)


async def connect_and_read_summary(kafka) -> dict[str, Any]:
    client = await connect(kafka)
    try:
        answer: dict[str, Any] = await client.rpc("read-summary", body("after", (TOPIC, [part(0)])))
        return answer
    finally:
        await client.close()


async def test_closes_for_bad_frames_are_logged_with_reason_and_peer_a_few_a_second(kafka):
    """One line at info per close the client caused (reason, peer, what was wrong); a
    flood of them costs at most CLOSES_SHOWN lines in an interval, then one line with
    how many were not shown: never more than twice CLOSES_SHOWN lines in a second, and
    every close accounted for."""
    daemon, _, _ = kafka
    clients = [await connect(kafka) for _ in range(60)]
    peers = {"{}:{}".format(*c.writer.get_extra_info("sockname")[:2]) for c in clients}
    bad = find_coordinator_frame(6, [b"\xff"])
    for client in clients:
        client.writer.write(bad)
    for client in clients:
        assert await client.closed_by_peer()
        await client.close()
    log = await wait_until(
        lambda: asyncio.to_thread(daemon.stderr_text),
        f"{len(clients)} closed connections in the log",
        until=lambda text: closes_logged(text) == len(clients),
    )
    shown = CLOSED.findall(log)
    assert shown
    for _, reason, peer, detail in shown:
        assert (reason, detail) == (
            "malformed",
            '"FindCoordinator v6: a string that is not UTF-8 at byte 14"',
        )
        assert peer in peers
    moments = [datetime.fromisoformat(at.replace("Z", "+00:00")) for at, *_ in shown]
    burst = 2 * CLOSES_SHOWN
    for first, last in zip(moments, moments[burst:], strict=False):
        assert (last - first).total_seconds() >= 0.9, (first, last)
