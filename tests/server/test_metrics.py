"""Metrics in the Prometheus text format 0.0.4."""

from __future__ import annotations

import logging
import re

import pytest

from server.metrics import (
    CONTENT_TYPE,
    LATENCY_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    Registry,
    ShareCoordinatorMetrics,
)


def test_small_registry_renders_exactly_the_golden_text():
    registry = Registry()
    requests = registry.counter("app_requests_total", "Requests served.", ("rpc", "outcome"))
    requests.labels(rpc="write", outcome="ok").inc()
    requests.labels(rpc="write", outcome="ok").inc(2)
    requests.labels("read", "42").inc()
    up = registry.gauge("app_up", "Whether the app is up.")
    up.set(1)
    latency = registry.histogram("app_latency_seconds", "Latency.", buckets=(0.1, 1, 5))
    for value in (0.05, 0.1, 0.5, 7):
        latency.observe(value)
    registry.counter("app_unused_total", "Never touched.", ("rpc",))

    assert registry.render() == (
        "# HELP app_requests_total Requests served.\n"
        "# TYPE app_requests_total counter\n"
        'app_requests_total{rpc="write",outcome="ok"} 3\n'
        'app_requests_total{rpc="read",outcome="42"} 1\n'
        "# HELP app_up Whether the app is up.\n"
        "# TYPE app_up gauge\n"
        "app_up 1\n"
        "# HELP app_latency_seconds Latency.\n"
        "# TYPE app_latency_seconds histogram\n"
        'app_latency_seconds_bucket{le="0.1"} 2\n'
        'app_latency_seconds_bucket{le="1.0"} 3\n'
        'app_latency_seconds_bucket{le="5.0"} 3\n'
        'app_latency_seconds_bucket{le="+Inf"} 4\n'
        "app_latency_seconds_sum 7.65\n"
        "app_latency_seconds_count 4\n"
        "# HELP app_unused_total Never touched.\n"
        "# TYPE app_unused_total counter\n"
    )
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_empty_registry_renders_nothing():
    assert Registry().render() == ""


def test_unlabelled_metrics_render_zero_before_any_update():
    registry = Registry()
    registry.counter("c_total", "c")
    registry.gauge("g", "g")
    registry.histogram("h", "h", buckets=(1,))
    samples = [line for line in registry.render().splitlines() if not line.startswith("#")]
    assert samples == [
        "c_total 0",
        "g 0",
        'h_bucket{le="1.0"} 0',
        'h_bucket{le="+Inf"} 0',
        "h_sum 0",
        "h_count 0",
    ]


def test_histogram_buckets_are_cumulative_with_le_meaning_less_or_equal():
    registry = Registry()
    histogram = registry.histogram("h", "h", ("rpc",), buckets=(1, 2, 3))
    child = histogram.labels(rpc="write")
    for value in (0, 1, 1.5, 2, 2.0001, 3, 3.5, 100):
        child.observe(value)
    assert child.cumulative_counts() == [2, 4, 6, 8]
    assert child.count == 8
    lines = registry.render().splitlines()
    assert lines[2:6] == [
        'h_bucket{rpc="write",le="1.0"} 2',
        'h_bucket{rpc="write",le="2.0"} 4',
        'h_bucket{rpc="write",le="3.0"} 6',
        'h_bucket{rpc="write",le="+Inf"} 8',
    ]
    assert lines[6] == f'h_sum{{rpc="write"}} {sum((0, 1, 1.5, 2, 2.0001, 3, 3.5, 100))!r}'
    assert lines[7] == 'h_count{rpc="write"} 8'


def test_histogram_buckets_must_increase_and_inf_is_implied():
    assert Histogram("h", "h", buckets=(1, 2, float("inf"))).upper_bounds == [1.0, 2.0]
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram("h", "h", buckets=(1, 1))
    with pytest.raises(ValueError, match="finite"):
        Histogram("h", "h", buckets=())
    with pytest.raises(ValueError, match="reserved"):
        Histogram("h", "h", ("le",), buckets=(1,))


def test_label_values_are_escaped_and_help_too():
    registry = Registry()
    counter = registry.counter(
        "c_total", 'Help with a \\ backslash\nand a newline "quoted".', ("k",)
    )
    counter.labels(k='a "quoted" \\ back\nslash').inc()
    assert registry.render() == (
        '# HELP c_total Help with a \\\\ backslash\\nand a newline "quoted".\n'
        "# TYPE c_total counter\n"
        'c_total{k="a \\"quoted\\" \\\\ back\\nslash"} 1\n'
    )


