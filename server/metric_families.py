"""The metric families ``server.metrics`` builds the daemon's exports from, beyond
``prometheus_client``'s own (why each exists: the docstring of ``server.metrics``).

* ``LoopCounter`` and ``LoopHistogram``: families of every request, whose children
  (``CounterChild``, ``HistogramChild``) are plain numbers updated on the event loop's
  one thread, without ``prometheus_client``'s lock.
* ``FunctionFamily``: a family of values that exist anyway, read by functions at scrape
  time (``FunctionSlot`` is one labelled series of it).
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, pairwise
from typing import Generic, Literal, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

_log = logging.getLogger("sharecoord.metrics")


# --- per-request families: plain numbers, updated on the event loop only -----------------


class CounterChild:
    """One label set of a per-request counter."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float = 0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class HistogramChild:
    """One label set of a per-request histogram: a count per bucket (the last one is
    +Inf), made cumulative only when scraped."""

    __slots__ = ("_counts", "_sum", "_upper_bounds")

    def __init__(self, upper_bounds: list[float]) -> None:
        self._upper_bounds = upper_bounds
        self._counts = [0] * (len(upper_bounds) + 1)
        self._sum: float = 0

    def observe(self, value: float) -> None:
        # bucket i counts the values <= upper_bounds[i] and above the bound before it
        self._counts[bisect_left(self._upper_bounds, value)] += 1
        self._sum += value

    @property
    def sum(self) -> float:
        return self._sum

    def cumulative_counts(self) -> list[int]:
        return list(accumulate(self._counts))


C = TypeVar("C", CounterChild, HistogramChild)


class LoopFamily(ABC, Generic[C]):
    """A per-request counter or histogram family (the module docstring says why it is
    not prometheus_client's): children by label values, exposed by ``collect``."""

    def __init__(self, name: str, doc: str, labelnames: Sequence[str], make: Callable[[], C]):
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self._make: Callable[[], C] = make
        self._children: dict[tuple[str, ...], C] = {}

    def labels(self, *values: object) -> C:
        """The child of these label values, created at first use."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._make()
        return child

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    @abstractmethod
    def _family(self) -> Metric:
        """The family, without samples (what ``describe`` gives the registry)."""

    @abstractmethod
    def collect(self) -> Iterable[Metric]:
        """The family with a sample per child."""


class LoopCounter(LoopFamily[CounterChild]):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str]) -> None:
        super().__init__(name, doc, labelnames, CounterChild)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.doc, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for values, child in self._children.items():
            family.add_metric(values, child.value)
        return [family]


class LoopHistogram(LoopFamily[HistogramChild]):
    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        bounds = [float(b) for b in buckets if b != math.inf]
        if not bounds or any(a >= b for a, b in pairwise(bounds)):
            raise ValueError(f"{name}: buckets must be finite and strictly increasing")
        self.upper_bounds = bounds
        self._le = [_le(b) for b in bounds] + ["+Inf"]
        super().__init__(name, doc, labelnames, lambda: HistogramChild(bounds))

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for values, child in self._children.items():
            buckets = list(zip(self._le, child.cumulative_counts(), strict=True))
            family.add_metric(list(values), buckets, child.sum)
        return [family]


# --- values read at scrape time ------------------------------------------------------------


class FunctionSlot:
    """One label set of a ``FunctionFamily``: where its value is read from."""

    __slots__ = ("function",)

    def __init__(self) -> None:
        self.function: Callable[[], float] | None = None

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function`` at every scrape. For a counter it must only
        ever go up."""
        self.function = function


class FunctionFamily:
    """A counter or gauge family whose samples are read from functions at scrape time
    (a custom collector). A function that raises leaves its sample out and is logged:
    one broken reading must not cost the whole scrape."""

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str] = (),
        *,
        kind: Literal["counter", "gauge"],
    ) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self.kind = kind
        self._slots: dict[tuple[str, ...], FunctionSlot] = {}
        # Built once here, so that a bad name or label fails at declaration.
        self._family()

    def _family(self) -> CounterMetricFamily | GaugeMetricFamily:
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        return GaugeMetricFamily(self.name, self.doc, labels=self.labelnames)

    def labels(self, *values: object) -> FunctionSlot:
        """The slot of these label values, created at first use."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(value) for value in values)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = FunctionSlot()
        return slot

    def set_function(self, function: Callable[[], float]) -> None:
        """The value of a family without labels."""
        self.labels().set_function(function)

    def remove(self, *values: object) -> None:
        """Forget the slot of these label values (a partition no longer served here)."""
        self._slots.pop(tuple(str(value) for value in values), None)

    def describe(self) -> Iterable[Metric]:
        # The registry learns the names from this, without calling any function.
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for values, slot in list(self._slots.items()):
            if slot.function is None:
                continue
            try:
                value = float(slot.function())
            except Exception:
                _log.exception(
                    "metric %s%s: its function failed; sample left out", self.name, values
                )
                continue
            family.add_metric(values, value)
        return [family]


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes its own (``1.0``, ``0.0001``)."""
    return repr(float(bound))
