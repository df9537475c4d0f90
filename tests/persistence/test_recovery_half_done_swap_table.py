"""Recovery from a compaction swap interrupted at every step, one row per step.

The real staging and swap code is stopped at each step by a fault from the file layer,
which leaves the disk as a crash there would. Before the commit point (the rename to
.swap) recovery must leave the old segments as the log; after it, it must finish the
swap. Either way a reader of the directory sees exactly one of the two logs, and
appends, group commit and a reopen work afterwards.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Literal

import pytest

from persistence import (
    FaultInjectingFileOps,
    LogRecord,
    SwapIncompleteError,
    commit_staged,
    pending_staged,
    read_partition,
    write_staged,
)
from persistence.segments import list_log_files
from tests.persistence.log_helpers import (
    FRAME_SIZE,
    check_appends_work_afterwards,
    open_log,
    write_records,
)

SEGMENT_BYTES = 16 * FRAME_SIZE
RECORDS = 3 * 16 + 10  # segments 0, 16, 32 sealed; 48 active


@dataclass(frozen=True)
class Fault:
    op: str
    path_contains: str
    after: int = 0
    short_write: bool = False
    # The process dies at the failed call: the removal of a temporary file that a
    # failed write does next (fileops.write_file_atomically) never happens.
    dies: bool = False


@dataclass(frozen=True)
class Step:
    stage_fault: Fault | None  # stops write_staged
    commit_fault: Fault | None  # stops commit_staged (None with commit=True: it completes)
    commit: bool
    disk: str  # the files the "crash" leaves: "<partition dir> | <staging dir>"
    outcome: Literal["unchanged", "staged", "compacted"]


# In `disk`: L<base> a segment, S the .swap, C the .cleaned, M the manifest, T its temp.
STEPS = {
    "cleaned-partially-written": Step(
        Fault("write", ".cleaned", short_write=True),
        None,
        False,
        "L0 L16 L32 L48 | C",
        "unchanged",
    ),
    "cleaned-without-manifest": Step(
        Fault("open", ".manifest.tmp"), None, False, "L0 L16 L32 L48 | C", "unchanged"
    ),
    "manifest-temp-not-renamed": Step(
        Fault("rename", ".manifest.tmp", dies=True),
        None,
        False,
        "L0 L16 L32 L48 | C T",
        "unchanged",
    ),
    "manifest-written": Step(None, None, False, "L0 L16 L32 L48 | C M", "staged"),
    "cleaned-fsync-at-commit-failed": Step(
        None, Fault("fsync", ".cleaned"), True, "L0 L16 L32 L48 | C M", "staged"
    ),
    "rename-to-swap-failed": Step(
        None, Fault("rename", ".cleaned"), True, "L0 L16 L32 L48 | C M", "staged"
    ),
    "renamed-to-swap": Step(
        None, Fault("unlink", "partitions/0/0000"), True, "S L0 L16 L32 L48 | M", "compacted"
    ),
    "some-replaced-deleted": Step(
        None, Fault("unlink", "partitions/0/0000", after=1), True, "S L16 L32 L48 | M", "compacted"
    ),
    "all-replaced-deleted": Step(None, Fault("rename", ".swap"), True, "S L48 | M", "compacted"),
    "renamed-to-log": Step(None, Fault("unlink", ".manifest"), True, "L0 L48 | M", "compacted"),
    "manifest-removed": Step(None, None, True, "L0 L48 |", "compacted"),
}
CODES = {"log": "L", "swap": "S", "cleaned": "C", "manifest": "M", "manifest.tmp": "T"}
ORDER = "SLCMT"


def disk_state(partition_dir: str) -> str:
    """The partition's files, in the notation of Step.disk."""

    def listed(directory: str) -> str:
        names = os.listdir(directory) if os.path.exists(directory) else []
        codes = []
        for name in names:
            if name == "compaction":
                continue
            stem, suffix = name.split(".", 1)
            codes.append(CODES[suffix] + (stem.lstrip("0") or "0" if suffix == "log" else ""))
        return " ".join(sorted(codes, key=lambda c: (ORDER.index(c[0]), int(c[1:] or 0))))

    staging = os.path.join(partition_dir, "compaction")
    return f"{listed(partition_dir)} | {listed(staging)}".strip()


def last_record_per_key(records: list[LogRecord]) -> list[LogRecord]:
    latest = {r.key: r for r in records}
    return sorted(latest.values(), key=lambda r: r.offset)


def injecting(fault: Fault | None) -> FaultInjectingFileOps:
    fs = FaultInjectingFileOps()
    if fault is not None:
        fs.fail(
            fault.op,
            errno.EIO,
            path_contains=fault.path_contains,
            after=fault.after,
            short_write=fault.short_write,
        )
        if fault.dies:
            fs.fail("unlink", errno.EIO, path_contains=fault.path_contains)
    return fs


@pytest.mark.parametrize("step", STEPS.values(), ids=STEPS.keys())
def test_a_swap_interrupted_at_each_step_recovers_to_one_whole_log(
    data_dir: str, step: Step
) -> None:
    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
    for part in log.partitions:
        part.open()
    records = write_records(log.partition(0), RECORDS)
    partition_dir = log.partition(0).partition_dir
    replaced = [s.path for s in log.partition(0).segments[:3]]
    log.close()
    cleaned = last_record_per_key(records[:48])
    compacted = cleaned + records[48:]

    crashed = False
    try:
        write_staged(partition_dir, 0, cleaned, replaced, fs=injecting(step.stage_fault))
        if step.commit:
            commit_staged(partition_dir, 0, fs=injecting(step.commit_fault))
    except (OSError, SwapIncompleteError):
        crashed = True  # the process stops here
    assert crashed == (step.stage_fault is not None or step.commit_fault is not None)
    assert disk_state(partition_dir) == step.disk

    expected = compacted if step.outcome == "compacted" else records
    assert list(read_partition(partition_dir)) == expected  # what offline readers see

    log = open_log(data_dir, segment_bytes=SEGMENT_BYTES)
    report = log.partition(0).open()
    assert list(log.partition(0).read()) == expected
    staging = os.path.join(partition_dir, "compaction")
    left = sorted(os.listdir(staging)) if os.path.exists(staging) else []
    if step.outcome == "staged":
        assert left == ["00000000000000000000.cleaned", "00000000000000000000.manifest"]
        assert pending_staged(partition_dir) == [0]
        assert commit_staged(log.partition(0), 0) == "committed"
        assert list(log.partition(0).read()) == compacted
        expected = compacted
    else:
        assert left == []
    bases = [base for base, _ in list_log_files(log.fs, partition_dir)]
    assert bases == ([0, 48] if expected is compacted else [0, 16, 32, 48])
    assert not [n for n in os.listdir(partition_dir) if n.endswith(".swap")]
    if step.outcome == "compacted" and step.commit_fault is not None:
        assert report.staging_actions
    check_appends_work_afterwards(log, 0, expected)
