"""The ``EXPORT`` manifest of a partition export, and the checks every field of it
passes before an import writes anything (docs/operations.md#moving-a-state-partition).

``sharecoord partition export`` writes it, pretty-printed JSON, format 1:

    field             JSON type          rule
    format            integer            1
    partition         integer            0 .. num_partitions - 1
    num_partitions    integer            1 .. 10000 (the source's; the target's must agree)
    source_node       integer or null    -1 .. 2^31-1 (-1, null: not known)
    assignment        string             the source's cluster map fingerprint
    exported_ms       integer            >= 0
    log_start_offset  integer            0 .. 2^63-1: the first segment's base offset
    log_end_offset    integer            log_start_offset .. 2^63-1: the next offset
    records           integer            0 .. log_end_offset - log_start_offset
    segments          array, >= 1 item   {"name", "size", "crc32"}: name as the segment
                                         file (`<20 digits>.log`), base offsets rising
                                         from log_start_offset, none above
                                         log_end_offset; size 0 .. 2^63-1; crc32
                                         0 .. 2^32-1 (of the whole file)
    history           array (optional)   {"path", "size", "crc32"}: path below the
                                         history root, in this partition's own part of
                                         it (`state_partition=P/...` or `_exports/P/...`),
                                         no `.`, `..` or empty part; each path once

Every field is required but ``history`` (exports made before it travelled lack it); no
other field is allowed, at any level. An integer is never a JSON ``true`` or ``false``
(Python's bool is an int: checked apart) nor a float. Whatever breaks a rule is a
``ManifestError`` naming the field, what it holds and what was expected: an import
refuses such an export before it reads a segment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from persistence.history import EXPORTS_DIR
from persistence.ownership import UNKNOWN
from persistence.segments import segment_name
from persistence.staging import LOG_SUFFIX, parse_base
from server.cluster import MAX_PARTITIONS

EXPORT_FILE = "EXPORT"
HISTORY_DIR = "history"  # in an export: the partition's history, as below its root
EXPORT_FORMAT = 1
# Far above any manifest an export writes (about 100 bytes a file), far below a read
# that would hurt: a larger file is refused unread.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_UINT32_MAX = 2**32 - 1
_SHOWN_CHARS = 60


class ManifestError(ValueError):
    """A field of the manifest breaks the format (the module docstring): one line."""


@dataclass(frozen=True)
class SegmentCopy:
    name: str
    size: int
    crc32: int

    @property
    def base_offset(self) -> int:
        base = parse_base(self.name, LOG_SUFFIX)
        assert base is not None, "checked when the manifest was read"
        return base


@dataclass(frozen=True)
class HistoryCopy:
    """One file of the partition's history: its path below the history root (and below
    the export's ``history`` directory), size and CRC-32."""

    path: str
    size: int
    crc32: int


@dataclass(frozen=True)
class ExportManifest:
    partition: int
    num_partitions: int
    source_node: int | None
    assignment: str
    exported_ms: int
    log_start_offset: int
    log_end_offset: int
    records: int
    segments: tuple[SegmentCopy, ...]
    # Empty when the source kept no history (and in exports made before it travelled).
    history: tuple[HistoryCopy, ...] = ()

    def to_json(self) -> bytes:
        document = {"format": EXPORT_FORMAT, **asdict(self)}
        return json.dumps(document, indent=1).encode() + b"\n"


