"""Long work over the Kafka listener: a large frame is decoded off the event loop, and the
requests of one connection still run in the order they came (Kafka runs a connection's
requests one after the other)."""

from __future__ import annotations

from tests.harness import (
    TOPIC,
    Api,
    batch,
    body,
    init_entry,
    metric_value,
    read_entry,
    write_entry,
)
from tests.kafka_client import KafkaClient, as_http, share_request
from tests.protocol.batch_shapes import staircase
from tests.server.test_e2e_kafka import kafka  # noqa: F401

GROUP = "kafka-long"
N = 10_000  # ~210 KB on the wire: over OFFLOAD_BODY_BYTES


def staircase_write(partition: int) -> dict[str, object]:
    entry = write_entry(
        partition,
        *(
            batch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in staircase(N)
        ),
    )
    return body(GROUP, (TOPIC, [entry]))


async def test_a_read_after_a_large_write_on_one_connection_sees_it(kafka):  # noqa: F811
    _, host, port = kafka
    client = await KafkaClient.connect(host, port)
    try:
        assert (await client.rpc("initialize", body(GROUP, (TOPIC, [init_entry(0)]))))["results"][
            0
        ]["partitions"][0]["error_code"] == 0
        # The read is small and decodes at once, the write decodes off the loop: only
        # the connection's order keeps the read behind it.
        write, read = await client.pipeline(
            [
                share_request("write", staircase_write(0)),
                share_request("read", body(GROUP, (TOPIC, [read_entry(0, leader_epoch=1)]))),
            ]
        )
        assert as_http(write)["results"][0]["partitions"][0]["error_code"] == 0
        answer = as_http(read)["results"][0]["partitions"][0]
        assert answer["error_code"] == 0
        assert len(answer["state_batches"]) == N
        assert answer["state_batches"][0] == batch(0, N, 0, N)
    finally:
        await client.close()


async def test_a_malformed_large_frame_closes_the_connection(kafka, session):  # noqa: F811
    daemon, host, port = kafka
    client = await KafkaClient.connect(host, port)
    try:
        request = share_request("write", staircase_write(0))
        frame, _ = client.frame(request)
        # Cut its last topic short, and say so in the size prefix: well framed, bad body.
        body_bytes = frame[4:-50]
        client.writer.write(len(body_bytes).to_bytes(4, "big") + body_bytes)
        assert await client.closed_by_peer(timeout=30)
    finally:
        await client.close()
    # The daemon serves on.
    other = await KafkaClient.connect(host, port)
    try:
        answer = await other.rpc("read-summary", body(GROUP, (TOPIC, [{"partition": 0}])))
        assert answer["results"][0]["partitions"][0]["error_code"] == 0
    finally:
        await other.close()
    text = await Api(session, daemon.url).metrics()
    closed = "sharecoord_kafka_connections_closed_total"
    assert metric_value(text, closed, reason="malformed") == 1
    assert metric_value(text, closed, reason="internal") == 0
    labels = {"api": "WriteShareGroupState", "version": "1", "outcome": "closed"}
    assert metric_value(text, "sharecoord_kafka_requests_total", **labels) == 1
