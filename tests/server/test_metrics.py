"""/metrics: Prometheus text format 0.0.4 through prometheus_client, with the families,
types and label names docs/operations.md#metrics promises, and the custom collectors
(per-request families and values read at scrape time) behaving as they should."""

from __future__ import annotations

import logging
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.metric_families import FunctionFamily, LoopCounter, LoopHistogram
from server.metrics import CONTENT_TYPE, LATENCY_BUCKETS, ShareCoordinatorMetrics
from tests.harness import samples

# Every family the daemon exports: its type and its label names (docs/operations.md).
FAMILIES = {
    "sharecoord_rpc_requests_total": ("counter", ("rpc", "outcome")),
    "sharecoord_partition_results_total": ("counter", ("rpc", "error_code")),
    "sharecoord_rpc_latency_seconds": ("histogram", ("rpc",)),
    "sharecoord_shard_writes_total": ("counter", ()),
    "sharecoord_fsync_duration_seconds": ("histogram", ()),
    "sharecoord_group_commit_partitions": ("histogram", ()),
    "sharecoord_checkpoint_duration_seconds": ("histogram", ()),
    "sharecoord_journal_bytes": ("gauge", ()),
    "sharecoord_records_appended_total": ("counter", ("partition",)),
    "sharecoord_bytes_appended_total": ("counter", ("partition",)),
    "sharecoord_keys": ("gauge", ("partition",)),
    "sharecoord_keys_unfolded": ("gauge", ("partition",)),
    "sharecoord_partition_status": ("gauge", ("partition", "status")),
    "sharecoord_log_start_offset": ("gauge", ("partition",)),
    "sharecoord_log_end_offset": ("gauge", ("partition",)),
    "sharecoord_log_segments": ("gauge", ("partition",)),
    "sharecoord_log_bytes": ("gauge", ("partition",)),
    "sharecoord_last_pruned_offset": ("gauge", ("partition",)),
    "sharecoord_partition_load_duration_seconds": ("gauge", ("partition",)),
    "sharecoord_event_loop_lag_seconds": ("histogram", ()),
    "sharecoord_gc_collections_total": ("counter", ("generation",)),
    "sharecoord_http_error_responses_total": ("counter", ("status",)),
    # The Kafka listener's families come after the HTTP ones, which keep their names.
    "sharecoord_kafka_requests_total": ("counter", ("api", "version", "outcome")),
    "sharecoord_kafka_request_latency_seconds": ("histogram", ("api",)),
    "sharecoord_kafka_connections": ("gauge", ()),
    "sharecoord_kafka_connections_closed_total": ("counter", ("reason",)),
    "sharecoord_kafka_connections_refused_total": ("counter", ()),
    # The PostgreSQL store's leases (cluster mode).
    "sharecoord_partitions_led": ("gauge", ()),
    "sharecoord_partitions_without_leader": ("gauge", ()),
    "sharecoord_takeovers_total": ("counter", ()),
}

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def busy_metrics() -> ShareCoordinatorMetrics:
    """Every family with at least one sample."""
    metrics = ShareCoordinatorMetrics()
    metrics.rpc_requests.labels("write", "ok").inc()
    metrics.partition_results.labels("write", 0).inc(5)
    metrics.rpc_latency.labels("write").observe(0.002)
    metrics.shard_writes.set_function(lambda: 3)
    metrics.fsync_latency.observe(0.001)
    metrics.group_commit_partitions.observe(3)
    metrics.checkpoint_duration.observe(0.01)
    metrics.journal_bytes.set_function(lambda: 4096)
    metrics.records_appended.labels(4).set_function(lambda: 2)
    metrics.bytes_appended.labels(4).set_function(lambda: 180)
    metrics.track_partition(
        4,
        status=lambda: "active",
        keys=lambda: 1,
        keys_unfolded=lambda: 0,
        log_start_offset=lambda: 0,
        log_end_offset=lambda: 2,
        segments=lambda: 1,
        size_bytes=lambda: 180,
    )
    metrics.last_pruned_offset.labels(4).set(100)
    metrics.load_duration.labels(4).set(0.25)
    metrics.event_loop_lag.labels().observe(0.0005)
    metrics.http_errors.labels(400).inc()
    metrics.kafka_requests.labels("WriteShareGroupState", 1, "ok").inc()
    metrics.kafka_latency.labels("WriteShareGroupState").observe(0.001)
    metrics.kafka_connections.inc()
    metrics.kafka_closed.labels("idle").inc()
    metrics.kafka_refused.inc()
    metrics.track_leadership(led=lambda: 3, without_leader=lambda: 1, takeovers=lambda: 2)
    return metrics


def test_every_family_keeps_its_name_type_and_label_names():
    text = busy_metrics().render()
    declared = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert declared == {name: kind for name, (kind, _) in FAMILIES.items()}
    for family in text_string_to_metric_families(text):
        # The parser names counters without _total; the page names them with it.
        name = family.name + "_total" if family.type == "counter" else family.name
        kind, labels = FAMILIES[name]
        assert family.type == kind
        assert family.samples, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(labels), (name, sample)
    for line in text.splitlines():
        assert line.startswith("# ") or SAMPLE.match(line), line
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_no_created_series_are_exported():
    assert "_created" not in busy_metrics().render()


