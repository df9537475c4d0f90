"""The compaction swap: replacing sealed segments by the job's cleaned output, crash-safe
at every step (after Kafka's log cleaner).

Staging, by the compaction job (write_staged), in DATA/partitions/<p>/compaction/:
  1. write `<base>.cleaned`, fdatasync it, fsync the staging directory;
  2. write `<base>.manifest` (temp, fsync, rename, fsync the directory).

Commit, by whoever holds DATA/LOCK (commit_staged), after checking that the manifest's
segments are still there, unchanged, consecutive and sealed (else the staged output is
stale: it is deleted, logged, and nothing else happens):
  3. fsync `<base>.cleaned`;
  4. rename it to `DATA/partitions/<p>/<base>.swap` and fsync both directories:
     THE COMMIT POINT. Before it the old segments are the log; after it the swap file is;
  5. delete the replaced segments, fsync the partition directory;
  6. rename `<base>.swap` to `<base>.log`, fsync the partition directory;
  7. delete the manifest, fsync the staging directory.

Recovery (recover_staging, run by PartitionLog.open):
  - a `<base>.swap`: steps 5-7 again (deleting only replaced segments still present);
  - a `.cleaned` without its manifest: staging never finished (1), delete it;
  - a `.cleaned` with its manifest: staged (2), left for the committer;
  - a manifest alone: the swap finished (6) or the output was dropped; delete it;
  - a `*.tmp`: a manifest that was never renamed into place; delete it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from persistence.errors import LogCorruptionError, LogError
from persistence.fileops import FileOps, unlink_if_exists, write_file_atomically
from persistence.frame import FrameError, LogRecord, decode_frame, encode_frame, frame_crc
from persistence.segments import (
    SegmentState,
    fingerprint_segment,
    list_log_files,
    scan_partition,
    scan_segment,
    segment_name,
    segment_path,
)
from persistence.staging import (
    CLEANED_SUFFIX,
    MANIFEST_SUFFIX,
    SWAP_SUFFIX,
    TEMP_SUFFIX,
    Manifest,
    SegmentFingerprint,
    base_name,
    cleaned_path,
    manifest_path,
    parse_base,
    read_manifest,
    staging_dir,
    swap_path,
)

_log = logging.getLogger("sharecoord.log")
_DEFAULT_FS = FileOps()
_WRITE_CHUNK = 1 << 20

CommitOutcome = Literal["committed", "stale"]


class SwapIncompleteError(LogError):
    """The swap failed after its commit point: the disk holds a half-done swap that
    recovery (PartitionLog.open or reset_to_durable) finishes."""


# -- the compaction job's side ----------------------------------------------------------


def write_staged(
    partition_dir: str | os.PathLike[str],
    base: int,
    frames_or_records: Iterable[bytes | LogRecord],
    replaced_segments: Sequence[str | os.PathLike[str] | SegmentFingerprint],
    *,
    fs: FileOps | None = None,
) -> str:
    """Stage a compacted segment replacing `replaced_segments` (paths, whose fingerprints
    are read here, or fingerprints the caller took while reading them). Records must come
    in increasing offset order, none below `base`. Returns the cleaned file's path."""
    partition_dir = os.fspath(partition_dir)
    fs = fs or _DEFAULT_FS
    fingerprints = tuple(
        item if isinstance(item, SegmentFingerprint) else fingerprint_segment(os.fspath(item), fs)
        for item in replaced_segments
    )
    if not fingerprints or fingerprints[0].name != segment_name(base):
        raise ValueError(f"the first replaced segment must be {segment_name(base)}")
    stage = staging_dir(partition_dir)
    if not fs.exists(stage):
        fs.mkdir(stage)
        fs.fsync_dir(partition_dir)
    manifest_file = manifest_path(partition_dir, base)
    if fs.exists(manifest_file):
        raise FileExistsError(f"{manifest_file}: output is already staged at this base")
    cleaned = cleaned_path(partition_dir, base)
    fd = fs.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        chunk: list[bytes] = []
        chunk_bytes = 0
        for frame in _checked_frames(frames_or_records, base):
            chunk.append(frame)
            chunk_bytes += len(frame)
            if chunk_bytes >= _WRITE_CHUNK:
                fs.write_all(fd, b"".join(chunk))
                chunk, chunk_bytes = [], 0
        fs.write_all(fd, b"".join(chunk))
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(stage)
    write_file_atomically(fs, manifest_file, Manifest(base, fingerprints).to_json())
    return cleaned


