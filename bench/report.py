"""The benchmark's report: a Markdown table, the JSON of every figure, a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        "# sharecoord benchmark",
        "",
        f"Run {results['started']} on {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['memory_gib']} GiB, Linux {machine['kernel']}, Python {machine['python']}; "
        f"{machine['filesystem']} with a 4 KiB append + fdatasync taking "
        f"{machine['fdatasync_ms']} ms. "
        f"{machine['pinning']}. The daemon's code: {machine.get('code', 'pure Python')}.",
        "",
        "## Requests (wrk over HTTP, bench/kafka_load.py to the Kafka listener; pgbench, "
        "redis-benchmark, bench.replay to the peers)",
        "",
        "| scenario | conc. | requests/s | share-partitions/s | p50 ms | p99 ms "
        "| server CPU | generator CPU | vs ceiling |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    # Each row against the ceiling of its own protocol: the Kafka listener's rows against
    # the null Kafka-protocol handler, the rest against aiohttp's.
    ceilings = {
        (r["name"], r["concurrency"]): r["requests_per_s"]
        for r in results["http"]
        if r["name"] in ("ceiling", "kafka ceiling")
    }
    for r in results["http"]:
        vs = ""
        kafka_protocol = r["name"].startswith(("sharecoord kafka", "kafka "))
        own = "kafka ceiling" if kafka_protocol else "ceiling"
        ceiling = ceilings.get((own, r["concurrency"]))
        is_ceiling = r["name"] in ("ceiling", "kafka ceiling")
        if not is_ceiling and ceiling and r["items_per_request"] == 1:
            vs = f"{r['requests_per_s'] / ceiling:.0%}"
        lines.append(
            f"| {r['name']} | {r['concurrency']} | {_fmt(r['requests_per_s'])} | "
            f"{_fmt(r['items_per_s'])} | {_fmt(r['p50_ms'], 2)} | {_fmt(r['p99_ms'], 2)} | "
            f"{r['server_cpu']:.0%} | {r['generator_cpu']:.0%} | {vs} |"
        )
    ratios = results.get("ratios", {})
    if ratios:
        lines += ["", "## Ratios", ""]
        lines += [f"* {name}: **{value:.2f}x**" for name, value in ratios.items()]
    lines += _open_loop_table(results.get("open_loop") or [])
    commit_rows = results.get("group_commit") or []
    if commit_rows:
        lines += [
            "",
            "## Group commit (bench/group_commit.py, in process)",
            "",
            "| way | dirty partitions | ms per cycle | flush p50 ms | flush p99 ms |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {row['way']} | {row['dirty_partitions']} | {row['ms_per_cycle']:.2f} | "
            f"{row['flush_median_ms']:.2f} | {row['flush_p99_ms']:.2f} |"
            for row in commit_rows
        ]
    entry_rows = results.get("entry_cost") or []
    if entry_rows:
        lines += [
            "",
            "## CPU per write entry (bench/entry_cost.py: decode, shard, frame, encode)",
            "",
            "| entries per request | entries | µs per entry |",
            "| ---: | ---: | ---: |",
        ]
        lines += [
            f"| {row['per_request']} | {_fmt(row['entries'])} | {row['us_per_entry']:.1f} |"
            for row in entry_rows
        ]
    for section in ("recovery", "spark"):
        rows = results.get(section) or []
        if not rows:
            continue
        lines += [
            "",
            f"## {section.capitalize()}",
            "",
            "| what | records | seconds | records/s | note |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for row in rows:
            lines.append(
                f"| {row['name']} | {_fmt(row['records'])} | {_fmt(row['seconds'], 2)} | "
                f"{_fmt(row['records_per_s'])} | {row.get('note', '')} |"
            )
    failover = results.get("failover")
    if failover:
        lines += [
            "",
            "## Failover (bench/cluster.py: two nodes on PostgreSQL)",
            "",
            "| what | runs | lease | p50 s | max s |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| {failover['name']} | {failover['runs']} | {failover['lease_ms']} ms | "
            f"{failover['p50_s']:.2f} | {failover['max_s']:.2f} |",
        ]
    for row in results.get("memory") or []:
        lines += [
            "",
            "## Memory",
            "",
            "| what | share-partitions | RSS empty | RSS loaded | bytes each | note |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
            f"| {row['name']} | {_fmt(row['share_partitions'])} | "
            f"{row['rss_empty_mib']:.0f} MiB | {row['rss_loaded_mib']:.0f} MiB | "
            f"{_fmt(row['bytes_per_share_partition'])} | {row.get('note', '')} |",
        ]
        if "full_collection_ms" in row:  # results saved before bench/gc_pause.py lack it
            lines += [
                "",
                f"A full garbage collection with that state loaded (bench/gc_pause.py): "
                f"{row['full_collection_ms']:.1f} ms, {_fmt(row['tracked_objects'])} objects "
                "tracked by the collector.",
            ]
    notes = results.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"* {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _open_loop_table(rows: list[dict[str, Any]]) -> list[str]:
    """Single writes at a fixed rate, sharecoord and the null server of each protocol
    at the same rates, in the same run."""
    if not rows:
        return []
    lines = [
        "",
        "## Latency at a fixed load (bench/open_loop.py: open loop, single writes, "
        "timed from each request's scheduled send)",
        "",
        "| server | protocol | load | offered req/s | answered req/s | p50 ms | p99 ms "
        "| p99.9 ms | errors | server CPU | writes per fsync | flushes > 1 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted(rows, key=lambda r: (r["protocol"], r["load_share"], r["name"])):
        cpu, per_fsync, slow = r.get("server_cpu"), r.get("writes_per_fsync"), r.get("slow_flushes")
        longest = r.get("longest_flush_ms")
        lines.append(
            f"| {r['name']} | {r['protocol']} | {r['load_share']:.0%} | "
            f"{_fmt(r['offered_per_s'])} | {_fmt(r['answered_per_s'])} | "
            f"{_fmt(r['p50_ms'], 2)} | {_fmt(r['p99_ms'], 2)} | {_fmt(r['p999_ms'], 2)} | "
            f"{r['errors']} | {'' if cpu is None else f'{cpu:.0%}'} | "
            f"{'' if per_fsync is None else _fmt(per_fsync, 1)} | "
            f"{_slow_flushes(slow, longest)} |"
        )
    if any(r.get("server_cpu") is not None for r in rows):
        lines += [
            "",
            "Server CPU is the server's share of its one core over the counted seconds; "
            "writes per fsync, sharecoord's requests per commit cycle over the run. Each "
            "commit cycle has a cost of its own whatever it carries, and at a lower rate "
            "fewer writes share one: the load column is a share of the maximum rate, the "
            "CPU column how busy that rate keeps the core. Flushes > 1 ms: the share of "
            "sharecoord's commit cycles whose journal write and fdatasync took over 1 ms "
            "as its event loop saw them (sharecoord_fsync_duration_seconds), and the "
            "bucket bound the longest one stayed within. The disk has "
            "slow spells, tens of milliseconds long, in which each of a flush's device "
            "requests takes several times its usual time, and a write waits for about two "
            "flushes: those spells reach the p99 (README, \"What bounds each figure\"). "
            "Near the maximum the column also counts the event loop's own delay in "
            "hearing that a flush ended.",
        ]
    return lines


def _slow_flushes(share: float | None, longest_ms: float | None) -> str:
    if share is None:
        return ""
    if longest_ms is None:
        return f"{share:.2%}"
    bound = "over the last bucket" if longest_ms == float("inf") else f"≤ {longest_ms:g} ms"
    return f"{share:.2%}, longest {bound}"


def chart(results: dict[str, Any], path: Path) -> None:
    # Imported here: matplotlib is slow to import and only the chart needs it.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [r for r in results["http"]]
    labels = [f"{r['name']}\nc={r['concurrency']}" for r in rows]
    values = [r["items_per_s"] for r in rows]
    colors = [_color(r["name"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.7), 5))
    ax.bar(range(len(rows)), values, color=colors)
    ax.set_yscale("log")
    ax.set_ylabel("share-partition writes (or reads) per second, log scale")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_title(f"sharecoord vs ceiling and peers ({results['machine']['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _color(name: str) -> str:
    """Grey ceiling, blue sharecoord, green Kafka's own coordinator; each other peer in a
    light (blind overwrite) and a dark (equal work) shade of its colour."""
    if name in ("ceiling", "kafka ceiling"):
        return "#888888"
    if name.startswith("sharecoord"):
        return "#1f77b4"
    if name.startswith("kafka "):
        return "#2ca02c"
    equal = "equal-work" in name
    if name.startswith("postgres"):
        return "#8c1010" if equal else "#d62728"
    return "#b35900" if equal else "#ff7f0e"


def save(results: dict[str, Any], directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": directory / "latest.json",
        "markdown": directory / "latest.md",
        "png": directory / "latest.png",
    }
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    paths["markdown"].write_text(markdown(results))
    chart(results, paths["png"])
    return paths
