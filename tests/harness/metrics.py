"""Reading a /metrics page: the one Prometheus text reader of the suite.

The page is parsed by prometheus_client's own parser
(``prometheus_client.parser.text_string_to_metric_families``), so a test reads what a
Prometheus server would. Samples keep the names the page gives them (a counter's
``..._total``, a histogram's ``..._bucket``, ``..._count`` and ``..._sum``).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Series = tuple[str, Labels]  # a sample's name and labels


def samples(text: str) -> dict[Series, float]:
    """Every sample of a page by name and labels (in any order), with its value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(text: str) -> set[Series]:
    """Every sample of a page by name and labels, its value left out."""
    return set(samples(text))


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly these labels (0 if it is not on the
    page, as a counter that never moved may not be)."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include these (any others too)."""
    wanted = set(labels.items())
    return sum(
        value
        for (sample, sample_labels), value in samples(text).items()
        if sample == name and wanted <= sample_labels
    )