def _checked_frames(items: Iterable[bytes | LogRecord], base: int) -> Iterable[bytes]:
    previous = base - 1
    for item in items:
        if isinstance(item, LogRecord):
            frame = encode_frame(
                item.offset, item.timestamp, item.record_type, item.key, item.value
            )
            offset = item.offset
        else:
            record, end = decode_frame(item)
            if end != len(item):
                raise ValueError(
                    f"{len(item) - end} bytes after the frame of offset {record.offset}"
                )
            frame, offset = bytes(item), record.offset
        if offset <= previous:
            raise ValueError(f"offset {offset} out of order: must exceed {previous}")
        previous = offset
        yield frame


def pending_staged(partition_dir: str | os.PathLike[str], fs: FileOps | None = None) -> list[int]:
    """Base offsets of the outputs fully staged (cleaned file and manifest) for commit."""
    stage = staging_dir(os.fspath(partition_dir))
    fs = fs or _DEFAULT_FS
    if not fs.exists(stage):
        return []
    names = set(fs.listdir(stage))
    bases = (parse_base(name, MANIFEST_SUFFIX) for name in names)
    return sorted(b for b in bases if b is not None and base_name(b) + CLEANED_SUFFIX in names)


# -- the committer's side ---------------------------------------------------------------


class _CommitsStaged(Protocol):
    def commit_staged(self, base: int) -> CommitOutcome: ...


def commit_staged(
    target: _CommitsStaged | str | os.PathLike[str], base: int, *, fs: FileOps | None = None
) -> CommitOutcome:
    """Swap the staged output at `base` into the log: "committed", or "stale" if the
    segments it replaces changed since (the staged files are then deleted).

    `target` is an open PartitionLog (the running daemon: its segment list is updated
    under its lock) or a partition directory (offline: the caller holds DATA/LOCK)."""
    if not isinstance(target, (str, os.PathLike)):
        return target.commit_staged(base)
    partition_dir = os.fspath(target)
    fs = fs or _DEFAULT_FS
    recover_staging(fs, partition_dir)
    manifest = read_manifest(fs, manifest_path(partition_dir, base))
    if all(r.last_frame_at is not None for r in manifest.replaced):
        segments = _fingerprinted_segments(fs, partition_dir, manifest)
    else:  # an older manifest: find each last frame by reading the segments through
        segments = []
        for scan in scan_partition(fs, list_log_files(fs, partition_dir)):
            if scan.damage is not None and not scan.tail_is_torn:  # the tail is never swapped
                raise LogCorruptionError(scan.path, scan.damage.position, scan.damage.reason)
            segments.append(scan.state())
    staged = load_staged(fs, partition_dir, base, segments)
    if staged is None:
        return "stale"
    return swap_in(fs, partition_dir, staged, segments)


def _fingerprinted_segments(
    fs: FileOps, partition_dir: str, manifest: Manifest
) -> list[SegmentState]:
    """The partition's segments as the staleness check needs them, without reading them
    through: for each segment the manifest replaces, its size and the checksum of the
    frame at the position the job recorded (a sealed segment never changes, and the job
    verified every frame of it when it read it); for the others, name and size.
    A segment that changed shows up as a different size or checksum: stale."""
    wanted = {r.name: r for r in manifest.replaced}
    segments = []
    for base_offset, path in list_log_files(fs, partition_dir):
        fd = fs.open(path, os.O_RDONLY)
        try:
            size = fs.size(fd)
            fingerprint = wanted.get(os.path.basename(path))
            crc = None
            if fingerprint is not None and fingerprint.size == size:
                crc = _crc_of_last_frame(fs, fd, fingerprint.last_frame_at, size)
        finally:
            fs.close(fd)
        segments.append(SegmentState(base_offset, path, size, None, crc))
    return segments