def test_sample_values_read_as_they_were_set():
    values = samples(busy_metrics().render())

    def value(name: str, **labels: str) -> float:
        return values[name, frozenset(labels.items())]

    assert value("sharecoord_rpc_requests_total", rpc="write", outcome="ok") == 1
    assert value("sharecoord_partition_results_total", rpc="write", error_code="0") == 5
    assert value("sharecoord_shard_writes_total") == 3
    assert value("sharecoord_journal_bytes") == 4096
    assert value("sharecoord_bytes_appended_total", partition="4") == 180
    assert value("sharecoord_last_pruned_offset", partition="4") == 100
    assert value("sharecoord_http_error_responses_total", status="400") == 1
    assert value("sharecoord_group_commit_partitions_bucket", le="4.0") == 1
    assert value("sharecoord_group_commit_partitions_bucket", le="2.0") == 0
    labels = {"api": "WriteShareGroupState", "version": "1", "outcome": "ok"}
    assert value("sharecoord_kafka_requests_total", **labels) == 1
    assert value("sharecoord_kafka_connections") == 1


def test_rpc_latency_buckets_run_from_100_microseconds_to_10_seconds():
    assert LATENCY_BUCKETS[0] == 0.0001
    assert LATENCY_BUCKETS[-1] == 10
    metrics = ShareCoordinatorMetrics()
    assert metrics.rpc_latency.upper_bounds == list(LATENCY_BUCKETS)
    metrics.rpc_latency.labels("read").observe(0.0001)
    values = samples(metrics.render())
    les = [le for (name, labels), _ in values.items() for k, le in labels if k == "le"]
    assert les[0] == "0.0001"
    assert les[-2:] == ["10.0", "+Inf"]


def test_loop_histogram_buckets_are_cumulative_with_le_meaning_less_or_equal():
    histogram = LoopHistogram("h", "h", ("rpc",), (1, 2, 3))
    child = histogram.labels("write")
    for value in (0, 1, 1.5, 2, 2.0001, 3, 3.5, 100):
        child.observe(value)
    assert child.cumulative_counts() == [2, 4, 6, 8]
    (family,) = histogram.collect()
    got = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert got["h_bucket", "1.0"] == 2
    assert got["h_bucket", "+Inf"] == 8
    assert got["h_count", None] == 8
    assert got["h_sum", None] == sum((0, 1, 1.5, 2, 2.0001, 3, 3.5, 100))


def test_loop_families_check_their_labels_and_buckets():
    counter = LoopCounter("c_total", "c", ("rpc", "outcome"))
    assert counter.labels("write", 3) is counter.labels("write", "3")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("write")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("a", "b").inc(-1)
    with pytest.raises(ValueError, match="strictly increasing"):
        LoopHistogram("h", "h", (), (1, 1))
    assert LoopHistogram("h", "h", (), (1, 2, float("inf"))).upper_bounds == [1.0, 2.0]


def test_a_failing_function_leaves_out_its_sample_and_logs(caplog):
    family = FunctionFamily("g", "g", ("partition",), kind="gauge")
    family.labels(0).set_function(lambda: 1 / 0)
    family.labels(1).set_function(lambda: 4)
    with caplog.at_level(logging.ERROR, logger="sharecoord.metrics"):
        (metric,) = family.collect()
    assert [(s.labels, s.value) for s in metric.samples] == [({"partition": "1"}, 4)]
    assert "its function failed" in caplog.text


def test_tracked_partition_gauges_read_the_runtime_at_scrape_time():
    metrics = ShareCoordinatorMetrics()
    runtime = {
        "status": "loading",
        "keys": 0,
        "unfolded": 0,
        "start": 0,
        "end": 0,
        "segments": 1,
        "bytes": 0,
    }
    metrics.track_partition(
        7,
        status=lambda: str(runtime["status"]),
        keys=lambda: runtime["keys"],
        keys_unfolded=lambda: runtime["unfolded"],
        log_start_offset=lambda: runtime["start"],
        log_end_offset=lambda: runtime["end"],
        segments=lambda: runtime["segments"],
        size_bytes=lambda: runtime["bytes"],
    )

    def value(name: str, **labels: str) -> float:
        return samples(metrics.render())[name, frozenset({"partition": "7", **labels}.items())]

    assert value("sharecoord_partition_status", status="loading") == 1
    assert value("sharecoord_partition_status", status="active") == 0
    runtime.update(status="active", keys=12, unfolded=5, start=3, end=40, segments=2, bytes=4096)
    assert value("sharecoord_partition_status", status="loading") == 0
    assert value("sharecoord_partition_status", status="active") == 1
    assert value("sharecoord_partition_status", status="failed") == 0
    assert value("sharecoord_keys") == 12
    assert value("sharecoord_keys_unfolded") == 5
    assert value("sharecoord_log_start_offset") == 3
    assert value("sharecoord_log_end_offset") == 40
    assert value("sharecoord_log_segments") == 2
    assert value("sharecoord_log_bytes") == 4096
    metrics.load_duration.labels(7).set(1.5)
    metrics.untrack_partition(7)
    assert 'partition="7"' not in metrics.render()


def test_two_daemons_in_one_process_keep_their_own_registries():
    first, second = ShareCoordinatorMetrics(), ShareCoordinatorMetrics()
    first.rpc_requests.labels("read", "ok").inc()
    assert "sharecoord_rpc_requests_total{" in first.render()
    assert "sharecoord_rpc_requests_total{" not in second.render()
