"""Names and manifest of the compaction staging area, DATA/partitions/<p>/compaction/.

The compaction job stages `<base>.cleaned` (frames of the usual format) and then
`<base>.manifest`, a JSON document naming the segments the cleaned file replaces:

    {"format": 1, "base_offset": 0,
     "replaced": [{"name": "00000000000000000000.log", "size": 1048576,
                   "last_frame_crc": 305419896}, ...]}

`last_frame_crc` is null for an empty segment. `<base>` is the base offset of the first
replaced segment, written as 20 digits like a segment name. The swap itself (swap.py)
renames the cleaned file to `DATA/partitions/<p>/<base>.swap`, then to `<base>.log`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from persistence.fileops import FileOps, read_file

STAGING_DIR = "compaction"
CLEANED_SUFFIX = ".cleaned"
MANIFEST_SUFFIX = ".manifest"
SWAP_SUFFIX = ".swap"
LOG_SUFFIX = ".log"
TEMP_SUFFIX = ".tmp"
MANIFEST_FORMAT = 1
BASE_DIGITS = 20


def base_name(base_offset: int) -> str:
    return f"{base_offset:0{BASE_DIGITS}d}"


def parse_base(file_name: str, suffix: str) -> int | None:
    """The base offset of `<20 digits><suffix>`, else None. ASCII digits only: "²" is a
    digit to str.isdigit, but no number to int()."""
    if not file_name.endswith(suffix):
        return None
    stem = file_name[: -len(suffix)]
    if len(stem) != BASE_DIGITS or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem)


def staging_dir(partition_dir: str) -> str:
    return os.path.join(partition_dir, STAGING_DIR)


def cleaned_path(partition_dir: str, base_offset: int) -> str:
    return os.path.join(staging_dir(partition_dir), base_name(base_offset) + CLEANED_SUFFIX)


def manifest_path(partition_dir: str, base_offset: int) -> str:
    return os.path.join(staging_dir(partition_dir), base_name(base_offset) + MANIFEST_SUFFIX)


def swap_path(partition_dir: str, base_offset: int) -> str:
    return os.path.join(partition_dir, base_name(base_offset) + SWAP_SUFFIX)


@dataclass(frozen=True, slots=True)
class SegmentFingerprint:
    """What the swap checks to know a replaced segment is still the one the job read."""

    name: str
    size: int
    last_frame_crc: int | None
    # Where the last frame starts: lets an offline commit check the fingerprint by
    # reading one frame instead of the whole segment. None in older manifests.
    last_frame_at: int | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    base_offset: int
    replaced: tuple[SegmentFingerprint, ...]

    def to_json(self) -> bytes:
        document = {
            "format": MANIFEST_FORMAT,
            "base_offset": self.base_offset,
            "replaced": [
                {
                    "name": s.name,
                    "size": s.size,
                    "last_frame_crc": s.last_frame_crc,
                    "last_frame_at": s.last_frame_at,
                }
                for s in self.replaced
            ],
        }
        return json.dumps(document, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> Manifest:
        try:
            document: Any = json.loads(raw)
            if document["format"] != MANIFEST_FORMAT:
                raise ValueError(f"format {document['format']!r}, expected {MANIFEST_FORMAT}")
            replaced = tuple(
                SegmentFingerprint(
                    str(s["name"]), int(s["size"]), s["last_frame_crc"], s.get("last_frame_at")
                )
                for s in document["replaced"]
            )
            return cls(int(document["base_offset"]), replaced)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a valid compaction manifest: {exc!r}") from None


def read_manifest(fs: FileOps, path: str) -> Manifest:
    return Manifest.from_json(read_file(fs, path), path)