def _crc_of_last_frame(fs: FileOps, fd: int, position: int | None, size: int) -> int | None:
    """The checksum of the valid frame at `position` that ends the file, else None."""
    if position is None or not 0 <= position < size:
        return None
    data = fs.pread(fd, size - position, position)
    try:
        _, end = decode_frame(data, 0)
    except FrameError:
        return None
    return frame_crc(data) if end == len(data) else None


@dataclass(frozen=True)
class StagedOutput:
    manifest: Manifest
    cleaned: SegmentState  # as it will stand once swapped in (path: the final .log)


def load_staged(
    fs: FileOps, partition_dir: str, base: int, segments: Sequence[SegmentState]
) -> StagedOutput | None:
    """Read and verify the staged output at `base` and fsync its cleaned file (steps up
    to 3). None if it is not a valid segment: it is then deleted."""
    manifest = read_manifest(fs, manifest_path(partition_dir, base))
    if manifest.base_offset != base:
        raise LogError(f"{manifest_path(partition_dir, base)} names base {manifest.base_offset}")
    cleaned = cleaned_path(partition_dir, base)
    scan = scan_segment(fs, cleaned, base, below_offset=_base_after(segments, manifest))
    if scan.damage is not None:
        _drop_staged(fs, partition_dir, base, f"its cleaned file is not valid: {scan.damage}")
        _log.error("%s: compaction output rejected at byte %s", cleaned, scan.damage.position)
        return None
    fd = fs.open(cleaned, os.O_RDONLY)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)
    final = SegmentState(
        base, segment_path(partition_dir, base), scan.size, scan.last_offset, scan.last_frame_crc
    )
    return StagedOutput(manifest, final)


def _base_after(segments: Sequence[SegmentState], manifest: Manifest) -> int | None:
    """The base offset of the segment after the last replaced one: the cleaned file's
    offsets must stay below it."""
    names = [s.name for s in segments]
    last = manifest.replaced[-1].name if manifest.replaced else None
    if last in names and names.index(last) + 1 < len(segments):
        return segments[names.index(last) + 1].base_offset
    return None


def staleness(segments: Sequence[SegmentState], manifest: Manifest) -> str | None:
    """Why the staged output no longer fits the log, or None if it does."""
    names = [s.name for s in segments]
    replaced = manifest.replaced
    if not replaced:
        return "its manifest lists no segments"
    first = replaced[0].name
    if first not in names:
        return f"segment {first} is gone"
    start = names.index(first)
    window = segments[start : start + len(replaced)]
    if [s.name for s in window] != [r.name for r in replaced]:
        missing = sorted({r.name for r in replaced} - set(names))
        return f"segments {missing or 'listed'} are gone or no longer consecutive"
    if start + len(replaced) >= len(segments):
        return f"it would replace the active segment {segments[-1].name}"
    for segment, expected in zip(window, replaced, strict=True):
        if (segment.size, segment.last_frame_crc) != (expected.size, expected.last_frame_crc):
            return (
                f"segment {segment.name} changed: size {segment.size}, last frame crc "
                f"{segment.last_frame_crc} where the job read {expected.size}, "
                f"{expected.last_frame_crc}"
            )
    return None


