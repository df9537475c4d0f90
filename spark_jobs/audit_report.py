"""The audit's report files, written by the driver from what it collected:

summary.json          everything below, as data
violations.parquet/   the detail table: one row per violation (written by Spark)
delivery_counts.png   the delivery-count histogram, offsets per count and group
index.html            a page showing the chart and the tables of summary.json
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from protocol.batches import state_name
from protocol.records import GROUP_ID, STATE_PARTITION

SUMMARY_JSON = "summary.json"
DETAIL_TABLE = "violations.parquet"
CHART_PNG = "delivery_counts.png"
INDEX_HTML = "index.html"
SAMPLE_ROWS = 100  # violations shown in summary.json and on the page; all are in the table
CHART_GROUPS = 8  # groups drawn by name; the rest are summed as "other groups"
ID_CHARS = 32  # ids longer than this are shortened on the page and in the chart (not in JSON)

# What each violation kind means, why an operator cares, and what to do: shown on the page.
KINDS_EXPLAINED: dict[str, tuple[str, str, str]] = {
    "delivery_limit_available": (
        "Offsets are Available (to be delivered again) although their delivery count has "
        "reached the delivery limit (group.share.delivery.count.limit).",
        "Kafka should have archived them: a poison record is handed to consumers again and "
        "again instead of being given up on.",
        "Check that the brokers and the audit use the same delivery limit (--delivery-limit); "
        "then look at the share-partition's writes around the log offset (sharecoord log dump "
        "--partition P) and at the broker that wrote them (its leader epoch).",
    ),
    "delivery_count_backwards": (
        "An offset's delivery count went down within one state epoch.",
        "Delivery counts only grow until the state is reset (a new state epoch): a lower count "
        "means a write lost track of deliveries, so the delivery limit may never be reached.",
        "Find the record at the log offset and the one before it for the share-partition; a "
        "stale leader (older leader epoch) writing after a newer one is the usual cause.",
    ),
    "start_offset_backwards": (
        "A share-partition's start offset went down within one state epoch.",
        "Records below the start offset count as done; moving it back makes consumers receive "
        "records that were already acknowledged or archived.",
        "Compare the record at the log offset with the previous one for the same share-partition "
        "(leader epoch, write time); an admin reset should come with a new state epoch.",
    ),
}


@dataclass
class AuditReport:
    """What the driver collected (spark_jobs/audit.py), for the report files."""

    data_dir: str
    delivery_limit: int
    partitions: int
    records: int
    damaged: list[dict[str, Any]]
    violation_counts: dict[str, int]
    violation_sample: list[dict[str, Any]]
    histogram: list[dict[str, Any]]
    most_redelivered: list[dict[str, Any]]
    share_partitions: list[dict[str, Any]]
    mode: str = "full"  # or "since last": only the records after the previous run's
    history: str | None = None  # where the history read came from, None if none is kept
    windows: list[dict[str, Any]] = field(default_factory=list)  # per state partition
    earlier_violations: dict[str, int] = field(default_factory=dict)  # earlier runs'
    runs: int = 1

    @property
    def violations(self) -> int:
        return sum(self.violation_counts.values())


def write_report(report: AuditReport, out_dir: str) -> str:
    """Write summary.json, the chart and the page; return the page's path."""
    summary = summary_document(report)
    with open(os.path.join(out_dir, SUMMARY_JSON), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    write_chart(report.histogram, os.path.join(out_dir, CHART_PNG), report.delivery_limit)
    page = os.path.join(out_dir, INDEX_HTML)
    with open(page, "w", encoding="utf-8") as f:
        f.write(render_page(summary))
    return page


def summary_document(report: AuditReport) -> dict[str, Any]:
    document = asdict(report)
    document["violations"] = report.violations
    document["generated_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    document["files"] = {"detail": DETAIL_TABLE, "chart": CHART_PNG, "page": INDEX_HTML}
    return document


def write_chart(
    histogram: Sequence[dict[str, Any]], path: str, delivery_limit: int | None = None
) -> None:
    """A bar chart of offsets per delivery count, stacked by group, on a numeric x-axis
    with the delivery limit drawn as a line."""
    import matplotlib  # noqa: PLC0415 - the backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=100)
    try:
        draw_chart(axes, histogram, delivery_limit)
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)


def draw_chart(axes: Any, histogram: Sequence[dict[str, Any]], delivery_limit: int | None) -> None:
    """The histogram on matplotlib axes: bars at their delivery count (a numeric axis),
    stacked by group, the delivery limit a dashed line, some headroom above."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    totals: dict[str, int] = {}
    group_id = GROUP_ID.name
    for row in histogram:
        totals[row[group_id]] = totals.get(row[group_id], 0) + row["offsets"]
    named = sorted(totals, key=lambda g: (-totals[g], g))[:CHART_GROUPS]
    counts = sorted({row["delivery_count"] for row in histogram})
    series: dict[str, dict[int, int]] = {group: {} for group in named}
    for row in histogram:
        group = row[group_id] if row[group_id] in named else "other groups"
        bars = series.setdefault(group, {})
        bars[row["delivery_count"]] = bars.get(row["delivery_count"], 0) + row["offsets"]
    bottom = [0] * len(counts)
    for group, bars in series.items():
        heights = [bars.get(c, 0) for c in counts]
        axes.bar(counts, heights, bottom=bottom, width=0.8, label=short_id(group))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    right = max([*counts, delivery_limit or 0, 1]) + 1
    axes.set_xlim(-0.5 if 0 in counts else 0.5, right)
    axes.set_ylim(0, max(bottom, default=0) * 1.15 or 1)
    if delivery_limit is not None:
        axes.axvline(
            delivery_limit - 0.5, color="#c00000", linestyle="--", linewidth=1.5,
            label=f"delivery limit {delivery_limit}: counts from here should be Archived",
        )  # fmt: skip
    axes.set_xlabel("delivery count")
    axes.set_ylabel("offsets")
    axes.set_title("Delivery counts of the offsets in the state log")
    if series:
        axes.legend(fontsize="small")
    else:
        axes.text(0.5, 0.5, "no offsets in the log", ha="center", transform=axes.transAxes)


def render_page(summary: dict[str, Any]) -> str:
    files = summary["files"]
    facts = [
        ("data directory", summary["data_dir"]),
        ("generated at", summary["generated_at"]),
        ("mode", summary.get("mode", "full")),
        ("history", summary.get("history") or "none kept: folded records are not audited"),
        ("delivery limit", summary["delivery_limit"]),
        ("state partitions", summary["partitions"]),
        ("records replayed", summary["records"]),
        ("share-partitions", len(summary["share_partitions"])),
        ("violations", summary["violations"]),
        ("unreadable partitions", len(summary["damaged"])),
    ]
    verdict = "violations found" if summary["violations"] or summary["damaged"] else "clean"
    counts = summary["violation_counts"]
    kinds = [
        [kind, counts.get(kind, 0), *KINDS_EXPLAINED.get(kind, ("", "", ""))]
        for kind in sorted(set(KINDS_EXPLAINED) | set(counts))
    ]
    sections = [
        f"<h1>sharecoord audit: {_text(verdict)}</h1>",
        _table(["fact", "value"], facts),
        f'<p>Files: <a href="{_text(files["detail"])}">{_text(files["detail"])}</a> '
        f'(every violation, Parquet), <a href="{SUMMARY_JSON}">{SUMMARY_JSON}</a>.</p>',
        "<h2>Window covered</h2>",
        "<p>The offsets and record times this audit saw per state partition. Missing "
        "offsets were folded or pruned before a history kept them, or expired from it: "
        "nothing in them was checked.</p>",
        _dict_table([_window_row(w) for w in summary.get("windows", [])]),
        "<h2>Violations by kind</h2>",
        _table(["kind", "violations", "what it means", "why it matters", "what to do"], kinds),
        f"<h2>Violations (first {SAMPLE_ROWS})</h2>",
        _dict_table(summary["violation_sample"]),
        "<h2>Unreadable partitions</h2>",
        _dict_table(summary["damaged"]),
        "<h2>Delivery counts</h2>",
        f'<img src="{_text(files["chart"])}" alt="delivery-count histogram">',
        _dict_table(summary["histogram"]),
        "<h2>Most redelivered offsets</h2>",
        _dict_table(
            [
                {**row, "delivery_state": state_name(row["delivery_state"])}
                for row in summary["most_redelivered"]
            ]
        ),
        "<h2>Share-partitions</h2>",
        _dict_table(summary["share_partitions"]),
    ]
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>sharecoord audit</title>\n'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
        "margin:0.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:left;"
        "vertical-align:top}</style></head><body>\n"
        f"{body}\n</body></html>\n"
    )


def _window_row(window: dict[str, Any]) -> dict[str, Any]:
    return {
        "state partition": window[STATE_PARTITION.name],
        "first offset": window["first_offset"],
        "last offset": window["last_offset"],
        "first record": window["first_time"],
        "last record": window["last_time"],
        "records": window["records"],
        "missing offsets": window["missing_offsets"],
    }


def short_id(value: str, limit: int = ID_CHARS) -> str:
    """A long group or topic id shortened for the page: its start and end, "…" between."""
    if len(value) <= limit:
        return value
    head = (limit - 1) * 2 // 3
    return value[:head] + "\u2026" + value[-(limit - 1 - head) :]


def _dict_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    columns = list(rows[0])
    return _table(columns, [[row.get(c) for c in columns] for row in rows])


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_text(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(map(_cell, row)) + "</tr>\n" for row in rows)
    return f"<table><tr>{head}</tr>\n{body}</table>"


def _cell(value: Any) -> str:
    """A table cell; a long string is shortened, the whole of it in the tooltip."""
    if isinstance(value, str) and len(value) > ID_CHARS and " " not in value:
        return f'<td title="{_text(value)}">{_text(short_id(value))}</td>'
    return f"<td>{_text(value)}</td>"


def _text(value: Any) -> str:
    return html.escape("" if value is None else str(value))
