"""The /metrics reader: prometheus_client's parser under the harness's three questions."""

from __future__ import annotations

from tests.harness.metrics import metric_total, metric_value, series

PAGE = """\
# HELP sharecoord_rpc_requests_total RPC requests.
# TYPE sharecoord_rpc_requests_total counter
sharecoord_rpc_requests_total{rpc="write",outcome="ok"} 3.0
sharecoord_rpc_requests_total{outcome="42",rpc="write"} 2.0
sharecoord_rpc_requests_total{rpc="read",outcome="ok"} 5.0
# HELP sharecoord_kafka_connections_closed_total Closed.
# TYPE sharecoord_kafka_connections_closed_total counter
sharecoord_kafka_connections_closed_total{reason="a \\"quoted\\", reason"} 1.0
# HELP sharecoord_journal_bytes Journal bytes.
# TYPE sharecoord_journal_bytes gauge
sharecoord_journal_bytes 4096.0
# HELP sharecoord_rpc_latency_seconds Latency.
# TYPE sharecoord_rpc_latency_seconds histogram
sharecoord_rpc_latency_seconds_bucket{rpc="read",le="0.001"} 4.0
sharecoord_rpc_latency_seconds_bucket{rpc="read",le="+Inf"} 5.0
sharecoord_rpc_latency_seconds_count{rpc="read"} 5.0
sharecoord_rpc_latency_seconds_sum{rpc="read"} 0.002
"""


def test_a_value_needs_exactly_its_labels_in_any_order() -> None:
    assert metric_value(PAGE, "sharecoord_rpc_requests_total", outcome="ok", rpc="write") == 3
    assert metric_value(PAGE, "sharecoord_rpc_requests_total", rpc="write", outcome="42") == 2
    assert metric_value(PAGE, "sharecoord_rpc_requests_total", rpc="write") == 0  # no such
    assert metric_value(PAGE, "sharecoord_journal_bytes") == 4096


def test_a_total_sums_the_samples_whose_labels_include_these() -> None:
    assert metric_total(PAGE, "sharecoord_rpc_requests_total", rpc="write") == 5
    assert metric_total(PAGE, "sharecoord_rpc_requests_total") == 10
    assert metric_total(PAGE, "sharecoord_rpc_requests_total", rpc="delete") == 0


def test_escaped_label_values_and_histogram_samples_read_as_written() -> None:
    name = "sharecoord_kafka_connections_closed_total"
    assert metric_value(PAGE, name, reason='a "quoted", reason') == 1
    assert metric_value(PAGE, "sharecoord_rpc_latency_seconds_count", rpc="read") == 5
    assert metric_value(PAGE, "sharecoord_rpc_latency_seconds_bucket", rpc="read", le="+Inf") == 5


def test_series_are_names_and_labels_without_values() -> None:
    found = series(PAGE)
    assert ("sharecoord_journal_bytes", frozenset()) in found
    assert (
        "sharecoord_rpc_requests_total",
        frozenset({("rpc", "read"), ("outcome", "ok")}),
    ) in found
    assert len(found) == 9
