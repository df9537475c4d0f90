"""Metrics in the Prometheus text exposition format 0.0.4, without a dependency.

A small registry of counters, gauges and histograms, each with optional label names;
``metric.labels(rpc="write")`` gives the child that holds the value. ``GET /metrics``
serves ``Registry.render()`` with ``CONTENT_TYPE``.

The hot path is ``inc()`` and ``observe()``: one attribute update, and for a histogram a
``bisect`` over its bucket bounds. No locks: everything runs on the event loop thread.
Callers on the hot path keep the child (``ok = requests.labels(rpc="write",
outcome="ok")``) rather than looking it up per call.

``ShareCoordinatorMetrics`` declares what the daemon exports (docs/semantics.md §13 and more).
"""

from __future__ import annotations

import abc
import logging
import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from typing import ClassVar, Generic, TypeVar

_log = logging.getLogger("sharecoord.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Labels = tuple[str, ...]
GaugeCollector = Callable[[], Iterable[tuple[Sequence[object], float]]]


# --- children: where the values live ----------------------------------------------------


class CounterChild:
    __slots__ = ("_function", "value")

    def __init__(self) -> None:
        self.value: float = 0
        self._function: Callable[[], float] | None = None

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function`` at every render instead: for counts kept as
        plain ints on a hot path, where even a method call per event adds up. The
        function must only ever go up."""
        self._function = function

    def get(self) -> float:
        return self._function() if self._function is not None else self.value


class GaugeChild:
    __slots__ = ("_function", "value")

    def __init__(self) -> None:
        self.value: float = 0
        self._function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self.value = value

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function`` at every render instead."""
        self._function = function

    def get(self) -> float:
        return self._function() if self._function is not None else self.value


class HistogramChild:
    __slots__ = ("_counts", "_sum", "_upper_bounds")

    def __init__(self, upper_bounds: list[float]) -> None:
        self._upper_bounds = upper_bounds
        self._counts = [0] * (len(upper_bounds) + 1)  # the last one is +Inf
        self._sum: float = 0

    def observe(self, value: float) -> None:
        # bucket i counts values <= upper_bounds[i] (and above the previous bound)
        self._counts[bisect_left(self._upper_bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    @property
    def sum(self) -> float:
        return self._sum

    def cumulative_counts(self) -> list[int]:
        total, cumulative = 0, []
        for count in self._counts:
            total += count
            cumulative.append(total)
        return cumulative


# --- metric families ---------------------------------------------------------------------

C = TypeVar("C", CounterChild, GaugeChild, HistogramChild)


class _Metric(abc.ABC, Generic[C]):
    type_name: ClassVar[str]
    reserved_labels: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} for {name}")
            if label in self.reserved_labels:
                raise ValueError(f"label name {label!r} is reserved in a {self.type_name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"repeated label name in {name}: {labelnames}")
        self.name = name
        self.doc = doc
        self.labelnames: Labels = tuple(labelnames)
        self._children: dict[Labels, C] = {}
        self._unlabelled: C | None = self.labels() if not labelnames else None

    @abc.abstractmethod
    def _new_child(self) -> C:
        """A child holding this family's value for one set of label values."""

    def labels(self, *values: object, **named: object) -> C:
        """The child for these label values (created at first use)."""
        if named:
            if values or named.keys() != set(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {named}")
            key = tuple(str(named[label]) for label in self.labelnames)
        else:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def remove(self, *values: object) -> None:
        """Forget the child of these label values (e.g. a partition no longer owned)."""
        self._children.pop(tuple(str(value) for value in values), None)

    @property
    def _only(self) -> C:
        if self._unlabelled is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use .labels()")
        return self._unlabelled

    @abc.abstractmethod
    def samples(self) -> Iterator[tuple[str, Labels, Labels, float]]:
        """(name suffix, label names, label values, value) of every sample."""


class Counter(_Metric[CounterChild]):
    type_name = "counter"

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1) -> None:
        self._only.inc(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        self._only.set_function(function)

    def samples(self) -> Iterator[tuple[str, Labels, Labels, float]]:
        for values, child in self._children.items():
            yield "", self.labelnames, values, child.get()


class Gauge(_Metric[GaugeChild]):
    type_name = "gauge"

    def __init__(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labelnames)
        self._collector: GaugeCollector | None = None

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def set(self, value: float) -> None:
        self._only.set(value)

    def inc(self, amount: float = 1) -> None:
        self._only.inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._only.dec(amount)

    def set_function(self, function: Callable[[], float]) -> None:
        self._only.set_function(function)

    def set_collector(self, collector: GaugeCollector) -> None:
        """Read ``(label values, value)`` pairs from ``collector`` at every render, for
        label sets only known then; they come after the children's samples."""
        self._collector = collector

    def samples(self) -> Iterator[tuple[str, Labels, Labels, float]]:
        for values, child in self._children.items():
            try:
                value = child.get()
            except Exception:
                _log.exception(
                    "gauge %s%s: its function failed; sample left out", self.name, values
                )
                continue
            yield "", self.labelnames, values, value
        if self._collector is not None:
            try:
                collected = [(tuple(map(str, v)), value) for v, value in self._collector()]
            except Exception:
                _log.exception("gauge %s: its collector failed; samples left out", self.name)
                return
            for values, value in collected:
                if len(values) != len(self.labelnames):
                    _log.error("gauge %s: collector gave labels %s; left out", self.name, values)
                    continue
                yield "", self.labelnames, values, value


class Histogram(_Metric[HistogramChild]):
    type_name = "histogram"
    reserved_labels = frozenset({"le"})

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] == math.inf:
            bounds.pop()
        if not bounds or any(not math.isfinite(b) for b in bounds):
            raise ValueError(f"{name}: buckets must be finite numbers (+Inf is implied)")
        if any(a >= b for a, b in pairwise(bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing")
        self.upper_bounds = bounds
        self._le = [_format_value(b) for b in bounds] + ["+Inf"]
        super().__init__(name, doc, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.upper_bounds)

    def observe(self, value: float) -> None:
        self._only.observe(value)

    def samples(self) -> Iterator[tuple[str, Labels, Labels, float]]:
        names = (*self.labelnames, "le")
        for values, child in self._children.items():
            cumulative = child.cumulative_counts()
            for le, count in zip(self._le, cumulative, strict=True):
                yield "_bucket", names, (*values, le), count
            yield "_sum", self.labelnames, values, child.sum
            yield "_count", self.labelnames, values, cumulative[-1]


Metric = Counter | Gauge | Histogram
M = TypeVar("M", Counter, Gauge, Histogram)


class Registry:
    """The metrics one ``/metrics`` page shows, in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def register(self, metric: M) -> M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, doc, labelnames))

    def gauge(self, name: str, doc: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, doc, labelnames))

    def histogram(
        self, name: str, doc: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return self.register(Histogram(name, doc, labelnames, buckets=buckets))

    def render(self) -> str:
        """Every metric in the text exposition format 0.0.4."""
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.append(f"# HELP {metric.name} {_escape_help(metric.doc)}")
            lines.append(f"# TYPE {metric.name} {metric.type_name}")
            for suffix, names, values, value in metric.samples():
                if names:
                    pairs = ",".join(
                        f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)
                    )
                    lines.append(f"{metric.name}{suffix}{{{pairs}}} {_format_value(value)}")
                else:
                    lines.append(f"{metric.name}{suffix} {_format_value(value)}")
        return "\n".join(lines) + "\n" if lines else ""


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, int):  # bool included: True renders as 1
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


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
    """The metrics of one daemon, all named ``sharecoord_*``.

    Counters and histograms are updated by the code that sees the event; the per-partition
    gauges read the runtime and the log at scrape time (``track_partition``). Kafka's
    ``write-rate``/``write-total`` are ``rate()``/the value of ``shard_writes``;
    ``write-latency-avg/max`` is ``rpc_latency{rpc="write"}``; ``last-pruned-offset`` is
    ``last_pruned_offset``.
    """

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else Registry()
        r = self.registry
        self.rpc_requests = r.counter(
            "sharecoord_rpc_requests_total",
            "RPC requests by rpc and outcome: ok, or the request-level error code "
            "(42 malformed body, 31 unauthorized, ...).",
            ("rpc", "outcome"),
        )
        self.partition_results = r.counter(
            "sharecoord_partition_results_total",
            "Partition entries answered, by rpc and error code (0 = success).",
            ("rpc", "error_code"),
        )
        self.rpc_latency = r.histogram(
            "sharecoord_rpc_latency_seconds",
            "Time from a request's arrival to its answer, by rpc.",
            ("rpc",),
            buckets=LATENCY_BUCKETS,
        )
        self.shard_writes = r.counter(
            "sharecoord_shard_writes_total",
            "Kafka's write-total: writes handled by a shard, failed ones included, plus "
            "reads that record a leader epoch; rate() of it is Kafka's write-rate.",
        )
        self.fsync_latency = r.histogram(
            "sharecoord_fsync_duration_seconds",
            "Time to write and fdatasync a group commit's journal record: the one flush "
            "that makes every partition of the cycle durable.",
            buckets=LATENCY_BUCKETS,
        )
        self.group_commit_partitions = r.histogram(
            "sharecoord_group_commit_partitions",
            "State partitions made durable together by one group commit cycle.",
            buckets=COMMIT_SIZE_BUCKETS,
        )
        self.checkpoint_duration = r.histogram(
            "sharecoord_checkpoint_duration_seconds",
            "Time a checkpoint took to fsync the partition files written since the last "
            "one and record CHECKPOINT.",
            buckets=LATENCY_BUCKETS,
        )
        self.journal_bytes = r.gauge(
            "sharecoord_journal_bytes",
            "Journal bytes no checkpoint has freed yet (writes are refused past "
            "journal_max_bytes).",
        )
        self.records_appended = r.counter(
            "sharecoord_records_appended_total",
            "Records appended to the log, by state partition.",
            ("partition",),
        )
        self.bytes_appended = r.counter(
            "sharecoord_bytes_appended_total",
            "Bytes appended to the log (frames included), by state partition.",
            ("partition",),
        )
        self.keys = r.gauge(
            "sharecoord_keys",
            "Share-partition keys with state, by state partition.",
            ("partition",),
        )
        self.partition_status = r.gauge(
            "sharecoord_partition_status",
            "1 for the state partition's current status (loading, active, failed), 0 for "
            "the others.",
            ("partition", "status"),
        )
        self.log_start_offset = r.gauge(
            "sharecoord_log_start_offset",
            "First offset still in the log, by state partition.",
            ("partition",),
        )
        self.log_end_offset = r.gauge(
            "sharecoord_log_end_offset",
            "Offset the next record will get, by state partition.",
            ("partition",),
        )
        self.log_segments = r.gauge(
            "sharecoord_log_segments", "Segment files, by state partition.", ("partition",)
        )
        self.log_bytes = r.gauge(
            "sharecoord_log_bytes", "Bytes of segment files, by state partition.", ("partition",)
        )
        self.last_pruned_offset = r.gauge(
            "sharecoord_last_pruned_offset",
            "Kafka's last-pruned-offset: the offset below which the last successful prune "
            "deleted the log, by state partition.",
            ("partition",),
        )
        self.load_duration = r.gauge(
            "sharecoord_partition_load_duration_seconds",
            "Duration of the last load (replay) of the state partition.",
            ("partition",),
        )
        self.http_errors = r.counter(
            "sharecoord_http_error_responses_total",
            "HTTP answers with a 4xx or 5xx status, by status.",
            ("status",),
        )
        # The Kafka listener (--kafka-listener): families of their own, so that the
        # HTTP ones keep their meaning.
        self.kafka_requests = r.counter(
            "sharecoord_kafka_requests_total",
            "Requests on the Kafka listener by api (Kafka's name), version and outcome: "
            "ok, or closed (malformed, refused before authentication, over a limit).",
            ("api", "version", "outcome"),
        )
        self.kafka_latency = r.histogram(
            "sharecoord_kafka_request_latency_seconds",
            "Kafka listener: time from a request's last byte to its answer being written, "
            "by api.",
            ("api",),
            buckets=LATENCY_BUCKETS,
        )
        self.kafka_connections = r.gauge(
            "sharecoord_kafka_connections", "Open connections on the Kafka listener."
        )
        self.kafka_closed = r.counter(
            "sharecoord_kafka_connections_closed_total",
            "Kafka listener connections the daemon closed, by reason (malformed, "
            "unsupported, unauthenticated, authentication_failed, too_large, idle, "
            "slow_reader, shutdown).",
            ("reason",),
        )

    def track_partition(
        self,
        partition: int,
        *,
        status: Callable[[], str],
        keys: Callable[[], float],
        log_start_offset: Callable[[], float],
        log_end_offset: Callable[[], float],
        segments: Callable[[], float],
        size_bytes: Callable[[], float],
    ) -> None:
        """Read a state partition's gauges from these functions at every scrape."""
        for name in PARTITION_STATUSES:
            self.partition_status.labels(partition, name).set_function(_is(status, name))
        self.keys.labels(partition).set_function(keys)
        self.log_start_offset.labels(partition).set_function(log_start_offset)
        self.log_end_offset.labels(partition).set_function(log_end_offset)
        self.log_segments.labels(partition).set_function(segments)
        self.log_bytes.labels(partition).set_function(size_bytes)

    def untrack_partition(self, partition: int) -> None:
        """Drop a state partition's gauges (it is no longer served here)."""
        for name in PARTITION_STATUSES:
            self.partition_status.remove(partition, name)
        for gauge in (
            self.keys,
            self.log_start_offset,
            self.log_end_offset,
            self.log_segments,
            self.log_bytes,
            self.last_pruned_offset,
            self.load_duration,
        ):
            gauge.remove(partition)

    def render(self) -> str:
        return self.registry.render()


def _is(status: Callable[[], str], name: str) -> Callable[[], float]:
    return lambda: 1 if status() == name else 0
