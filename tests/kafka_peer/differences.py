"""The differences between Kafka 4.4.0's share coordinator and sharecoord that the
differential test accepts: exactly the rows of the table in docs/semantics.md §A.2, each
recognised here from the request, both answers and the state both sides agreed on before.

``explain_entry`` names the documented difference that explains why one partition
result differs, or returns None: then the test fails and prints both answers.
``explain_state`` does the same for a share-partition whose state, read back after a
write with ReadShareGroupStateSummary, differs on the two sides.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# kind -> what Kafka does / what sharecoord does; the names are the first column of the
# table in docs/semantics.md §A.2 (``test_the_table_names_exactly_these_kinds`` checks).
KINDS = {
    "negative-epoch": "Kafka 4.4 refuses an epoch of -1; sharecoord keeps Kafka 4.2's exemptions",
    "entry-checks": "sharecoord's edge checks refuse values Kafka stores",
    "start-offset-backwards": "Kafka 4.4 keeps the larger start offset; sharecoord the write's",
    "delivery-complete-count": "Kafka 4.4 derives the count from how the start offset moved",
    "result-order": "Kafka answers in its own order; sharecoord in request order",
    "duplicate-entries": "Kafka runs one entry per share-partition; sharecoord runs each",
}
# Kinds after which the two sides no longer hold the same state for the key: the test
# deletes the key on both sides to bring them together again.
DIVERGING = {"negative-epoch", "entry-checks", "start-offset-backwards", "delivery-complete-count"}

SEMANTICS = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
NEGATIVE_TEXTS = {
    "The state epoch cannot be a negative number.": "state_epoch",
    "The leader epoch cannot be a negative number.": "leader_epoch",
}
# sharecoord's edge-check texts (docs/semantics.md §12).
_EDGE_TEXT = re.compile(
    r"^(\w+ must be -1 or greater, got -?\d+"
    r"|state_batches\[\d+\]: .*(must be|is greater than).*)$"
)


def documented_kinds() -> list[str]:
    """The kinds named in the first column of the table of docs/semantics.md §A.2."""
    text = SEMANTICS.read_text()
    section = text.split("### A.2", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.MULTILINE)


def outside_edge(rpc: str, entry: dict[str, Any]) -> bool:
    """Whether ``entry`` fails one of sharecoord's edge checks (docs/semantics.md §A)."""
    if entry["partition"] < 0:
        return False  # Kafka refuses it too, with the same answer
    fields = ("state_epoch", "leader_epoch", "start_offset", "delivery_complete_count")
    if any(entry.get(name, -1) < -1 for name in fields):
        return True
    return rpc == "write" and any(
        b["first_offset"] < 0
        or b["first_offset"] > b["last_offset"]
        or b["delivery_state"] not in (0, 1, 2, 4)
        or b["delivery_count"] < 0
        for b in entry["state_batches"]
    )


def explain_entry(
    rpc: str, entry: dict[str, Any], kafka: dict[str, Any], sharecoord: dict[str, Any]
) -> str | None:
    """The documented kind that explains why these two results of ``entry`` differ."""
    if (
        sharecoord["error_code"] == 42
        and _EDGE_TEXT.match(sharecoord["error_message"] or "")
        and outside_edge(rpc, entry)
    ):
        return "entry-checks"
    field = NEGATIVE_TEXTS.get(kafka.get("error_message") or "")
    if kafka["error_code"] == 42 and field is not None and entry.get(field, 0) == -1:
        return "negative-epoch"
    return None


def kafka_44_write(before: dict[str, Any], entry: dict[str, Any]) -> tuple[int, int]:
    """(start offset, delivery-complete count) after a successful write in Kafka 4.4:
    the start offset never goes back; the count is the larger of old and new while the
    start offset stays, the stored one when the write's start offset is behind, and the
    write's when it is ahead."""
    stored_start, stored_count = before["start_offset"], before["delivery_complete_count"]
    start, count = entry["start_offset"], entry.get("delivery_complete_count", -1)
    if start == stored_start:
        new_count = max(count, stored_count)
    elif start < stored_start:
        new_count = stored_count
    else:
        new_count = count
    return max(start, stored_start), new_count


def sharecoord_write(before: dict[str, Any], entry: dict[str, Any]) -> tuple[int, int]:
    """The same in sharecoord (Kafka 4.2's rules, docs/semantics.md §5.3, §15): -1 keeps
    the stored value, anything else replaces it."""
    start, count = entry["start_offset"], entry.get("delivery_complete_count", -1)
    return (
        before["start_offset"] if start == -1 else start,
        before["delivery_complete_count"] if count == -1 else count,
    )


def explain_state(
    before: dict[str, Any], entry: dict[str, Any], kafka: dict[str, Any], sharecoord: dict[str, Any]
) -> list[str] | None:
    """The kinds that explain why the summaries after a successful write of ``entry``
    differ, given the summary both sides agreed on ``before``; None if they do not."""
    expected_kafka = kafka_44_write(before, entry)
    expected_sharecoord = sharecoord_write(before, entry)
    seen_kafka = (kafka["start_offset"], kafka["delivery_complete_count"])
    seen_sharecoord = (sharecoord["start_offset"], sharecoord["delivery_complete_count"])
    same_rest = all(
        kafka[name] == sharecoord[name] for name in ("error_code", "state_epoch", "leader_epoch")
    )
    if not same_rest or (seen_kafka, seen_sharecoord) != (expected_kafka, expected_sharecoord):
        return None
    kinds = []
    if expected_kafka[0] != expected_sharecoord[0]:
        kinds.append("start-offset-backwards")
    if expected_kafka[1] != expected_sharecoord[1]:
        kinds.append("delivery-complete-count")
    return kinds or None
