"""The audit's page and chart, as a Kafka operator reads them (issue #14): delivery states
by name, every violation kind explained, the window covered, long ids shortened, and a
histogram on a numeric axis with the delivery limit drawn. No Spark: the page and the
chart are made from summary.json's document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spark_jobs.audit_report import (
    CHART_PNG,
    DETAIL_TABLE,
    INDEX_HTML,
    KINDS_EXPLAINED,
    draw_chart,
    render_page,
    short_id,
    write_chart,
)
from spark_jobs.auditor import (
    DELIVERY_COUNT_BACKWARDS,
    DELIVERY_LIMIT_AVAILABLE,
    START_OFFSET_BACKWARDS,
)

LONG_GROUP = "payments-settlement-consumers-" + "x" * 40 + "-eu-west-1"
HISTOGRAM = [
    {"group_id": LONG_GROUP, "delivery_count": 1, "offsets": 40},
    {"group_id": LONG_GROUP, "delivery_count": 7, "offsets": 3},
    {"group_id": "g", "delivery_count": 2, "offsets": 10},
]


def summary(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "data_dir": "/srv/sharecoord",
        "generated_at": "2026-11-23T12:00:00+00:00",
        "mode": "full",
        "history": "/srv/sharecoord/history",
        "delivery_limit": 5,
        "partitions": 2,
        "records": 120,
        "share_partitions": [],
        "violations": 1,
        "damaged": [],
        "violation_counts": {START_OFFSET_BACKWARDS: 1},
        "violation_sample": [],
        "histogram": HISTOGRAM,
        "most_redelivered": [
            {
                "group_id": LONG_GROUP,
                "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ",
                "partition": 0,
                "first_offset": 10,
                "last_offset": 12,
                "delivery_count": 7,
                "delivery_state": 4,
            },
            {
                "group_id": "g",
                "topic_id": "AAAAAAAAAAAAAAAAAAAAAQ",
                "partition": 1,
                "first_offset": 3,
                "last_offset": 3,
                "delivery_count": 2,
                "delivery_state": 2,
            },
        ],
        "windows": [
            {
                "state_partition": 0,
                "first_offset": 0,
                "last_offset": 119,
                "first_time": "2026-11-22T00:00:00+00:00",
                "last_time": "2026-11-23T11:59:00+00:00",
                "records": 100,
                "missing_offsets": 20,
                "gaps": [[0, 19]],
                "since": {},
            }
        ],
        "files": {"detail": DETAIL_TABLE, "chart": CHART_PNG, "page": INDEX_HTML},
    }
    document.update(changes)
    return document


def test_the_page_names_delivery_states_as_log_dump_does() -> None:
    page = render_page(summary())
    assert "<td>Archived</td>" in page and "<td>Acknowledged</td>" in page
    assert "<td>4</td>" not in page  # the numbers are gone from that column


def test_every_violation_kind_is_explained_even_when_none_was_found() -> None:
    page = render_page(summary())
    assert set(KINDS_EXPLAINED) == {
        DELIVERY_LIMIT_AVAILABLE,
        DELIVERY_COUNT_BACKWARDS,
        START_OFFSET_BACKWARDS,
    }
    for kind, (meaning, why, what) in KINDS_EXPLAINED.items():
        assert f"<td>{kind}</td>" in page
        for text in (meaning, why, what):
            assert text and text.replace("'", "&#x27;").split(":")[0] in page


def test_the_page_says_which_window_it_covered() -> None:
    page = render_page(summary())
    assert "<h2>Window covered</h2>" in page
    assert "<td>2026-11-22T00:00:00+00:00</td>" in page and "<td>119</td>" in page
    assert "<td>20</td>" in page  # missing offsets
    assert "/srv/sharecoord/history" in page
    assert "none kept" in render_page(summary(history=None))


def test_long_ids_are_shortened_on_the_page_whole_in_the_tooltip() -> None:
    short = short_id(LONG_GROUP)
    assert len(short) == 32 and short.startswith("payments-") and short.endswith("-west-1")
    assert short_id("g") == "g"
    page = render_page(summary())
    assert f'<td title="{LONG_GROUP}">{short}</td>' in page
    assert f">{LONG_GROUP}<" not in page


def test_the_histogram_has_a_numeric_axis_the_delivery_limit_and_headroom() -> None:
    figure, axes = plt.subplots()
    try:
        draw_chart(axes, HISTOGRAM, 5)
        bars = [patch for patch in axes.patches if patch.get_height() > 0]
        centres = sorted({round(bar.get_x() + bar.get_width() / 2, 3) for bar in bars})
        assert centres == [1, 2, 7]  # at their counts: 3..6 are empty, not squeezed out
        (limit,) = [line for line in axes.lines if line.get_linestyle() == "--"]
        assert limit.get_xdata()[0] == 4.5  # between 4 and 5: 5 is at the limit
        assert "delivery limit 5" in limit.get_label()
        assert axes.get_xlim()[1] >= 8
        assert axes.get_ylim()[1] > 43  # the tallest stack, 40 + 3 at most, has room above
        assert all(float(t).is_integer() for t in axes.get_xticks())
        labels = [text.get_text() for text in axes.get_legend().get_texts()]
        assert short_id(LONG_GROUP) in labels
    finally:
        plt.close(figure)


def test_the_chart_is_drawn_with_the_limit_beyond_every_count(tmp_path: Path) -> None:
    figure, axes = plt.subplots()
    try:
        draw_chart(axes, HISTOGRAM[:1], 5)
        assert axes.get_xlim()[1] >= 6  # the limit is on the chart though no count reaches it
    finally:
        plt.close(figure)
    write_chart(HISTOGRAM, str(tmp_path / CHART_PNG), 5)
    assert (tmp_path / CHART_PNG).read_bytes().startswith(b"\x89PNG")