def test_label_values_are_strings_of_what_was_given():
    counter = Counter("c_total", "c", ("partition",))
    assert counter.labels(partition=3) is counter.labels("3")


def test_labels_must_match_the_declared_names():
    counter = Counter("c_total", "c", ("rpc", "outcome"))
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels(rpc="write")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels(rpc="write", outcome="ok", extra="x")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("write")
    with pytest.raises(ValueError, match=r"use \.labels\(\)"):
        counter.inc()


@pytest.mark.parametrize("name", ["", "9lives", "has-dash", "has space"])
def test_metric_names_are_checked(name):
    with pytest.raises(ValueError, match="invalid metric name"):
        Counter(name, "doc")


@pytest.mark.parametrize("label", ["__reserved", "has-dash", "1a"])
def test_label_names_are_checked(label):
    with pytest.raises(ValueError, match="invalid label name"):
        Gauge("g", "doc", (label,))


def test_a_name_is_registered_once():
    registry = Registry()
    registry.counter("c_total", "c")
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("c_total", "c")


def test_counter_only_goes_up():
    counter = Counter("c_total", "c")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1)


def test_gauge_sets_incs_and_decs():
    gauge = Gauge("g", "g")
    gauge.set(10)
    gauge.inc(5)
    gauge.dec(2.5)
    assert gauge.labels().get() == 12.5


def test_gauge_function_is_read_at_every_render():
    registry = Registry()
    gauge = registry.gauge("g", "g", ("partition",))
    state = {"keys": 1}
    gauge.labels(partition=0).set_function(lambda: state["keys"])
    assert 'g{partition="0"} 1\n' in registry.render()
    state["keys"] = 7
    assert 'g{partition="0"} 7\n' in registry.render()


def test_gauge_collector_supplies_label_sets_at_render():
    registry = Registry()
    gauge = registry.gauge("g", "g", ("partition", "status"))
    gauge.set_collector(lambda: [((0, "active"), 1), ((1, "failed"), 1)])
    assert registry.render().splitlines()[2:] == [
        'g{partition="0",status="active"} 1',
        'g{partition="1",status="failed"} 1',
    ]


def test_a_failing_gauge_function_leaves_out_its_sample_and_logs(caplog):
    registry = Registry()
    gauge = registry.gauge("g", "g", ("partition",))
    gauge.labels(partition=0).set_function(lambda: 1 / 0)
    gauge.labels(partition=1).set(4)
    gauge.set_collector(lambda: [((2,), 5), ((3, "extra"), 6)])
    registry.counter("c_total", "c").inc()
    with caplog.at_level(logging.ERROR, logger="sharecoord.metrics"):
        text = registry.render()
    assert 'partition="0"' not in text
    assert 'g{partition="1"} 4\n' in text
    assert 'g{partition="2"} 5\n' in text
    assert "extra" not in text
    assert text.endswith("c_total 1\n")
    assert "its function failed" in caplog.text
    assert "collector gave labels" in caplog.text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3, "3"),
        (2.5, "2.5"),
        (True, "1"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (float("nan"), "NaN"),
        (1e-05, "1e-05"),
    ],
)
def test_sample_values_are_formatted_for_prometheus(value, text):
    registry = Registry()
    registry.gauge("g", "g").set(value)
    assert registry.render().endswith(f"\ng {text}\n")


def test_remove_forgets_a_child():
    registry = Registry()
    gauge = registry.gauge("g", "g", ("partition",))
    gauge.labels(1).set(1)
    gauge.labels(2).set(2)
    gauge.remove(1)
    assert registry.render().splitlines()[2:] == ['g{partition="2"} 2']


