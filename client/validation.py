"""Checks made before an entry joins a shared request.

The daemon refuses a whole body (HTTP 400) for one ill-typed field (docs/api.md). Coalesced
requests carry the entries of many callers, so one caller's bad entry must never reach
the wire: every entry is checked here first, and one that the daemon would refuse
fails alone with INVALID_REQUEST (42) and a message naming the field. Checks the daemon
makes per entry (a negative partition, ``first_offset > last_offset``, an unknown
delivery state...) are left to it: they fail that entry alone anyway, with Kafka's text.
"""

from __future__ import annotations

import msgspec

from protocol.explain import first_problem
from protocol.messages import REQUEST_PARTITIONS, Rpc
from protocol.topic_id import canonical_topic_id


def check_group_id(group_id: object) -> str | None:
    """Why ``group_id`` cannot be sent, or None."""
    if type(group_id) is not str or not group_id:
        return f"group_id: expected a non-empty string, got {group_id!r}"
    try:
        group_id.encode("utf-8")
    except UnicodeEncodeError:
        return "group_id: not encodable as UTF-8 (a lone surrogate?)"
    return None


def check_topic_id(topic_id: object) -> tuple[str | None, str | None]:
    """``(canonical 22-char topic id, None)``, or ``(None, why not)``."""
    if type(topic_id) is not str:
        return None, f"topic_id: expected a string, got {type(topic_id).__name__}"
    try:
        return canonical_topic_id(topic_id), None
    except ValueError as exc:
        return None, f"topic_id {topic_id!r}: {exc}"


def check_entry(rpc: Rpc, entry: object, max_state_batches: int) -> str | None:
    """Why the partition entry cannot be sent for ``rpc``, or None: it is checked
    against the schema the daemon decodes it with (``protocol.messages``)."""
    expected = REQUEST_PARTITIONS[rpc]
    if type(entry) is not expected:
        return f"a {rpc.value} entry must be a {expected.__name__}, got {type(entry).__name__}"
    try:
        as_sent = msgspec.to_builtins(entry)
    except (msgspec.EncodeError, TypeError) as exc:
        return f"cannot be encoded: {exc}"
    problem = first_problem(as_sent, expected)
    if problem is not None:
        return str(problem)
    batches = getattr(entry, "state_batches", None)
    if batches is not None and len(batches) > max_state_batches:
        return (
            f"state_batches: {len(batches)} batches, more than the limit of "
            f"{max_state_batches} (max_state_batches_per_entry)"
        )
    return None
