"""What issue 15 asked the operator's documents to say, kept from silently going away in
an edit: README's section on how a share-partition leader reaches sharecoord (all three
ways, and that a stock Kafka broker cannot be pointed at it), and docs/operations.md's
sections on what has no replica, backup, restore, upgrade, repair and moving partitions.
The wording may change; the headings and the facts checked here may not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def section(path: Path, heading: str) -> str:
    """The text under `heading` (a markdown heading's exact text) up to the next heading
    of the same or a higher level; lines in code fences are never headings."""
    lines = path.read_text().splitlines()
    fenced, start, level = False, None, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"(#+) (.*)$", line)
        if match is None:
            continue
        if start is None and match[2] == heading:
            start, level = i + 1, len(match[1])
        elif start is not None and len(match[1]) <= level:
            return "\n".join(lines[start:i])
    assert start is not None, f"{path.name}: no heading {heading!r}"
    return "\n".join(lines[start:])


def test_readme_says_how_a_share_partition_leader_reaches_sharecoord():
    text = " ".join(
        section(ROOT / "README.md", "How a share-partition leader uses sharecoord").split()
    )
    assert "HTTP API" in text and "/v1/share-group-state/" in text
    assert "Python client" in text and "client/" in text
    assert "--kafka-listener" in text
    assert "A stock Apache Kafka broker cannot be pointed at sharecoord" in text
    assert "persister" in text


@pytest.mark.parametrize(
    ("heading", "facts"),
    [
        (
            "No replication: what a lost node or disk means",
            ["exactly one node's disk", "no standby copy", "The disk is lost"],
        ),
        ("What to monitor", ["/readyz", "sharecoord_partition_status"]),
        ("Backup", ["# sharecoord-backup DATA BACKUP", "journal"]),
        ("Restore", ["log verify", "OWNER"]),
        ("Upgrading the on-disk format", ['"format"', "OWNER"]),
        ("Repairing a damaged partition", ["log verify", "partition adopt"]),
        ("Moving a state partition", ["partition export", "partition import", "journal"]),
        ("What a refusal means", ["was created by node N", "is missing"]),
    ],
)
def test_operations_covers(heading, facts):
    text = " ".join(section(ROOT / "docs" / "operations.md", heading).split())
    for fact in facts:
        assert fact in text, (heading, fact)