def swap_in(
    fs: FileOps, partition_dir: str, staged: StagedOutput, segments: list[SegmentState]
) -> CommitOutcome:
    """Steps 4-7, or drop the staged output if it is stale. Updates `segments` (the
    caller's list, under the caller's lock) to what the disk holds on success."""
    base = staged.manifest.base_offset
    reason = staleness(segments, staged.manifest)
    if reason is not None:
        _drop_staged(fs, partition_dir, base, reason)
        return "stale"
    start = [s.name for s in segments].index(segment_name(base))
    replaced = segments[start : start + len(staged.manifest.replaced)]
    swap = swap_path(partition_dir, base)
    fs.rename(cleaned_path(partition_dir, base), swap)
    try:
        fs.fsync_dir(partition_dir)
        fs.fsync_dir(staging_dir(partition_dir))
        _finish_swap(fs, partition_dir, base, staged.manifest)
    except OSError as exc:
        raise SwapIncompleteError(
            f"{swap}: compaction swap failed after its commit point ({exc!r}); "
            "reopening the partition finishes it"
        ) from exc
    segments[start : start + len(replaced)] = [staged.cleaned]
    _log.info(
        "%s: compaction swapped in %s (%d bytes) for %d segments (%d bytes)",
        partition_dir,
        staged.cleaned.name,
        staged.cleaned.size,
        len(replaced),
        sum(s.size for s in replaced),
    )
    return "committed"


def _finish_swap(fs: FileOps, partition_dir: str, base: int, manifest: Manifest) -> None:
    """Steps 5-7; each is idempotent, so a crash in here is finished by running it again."""
    for replaced in manifest.replaced:
        unlink_if_exists(fs, os.path.join(partition_dir, replaced.name))
    fs.fsync_dir(partition_dir)
    fs.rename(swap_path(partition_dir, base), segment_path(partition_dir, base))
    fs.fsync_dir(partition_dir)
    unlink_if_exists(fs, manifest_path(partition_dir, base))
    fs.fsync_dir(staging_dir(partition_dir))


def _drop_staged(fs: FileOps, partition_dir: str, base: int, reason: str) -> None:
    unlink_if_exists(fs, cleaned_path(partition_dir, base))
    unlink_if_exists(fs, manifest_path(partition_dir, base))
    fs.fsync_dir(staging_dir(partition_dir))
    _log.warning(
        "%s: staged compaction output at base %d is stale (%s); deleted it, the log is unchanged",
        partition_dir,
        base,
        reason,
    )


def recover_staging(fs: FileOps, partition_dir: str) -> list[str]:
    """Finish half-done swaps and clear incomplete staging (see the module docstring).
    Returns what it did, one line each (also logged)."""
    actions = []
    for name in sorted(fs.listdir(partition_dir)):
        base = parse_base(name, SWAP_SUFFIX)
        if base is None:
            continue
        manifest_file = manifest_path(partition_dir, base)
        if not fs.exists(manifest_file):
            raise LogCorruptionError(
                os.path.join(partition_dir, name), 0, "a compaction swap file without its manifest"
            )
        _finish_swap(fs, partition_dir, base, read_manifest(fs, manifest_file))
        actions.append(f"finished the half-done compaction swap {name}")
    stage = staging_dir(partition_dir)
    if fs.exists(stage):
        names = set(fs.listdir(stage))
        removed = [n for n in sorted(names) if _is_leftover(n, names)]
        for name in removed:
            fs.unlink(os.path.join(stage, name))
            actions.append(f"removed incomplete compaction staging file {name}")
        if removed:
            fs.fsync_dir(stage)
    for action in actions:
        _log.warning("%s: %s", partition_dir, action)
    return actions


def _is_leftover(name: str, names: set[str]) -> bool:
    if name.endswith(TEMP_SUFFIX):
        return True
    base = parse_base(name, CLEANED_SUFFIX)
    if base is not None:
        return base_name(base) + MANIFEST_SUFFIX not in names
    base = parse_base(name, MANIFEST_SUFFIX)
    if base is not None:
        return base_name(base) + CLEANED_SUFFIX not in names
    return False
