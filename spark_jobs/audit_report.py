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
from dataclasses import asdict
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.audit import AuditReport

SUMMARY_JSON = "summary.json"
DETAIL_TABLE = "violations.parquet"
CHART_PNG = "delivery_counts.png"
INDEX_HTML = "index.html"
SAMPLE_ROWS = 100  # violations shown in summary.json and on the page; all are in the table
CHART_GROUPS = 8  # groups drawn by name; the rest are summed as "other groups"


def write_report(report: AuditReport, out_dir: str) -> str:
    """Write summary.json, the chart and the page; return the page's path."""
    summary = summary_document(report)
    with open(os.path.join(out_dir, SUMMARY_JSON), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    write_chart(report.histogram, os.path.join(out_dir, CHART_PNG))
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


def write_chart(histogram: Sequence[dict[str, Any]], path: str) -> None:
    """A bar chart of offsets per delivery count, stacked by group."""
    import matplotlib  # noqa: PLC0415 - the backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    totals: dict[str, int] = {}
    for row in histogram:
        totals[row["group_id"]] = totals.get(row["group_id"], 0) + row["offsets"]
    named = sorted(totals, key=lambda g: (-totals[g], g))[:CHART_GROUPS]
    counts = sorted({row["delivery_count"] for row in histogram})
    series: dict[str, dict[int, int]] = {group: {} for group in named}
    for row in histogram:
        group = row["group_id"] if row["group_id"] in named else "other groups"
        bars = series.setdefault(group, {})
        bars[row["delivery_count"]] = bars.get(row["delivery_count"], 0) + row["offsets"]
    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=100)
    try:
        positions = list(range(len(counts)))
        bottom = [0] * len(counts)
        for group, bars in series.items():
            heights = [bars.get(c, 0) for c in counts]
            axes.bar(positions, heights, bottom=bottom, label=group)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        axes.set_xticks(positions, [str(c) for c in counts])
        axes.set_xlabel("delivery count")
        axes.set_ylabel("offsets")
        axes.set_title("Delivery counts of the offsets in the state log")
        if series:
            axes.legend(fontsize="small")
        else:
            axes.text(0.5, 0.5, "no offsets in the log", ha="center", transform=axes.transAxes)
        figure.tight_layout()
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)


def render_page(summary: dict[str, Any]) -> str:
    files = summary["files"]
    facts = [
        ("data directory", summary["data_dir"]),
        ("generated at", summary["generated_at"]),
        ("delivery limit", summary["delivery_limit"]),
        ("state partitions", summary["partitions"]),
        ("records replayed", summary["records"]),
        ("share-partitions", len(summary["share_partitions"])),
        ("violations", summary["violations"]),
        ("unreadable partitions", len(summary["damaged"])),
    ]
    verdict = "violations found" if summary["violations"] or summary["damaged"] else "clean"
    sections = [
        f"<h1>sharecoord audit: {_text(verdict)}</h1>",
        _table(["fact", "value"], facts),
        f'<p>Files: <a href="{_text(files["detail"])}">{_text(files["detail"])}</a> '
        f'(every violation, Parquet), <a href="{SUMMARY_JSON}">{SUMMARY_JSON}</a>.</p>',
        "<h2>Violations by kind</h2>",
        _table(["kind", "violations"], sorted(summary["violation_counts"].items())),
        f"<h2>Violations (first {SAMPLE_ROWS})</h2>",
        _dict_table(summary["violation_sample"]),
        "<h2>Unreadable partitions</h2>",
        _dict_table(summary["damaged"]),
        "<h2>Delivery counts</h2>",
        f'<img src="{_text(files["chart"])}" alt="delivery-count histogram">',
        _dict_table(summary["histogram"]),
        "<h2>Most redelivered offsets</h2>",
        _dict_table(summary["most_redelivered"]),
        "<h2>Share-partitions</h2>",
        _dict_table(summary["share_partitions"]),
    ]
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>sharecoord audit</title>\n'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
        "margin:0.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}"
        "</style></head><body>\n"
        f"{body}\n</body></html>\n"
    )


def _dict_table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    columns = list(rows[0])
    return _table(columns, [[row.get(c) for c in columns] for row in rows])


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_text(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_text(v)}</td>" for v in row) + "</tr>\n" for row in rows
    )
    return f"<table><tr>{head}</tr>\n{body}</table>"


def _text(value: Any) -> str:
    return html.escape("" if value is None else str(value))