# --- what the daemon exports ---------------------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def test_share_coordinator_metrics_are_all_prefixed_and_render_as_valid_lines():
    metrics = ShareCoordinatorMetrics()
    metrics.rpc_requests.labels(rpc="write", outcome="ok").inc()
    metrics.partition_results.labels(rpc="write", error_code=0).inc(5)
    metrics.rpc_latency.labels(rpc="write").observe(0.002)
    metrics.shard_writes.inc()
    metrics.fsync_latency.observe(0.001)
    metrics.group_commit_partitions.observe(3)
    metrics.records_appended.labels(partition=4).inc(2)
    metrics.bytes_appended.labels(partition=4).inc(180)
    metrics.last_pruned_offset.labels(partition=4).set(100)
    metrics.load_duration.labels(partition=4).set(0.25)
    metrics.http_errors.labels(status=400).inc()
    metrics.kafka_requests.labels(api="WriteShareGroupState", version=1, outcome="ok").inc()
    metrics.kafka_latency.labels(api="WriteShareGroupState").observe(0.001)
    metrics.kafka_connections.inc()
    metrics.kafka_closed.labels(reason="idle").inc()
    text = metrics.render()
    families = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)
    assert all(name.startswith("sharecoord_") for name, _ in families)
    assert dict(families) == {
        "sharecoord_rpc_requests_total": "counter",
        "sharecoord_partition_results_total": "counter",
        "sharecoord_rpc_latency_seconds": "histogram",
        "sharecoord_shard_writes_total": "counter",
        "sharecoord_fsync_duration_seconds": "histogram",
        "sharecoord_group_commit_partitions": "histogram",
        "sharecoord_checkpoint_duration_seconds": "histogram",
        "sharecoord_journal_bytes": "gauge",
        "sharecoord_records_appended_total": "counter",
        "sharecoord_bytes_appended_total": "counter",
        "sharecoord_keys": "gauge",
        "sharecoord_partition_status": "gauge",
        "sharecoord_log_start_offset": "gauge",
        "sharecoord_log_end_offset": "gauge",
        "sharecoord_log_segments": "gauge",
        "sharecoord_log_bytes": "gauge",
        "sharecoord_last_pruned_offset": "gauge",
        "sharecoord_partition_load_duration_seconds": "gauge",
        "sharecoord_http_error_responses_total": "counter",
        # The Kafka listener's families come after the HTTP ones, which keep their names.
        "sharecoord_kafka_requests_total": "counter",
        "sharecoord_kafka_request_latency_seconds": "histogram",
        "sharecoord_kafka_connections": "gauge",
        "sharecoord_kafka_connections_closed_total": "counter",
    }
    for line in text.splitlines():
        assert line.startswith("# ") or SAMPLE.match(line), line
    assert 'sharecoord_rpc_requests_total{rpc="write",outcome="ok"} 1\n' in text
    assert 'sharecoord_partition_results_total{rpc="write",error_code="0"} 5\n' in text
    assert 'sharecoord_bytes_appended_total{partition="4"} 180\n' in text
    assert 'sharecoord_last_pruned_offset{partition="4"} 100\n' in text
    assert 'sharecoord_http_error_responses_total{status="400"} 1\n' in text
    assert 'sharecoord_group_commit_partitions_bucket{le="4.0"} 1\n' in text


def test_rpc_latency_buckets_run_from_100_microseconds_to_10_seconds():
    assert LATENCY_BUCKETS[0] == 0.0001
    assert LATENCY_BUCKETS[-1] == 10
    metrics = ShareCoordinatorMetrics()
    assert metrics.rpc_latency.upper_bounds == list(LATENCY_BUCKETS)


def test_tracked_partition_gauges_read_the_runtime_at_scrape_time():
    metrics = ShareCoordinatorMetrics()
    runtime = {"status": "loading", "keys": 0, "start": 0, "end": 0, "segments": 1, "bytes": 0}
    metrics.track_partition(
        7,
        status=lambda: runtime["status"],
        keys=lambda: runtime["keys"],
        log_start_offset=lambda: runtime["start"],
        log_end_offset=lambda: runtime["end"],
        segments=lambda: runtime["segments"],
        size_bytes=lambda: runtime["bytes"],
    )
    text = metrics.render()
    assert 'sharecoord_partition_status{partition="7",status="loading"} 1\n' in text
    assert 'sharecoord_partition_status{partition="7",status="active"} 0\n' in text
    runtime.update(status="active", keys=12, start=3, end=40, segments=2, bytes=4096)
    text = metrics.render()
    assert 'sharecoord_partition_status{partition="7",status="loading"} 0\n' in text
    assert 'sharecoord_partition_status{partition="7",status="active"} 1\n' in text
    assert 'sharecoord_partition_status{partition="7",status="failed"} 0\n' in text
    assert 'sharecoord_keys{partition="7"} 12\n' in text
    assert 'sharecoord_log_start_offset{partition="7"} 3\n' in text
    assert 'sharecoord_log_end_offset{partition="7"} 40\n' in text
    assert 'sharecoord_log_segments{partition="7"} 2\n' in text
    assert 'sharecoord_log_bytes{partition="7"} 4096\n' in text
    metrics.untrack_partition(7)
    assert 'partition="7"' not in metrics.render()
