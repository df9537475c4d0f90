"""Checks made before an entry joins a shared request.

The daemon refuses a whole body (HTTP 400) for one ill-typed field (docs/api.md). Coalesced
requests carry the entries of many callers, so one caller's bad entry must never reach
the wire: every entry is checked here first, and one that the daemon would refuse
fails alone with INVALID_REQUEST (42) and a message naming the field. Checks the daemon
makes per entry (a negative partition, ``first_offset > last_offset``, an unknown
delivery state...) are left to it: they fail that entry alone anyway, with Kafka's text.
"""

from __future__ import annotations

from typing import Any

from protocol.messages import (
    DeletePartition,
    InitializePartition,
    ReadPartition,
    ReadSummaryPartition,
    Rpc,
    WritePartition,
)
from protocol.topic_id import canonical_topic_id

_INT8 = ("int8", -(2**7), 2**7 - 1)
_INT16 = ("int16", -(2**15), 2**15 - 1)
_INT32 = ("int32", -(2**31), 2**31 - 1)
_INT64 = ("int64", -(2**63), 2**63 - 1)

ENTRY_TYPES: dict[Rpc, type[Any]] = {
    Rpc.INITIALIZE: InitializePartition,
    Rpc.READ: ReadPartition,
    Rpc.WRITE: WritePartition,
    Rpc.DELETE: DeletePartition,
    Rpc.READ_SUMMARY: ReadSummaryPartition,
}

# The integer fields of each RPC's partition entry and their widths (docs/api.md).
_FIELDS: dict[Rpc, tuple[tuple[str, tuple[str, int, int]], ...]] = {
    Rpc.INITIALIZE: (("partition", _INT32), ("state_epoch", _INT32), ("start_offset", _INT64)),
    Rpc.READ: (("partition", _INT32), ("leader_epoch", _INT32)),
    Rpc.WRITE: (
        ("partition", _INT32),
        ("state_epoch", _INT32),
        ("leader_epoch", _INT32),
        ("start_offset", _INT64),
        ("delivery_complete_count", _INT32),
    ),
    Rpc.DELETE: (("partition", _INT32),),
    Rpc.READ_SUMMARY: (("partition", _INT32), ("leader_epoch", _INT32)),
}
_BATCH_FIELDS = (
    ("first_offset", _INT64),
    ("last_offset", _INT64),
    ("delivery_state", _INT8),
    ("delivery_count", _INT16),
)


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
    """Why the partition entry cannot be sent for ``rpc``, or None."""
    expected = ENTRY_TYPES[rpc]
    if not isinstance(entry, expected):
        return f"a {rpc.value} entry must be a {expected.__name__}, got {type(entry).__name__}"
    for name, width in _FIELDS[rpc]:
        problem = _check_int(name, getattr(entry, name), width)
        if problem:
            return problem
    if rpc is Rpc.WRITE:
        return _check_batches(entry.state_batches, max_state_batches)
    return None


def _check_batches(batches: object, max_state_batches: int) -> str | None:
    if not isinstance(batches, (list, tuple)):
        return f"state_batches: expected a list, got {type(batches).__name__}"
    if len(batches) > max_state_batches:
        return (
            f"state_batches: {len(batches)} batches, more than the limit of "
            f"{max_state_batches} (max_state_batches_per_entry)"
        )
    for i, batch in enumerate(batches):
        if not isinstance(batch, tuple) or len(batch) != len(_BATCH_FIELDS):
            return f"state_batches[{i}]: expected a StateBatch, got {batch!r}"
        for (name, width), value in zip(_BATCH_FIELDS, batch, strict=True):
            problem = _check_int(f"state_batches[{i}].{name}", value, width)
            if problem:
                return problem
    return None


def _check_int(name: str, value: object, width: tuple[str, int, int]) -> str | None:
    kind, lo, hi = width
    if type(value) is not int:
        return f"{name}: expected an integer, got {value!r}"
    if not lo <= value <= hi:
        return f"{name}: {value} is outside the {kind} range"
    return None