def read_manifest(directory: str) -> ExportManifest:
    """The manifest of the export in ``directory``, every field checked. Raises OSError
    when it cannot be read, ManifestError when it breaks the format."""
    with open(os.path.join(directory, EXPORT_FILE), "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"more than {MAX_MANIFEST_BYTES} bytes, far more than an export writes")
    return parse_manifest(data)


def parse_manifest(data: bytes) -> ExportManifest:
    try:
        document: Any = json.loads(data)
    except RecursionError:
        raise ManifestError("its JSON is nested too deeply to be a manifest") from None
    except ValueError as exc:  # not UTF-8 is a ValueError too
        raise ManifestError(f"not JSON: {exc}") from None
    fields = _object(document, "the manifest", _REQUIRED, ("history",))
    version = fields["format"]
    if not _is_int(version) or version != EXPORT_FORMAT:
        raise ManifestError(
            f"format is {_shown(version)}; this version reads format {EXPORT_FORMAT} exports"
        )
    num_partitions = _integer(fields, "num_partitions", 1, MAX_PARTITIONS)
    partition = _integer(
        fields,
        "partition",
        0,
        num_partitions - 1,
        f"the export's num_partitions is {num_partitions}",
    )
    source_node = fields["source_node"]
    if source_node is not None:
        source_node = _integer(fields, "source_node", UNKNOWN, _INT32_MAX, "or null")
    assignment = fields["assignment"]
    if not isinstance(assignment, str):
        raise ManifestError(f"assignment is {_shown(assignment)}; expected a string")
    exported_ms = _integer(fields, "exported_ms", 0, _INT64_MAX)
    start = _integer(fields, "log_start_offset", 0, _INT64_MAX)
    end = _integer(fields, "log_end_offset", start, _INT64_MAX, "at least log_start_offset")
    records = _integer(
        fields, "records", 0, end - start, "at most log_end_offset - log_start_offset"
    )
    segments = _segments(fields["segments"], start, end)
    history = _history(fields.get("history", []), partition)
    return ExportManifest(
        partition,
        num_partitions,
        source_node,
        assignment,
        exported_ms,
        start,
        end,
        records,
        segments,
        history,
    )


_REQUIRED = (
    "format",
    "partition",
    "num_partitions",
    "source_node",
    "assignment",
    "exported_ms",
    "log_start_offset",
    "log_end_offset",
    "records",
    "segments",
)


def _segments(value: object, start: int, end: int) -> tuple[SegmentCopy, ...]:
    items = _array(value, "segments")
    if not items:
        raise ManifestError("segments is []; an export holds at least one segment")
    copies = []
    previous = None
    for index, item in enumerate(items):
        where = f"segments[{index}]"
        fields = _object(item, where, ("name", "size", "crc32"))
        name = fields["name"]
        base = parse_base(name, LOG_SUFFIX) if isinstance(name, str) else None
        if base is None or name != segment_name(base):
            raise ManifestError(
                f"{where}.name is {_shown(name)}; expected a segment file name, 20 digits and .log"
            )
        if previous is None and base != start:
            raise ManifestError(
                f"{where}.name is {name!r}; the first segment's base offset is "
                f"log_start_offset, {start}"
            )
        if previous is not None and not previous < base <= end:
            raise ManifestError(
                f"{where}.name is {name!r}; expected base offsets rising from "
                f"log_start_offset {start}, none above log_end_offset {end}"
            )
        previous = base
        size = _integer(fields, "size", 0, _INT64_MAX, where=where)
        crc32 = _integer(fields, "crc32", 0, _UINT32_MAX, where=where)
        copies.append(SegmentCopy(name, size, crc32))
    return tuple(copies)


def _history(value: object, partition: int) -> tuple[HistoryCopy, ...]:
    copies = []
    seen = set()
    for index, item in enumerate(_array(value, "history")):
        where = f"history[{index}]"
        fields = _object(item, where, ("path", "size", "crc32"))
        path = fields["path"]
        _check_history_path(path, partition, where)
        assert isinstance(path, str)
        if path in seen:
            raise ManifestError(f"{where}.path is {_shown(path)}, listed twice")
        seen.add(path)
        size = _integer(fields, "size", 0, _INT64_MAX, where=where)
        crc32 = _integer(fields, "crc32", 0, _UINT32_MAX, where=where)
        copies.append(HistoryCopy(path, size, crc32))
    return tuple(copies)


def _check_history_path(path: object, partition: int, where: str) -> None:
    """A history path of the manifest names a file of this partition's history, below
    the root: an export cannot make an import write anywhere else."""
    if not isinstance(path, str):
        raise ManifestError(f"{where}.path is {_shown(path)}; expected a string")
    parts = path.split("/")
    mine = (f"state_partition={partition}",), (EXPORTS_DIR, str(partition))
    if (
        os.path.isabs(path)
        or "\x00" in path
        or any(part in ("", ".", "..") for part in parts)
        or not any(tuple(parts[: len(prefix)]) == prefix for prefix in mine)
        or len(parts) < 3
    ):
        raise ManifestError(
            f"{where}.path is {_shown(path)}; expected a file of state partition {partition}'s "
            f"history (below state_partition={partition}/ or {EXPORTS_DIR}/{partition}/)"
        )


# --- the shapes -------------------------------------------------------------------------


def _object(
    value: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{where} is {_shown(value)}; expected a JSON object")
    for name in required:
        if name not in value:
            raise ManifestError(f"{where} has no {name!r}")
    for name in value:
        if name not in required and name not in optional:
            raise ManifestError(
                f"{where} has {_shown(name)}, which format {EXPORT_FORMAT} does not know "
                f"(it has {', '.join(required + optional)})"
            )
    return value


def _array(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestError(f"{where} is {_shown(value)}; expected a JSON array")
    return value


def _integer(
    fields: Mapping[str, Any], name: str, low: int, high: int, why: str = "", where: str = ""
) -> int:
    value = fields[name]
    if _is_int(value) and low <= value <= high:
        return int(value)
    field = f"{where}.{name}" if where else name
    top = "2^63-1" if high == _INT64_MAX else str(high)
    because = f" ({why})" if why else ""
    raise ManifestError(f"{field} is {_shown(value)}; expected an integer {low}..{top}{because}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A value as the JSON it was (`true`, not `True`), cut short."""
    text = json.dumps(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
