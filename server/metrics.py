"""The daemon's metrics, served by ``GET /metrics`` in the Prometheus text format 0.0.4,
through ``prometheus_client``.

Two kinds of families, chosen by where the value lives:

* **Events**, counted by the code that sees them: fsync and checkpoint times, HTTP
  errors, prune marks, load times, the Kafka listener's connections. These are
  ``prometheus_client``'s ``Counter``, ``Gauge`` and ``Histogram`` in the daemon's own
  ``CollectorRegistry`` (never the process-wide default one: tests build many daemons in
  one process).
* **Events of every request**: requests, entry results and latencies, HTTP's and the
  Kafka listener's. ``prometheus_client`` takes a lock for every ``inc()`` and
  ``observe()`` and scans the buckets one by one; measured, that is 6 times the cost of
  a plain update (``inc`` 320-350 ns against 56, ``observe`` 750-900 ns against 141, about
  1.2 µs more per request, some 1.5% of the CPU of the cheapest request). Every update
  here happens on the event loop's one thread, which needs no lock, so these families
  keep their values in plain numbers (``CounterChild``, ``HistogramChild``) and are
  exposed by ``LoopFamily``, a custom collector. Callers look their child up once
  (``ok = requests.labels("write", "ok")``) and only call ``inc()`` / ``observe()``.
* **Values that exist anyway**: counts the runtime keeps as plain ints on its hot path
  (records and bytes appended, Kafka's write-total) and what the runtime and the log
  know (keys, status, offsets, segments, bytes, journal bytes). Updating a metric per
  append would only copy them; ``FunctionFamily`` is a custom collector that calls the
  functions registered for it at scrape time and builds the family then.

The ``_created`` series ``prometheus_client`` adds to counters and histograms by default
are switched off: they are not part of what ``/metrics`` has promised
(docs/operations.md#metrics), and a scrape should not double the number of series.

``ShareCoordinatorMetrics`` declares every family the daemon exports, with the names,
types and label names documented in docs/operations.md#metrics; the custom families are
in ``server.metric_families``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from collections.abc import Callable, Sequence
from typing import Literal

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from server.metric_families import (
    FunctionFamily,
    LoopCounter,
    LoopHistogram,
)

_log = logging.getLogger("sharecoord.metrics")

# The exposition format generate_latest writes; prometheus_client's CONTENT_TYPE_LATEST
# names a newer text version now, which this output does not claim to be.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# --- what the daemon exports ---------------------------------------------------------------

# Seconds, 100 µs to 10 s: an fsync on a good SSD is ~0.1-2 ms, a slow disk or a busy
# group commit shows up in the upper buckets.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# State partitions fsynced together in one group commit cycle.
COMMIT_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PARTITION_STATUSES = ("loading", "active", "failed")


class ShareCoordinatorMetrics:
    """The metrics of one daemon, all named ``sharecoord_*``, in one registry.

    Kafka's ``write-rate``/``write-total`` are ``rate()``/the value of ``shard_writes``;
    ``write-latency-avg/max`` is ``rpc_latency{rpc="write"}``; ``last-pruned-offset`` is
    ``last_pruned_offset``. The order of declaration is the order of the page.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rpc_requests = self._loop_counter(
            "sharecoord_rpc_requests_total",
            "RPC requests by rpc and outcome: ok, or the request-level error code "
            "(42 malformed body, 31 unauthorized, ...).",
            ("rpc", "outcome"),
        )
        self.partition_results = self._loop_counter(
            "sharecoord_partition_results_total",
            "Partition entries answered, by rpc and error code (0 = success).",
            ("rpc", "error_code"),
        )
        self.rpc_latency = self._loop_histogram(
            "sharecoord_rpc_latency_seconds",
            "Time from a request's arrival to its answer, by rpc.",
            ("rpc",),
            LATENCY_BUCKETS,
        )
        self.shard_writes = self._function(
            "sharecoord_shard_writes_total",
            "Kafka's write-total: writes handled by a shard, failed ones included, plus "
            "reads that record a leader epoch; rate() of it is Kafka's write-rate.",
            kind="counter",
        )
        self.fsync_latency = self._histogram(
            "sharecoord_fsync_duration_seconds",
            "Time to write and fdatasync a group commit's journal record: the one flush "
            "that makes every partition of the cycle durable.",
            (),
            LATENCY_BUCKETS,
        )
        self.group_commit_partitions = self._histogram(
            "sharecoord_group_commit_partitions",
            "State partitions made durable together by one group commit cycle.",
            (),
            COMMIT_SIZE_BUCKETS,
        )
        self.checkpoint_duration = self._histogram(
            "sharecoord_checkpoint_duration_seconds",
            "Time a checkpoint took to fsync the partition files written since the last "
            "one and record CHECKPOINT.",
            (),
            LATENCY_BUCKETS,
        )
        self.journal_bytes = self._function(
            "sharecoord_journal_bytes",
            "Journal bytes no checkpoint has freed yet (writes are refused past "
            "journal_max_bytes).",
            kind="gauge",
        )
        self.records_appended = self._function(
            "sharecoord_records_appended_total",
            "Records appended to the log, by state partition.",
            ("partition",),
            kind="counter",
        )
        self.bytes_appended = self._function(
            "sharecoord_bytes_appended_total",
            "Bytes appended to the log (frames included), by state partition.",
            ("partition",),
            kind="counter",
        )
        self.keys = self._function(
            "sharecoord_keys",
            "Share-partition keys with state, by state partition.",
            ("partition",),
            kind="gauge",
        )
        self.keys_unfolded = self._function(
            "sharecoord_keys_unfolded",
            "Keys a load left for the background fold to merge, by state partition: 0 "
            "once the partition's state is all in its final form.",
            ("partition",),
            kind="gauge",
        )
        self.partition_status = self._function(
            "sharecoord_partition_status",
            "1 for the state partition's current status (loading, active, failed), 0 for "
            "the others.",
            ("partition", "status"),
            kind="gauge",
        )
        self.log_start_offset = self._function(
            "sharecoord_log_start_offset",
            "First offset still in the log, by state partition.",
            ("partition",),
            kind="gauge",
        )
        self.log_end_offset = self._function(
            "sharecoord_log_end_offset",
            "Offset the next record will get, by state partition.",
            ("partition",),
            kind="gauge",
        )
        self.log_segments = self._function(
            "sharecoord_log_segments",
            "Segment files, by state partition.",
            ("partition",),
            kind="gauge",
        )
        self.log_bytes = self._function(
            "sharecoord_log_bytes",
            "Bytes of segment files, by state partition.",
            ("partition",),
            kind="gauge",
        )
        self.last_pruned_offset = self._gauge(
            "sharecoord_last_pruned_offset",
            "Kafka's last-pruned-offset: the offset below which the last successful prune "
            "deleted the log, by state partition.",
            ("partition",),
        )
        self.load_duration = self._gauge(
            "sharecoord_partition_load_duration_seconds",
            "Duration of the last load (replay) of the state partition.",
            ("partition",),
        )
        self.event_loop_lag = self._loop_histogram(
            "sharecoord_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 10 ms: how long something held "
            "it (a long request, a scrape, the garbage collector) while others waited.",
            (),
            LATENCY_BUCKETS,
        )
        self.gc_collections = self._function(
            "sharecoord_gc_collections_total",
            "Collections run by Python's cyclic garbage collector in the daemon's process, "
            "by generation (0 young, 2 full); each holds the event loop while it walks "
            "its generation.",
            ("generation",),
            kind="counter",
        )
        for generation in range(3):
            self.gc_collections.labels(generation).set_function(
                functools.partial(_gc_collections, generation)
            )
        self.http_errors = self._counter(
            "sharecoord_http_error_responses_total",
            "HTTP answers with a 4xx or 5xx status, by status.",
            ("status",),
        )
        # The Kafka listener (--kafka-listener): families of their own, so that the
        # HTTP ones keep their meaning.
        self.kafka_requests = self._loop_counter(
            "sharecoord_kafka_requests_total",
            "Requests on the Kafka listener by api (Kafka's name, or unknown), version "
            "(unsupported for one outside the api's range) and outcome: ok, "
            "unsupported_version (an ApiVersions too new) or closed (malformed, refused "
            "before authentication, over a limit).",
            ("api", "version", "outcome"),
        )
        self.kafka_latency = self._loop_histogram(
            "sharecoord_kafka_request_latency_seconds",
            "Kafka listener: time from a request's last byte to its answer being written, by api.",
            ("api",),
            LATENCY_BUCKETS,
        )
        self.kafka_connections = self._gauge(
            "sharecoord_kafka_connections", "Open connections on the Kafka listener.", ()
        )
        self.kafka_closed = self._counter(
            "sharecoord_kafka_connections_closed_total",
            "Kafka listener connections the daemon closed, by reason (malformed, "
            "unsupported, unauthenticated, authentication_failed, too_large, idle, "
            "slow_reader, internal, shutdown).",
            ("reason",),
        )
        self.kafka_refused = self._counter(
            "sharecoord_kafka_connections_refused_total",
            "Kafka listener connections cut off as they came because "
            "kafka_max_connections were open.",
            (),
        )
        # The PostgreSQL store's leases (server/leadership.py); absent on the local store.
        self.partitions_led = self._function(
            "sharecoord_partitions_led",
            "On the PostgreSQL store: state partitions this node holds the lease of.",
            kind="gauge",
        )
        self.partitions_without_leader = self._function(
            "sharecoord_partitions_without_leader",
            "On the PostgreSQL store: state partitions whose lease had expired (or that "
            "had none) and that this node did not hold, at its last lease round: a dead "
            "node's partitions until someone claims them.",
            kind="gauge",
        )
        self.takeovers = self._function(
            "sharecoord_takeovers_total",
            "On the PostgreSQL store: state partitions this node claimed after another "
            "node's lease on them expired.",
            kind="counter",
        )

    # prometheus_client's classes register themselves when given the registry.

    def _counter(self, name: str, doc: str, labels: Sequence[str]) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str]) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def _histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def _loop_counter(self, name: str, doc: str, labels: Sequence[str]) -> LoopCounter:
        family = LoopCounter(name, doc, labels)
        self.registry.register(family)
        return family

    def _loop_histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> LoopHistogram:
        family = LoopHistogram(name, doc, labels, buckets)
        self.registry.register(family)
        return family

    def _function(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        *,
        kind: Literal["counter", "gauge"],
    ) -> FunctionFamily:
        family = FunctionFamily(name, doc, labels, kind=kind)
        self.registry.register(family)
        return family

    def track_partition(
        self,
        partition: int,
        *,
        status: Callable[[], str],
        keys: Callable[[], float],
        keys_unfolded: Callable[[], float],
        log_start_offset: Callable[[], float],
        log_end_offset: Callable[[], float],
        segments: Callable[[], float],
        size_bytes: Callable[[], float],
    ) -> None:
        """Read a state partition's gauges from these functions at every scrape."""
        for name in PARTITION_STATUSES:
            self.partition_status.labels(partition, name).set_function(_is(status, name))
        self.keys.labels(partition).set_function(keys)
        self.keys_unfolded.labels(partition).set_function(keys_unfolded)
        self.log_start_offset.labels(partition).set_function(log_start_offset)
        self.log_end_offset.labels(partition).set_function(log_end_offset)
        self.log_segments.labels(partition).set_function(segments)
        self.log_bytes.labels(partition).set_function(size_bytes)

    def track_leadership(
        self,
        *,
        led: Callable[[], float],
        without_leader: Callable[[], float],
        takeovers: Callable[[], float],
    ) -> None:
        """On leases (the PostgreSQL store): what this node leads and sees of the others."""
        self.partitions_led.set_function(led)
        self.partitions_without_leader.set_function(without_leader)
        self.takeovers.set_function(takeovers)

    def untrack_partition(self, partition: int) -> None:
        """Drop a state partition's series (it is no longer served here)."""
        for name in PARTITION_STATUSES:
            self.partition_status.remove(partition, name)
        for family in (
            self.keys,
            self.keys_unfolded,
            self.log_start_offset,
            self.log_end_offset,
            self.log_segments,
            self.log_bytes,
            self.records_appended,
            self.bytes_appended,
        ):
            family.remove(partition)
        for gauge in (self.last_pruned_offset, self.load_duration):
            with contextlib.suppress(KeyError):  # never set: nothing to drop
                gauge.remove(str(partition))

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


def _is(status: Callable[[], str], name: str) -> Callable[[], float]:
    return lambda: 1 if status() == name else 0


def _gc_collections(generation: int) -> float:
    collections: int = gc.get_stats()[generation]["collections"]
    return collections
