"""SIGKILL at every step the journal takes: a commit cycle (the journal record's write
and fdatasync, by the kernel or the commit thread, the partitions' writes), a segment
roll, a checkpoint (the partitions' fsync, CHECKPOINT's temp file, rename and directory
fsync, deleting journal segments), creating a journal segment ahead of need, and
recovery itself.

The child (crash_child.py) kills itself at the nth call of one FileOps method on a
path, before or after the call. After each kill: every record it acknowledged is there
byte for byte; every record there is one it appended, in order (a record whose journal
write completed may show without its acknowledgement: durable, its answer lost with
the process); `log verify` is clean; and a second recovery leaves every file as the
first left it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import StateLog, verify
from persistence.fileops import FileOps
from persistence.journal import journal_dir, read_checkpoint
from persistence.segments import segment_path
from tests.harness import Acknowledged
from tests.persistence.crash_child import record_digest
from tests.persistence.log_helpers import tree_snapshot

CHILD = Path(__file__).with_name("crash_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_PARTITIONS = 3
SEGMENT_BYTES = 16 * 1024  # partition segments roll every few dozen records
ENV = {
    "SHARECOORD_JOURNAL_SEGMENT_BYTES": str(64 * 1024),  # journal segments roll too
    "SHARECOORD_CHECKPOINT_BYTES": str(8 * 1024),  # a checkpoint every few cycles
}
Digests = dict[tuple[int, int], str]

# (FileOps call, path part, nth call, before or after it)
CYCLE = [
    ("pwrite", "journal", 3, "before"),
    ("pwrite", "journal", 3, "after"),
    ("fdatasync", "journal", 5, "before"),
    ("fdatasync", "journal", 5, "after"),
    ("write", "partitions", 20, "before"),
    ("write", "partitions", 20, "after"),
]
ROLL = [
    ("fsync_dir", "partitions", 8, "before"),  # the first 3 come with the first opens
    ("fsync_dir", "partitions", 8, "after"),
]
CHECKPOINT = [
    ("fdatasync", ".log", 2, "before"),
    ("fdatasync", ".log", 2, "after"),
    ("write", "CHECKPOINT.tmp", 3, "before"),
    ("fsync", "CHECKPOINT.tmp", 3, "before"),
    ("fsync", "CHECKPOINT.tmp", 3, "after"),
    ("rename", "CHECKPOINT.tmp", 3, "before"),
    ("rename", "CHECKPOINT.tmp", 3, "after"),
    ("fsync_dir", "journal", 9, "after"),
    ("unlink", ".journal", 1, "before"),
    ("unlink", ".journal", 1, "after"),
]
PRE_CREATION = [
    ("write", ".journal", 2, "before"),  # zero-filling a segment
    ("fsync", ".journal", 3, "before"),
    ("fsync", ".journal", 3, "after"),
    # The next segment made paced beside the writes, under its own name, then renamed.
    ("fsync", ".journal.new", 1, "after"),
    ("rename", ".journal.new", 1, "before"),
    ("rename", ".journal.new", 1, "after"),
]
RECOVERY = [
    ("truncate", "partitions", 1, "after"),  # cutting an unsynced tail
    ("pwrite", "partitions", 1, "before"),  # writing frames from the journal
    ("pwrite", "partitions", 2, "after"),
    ("fdatasync", "partitions", 1, "after"),
    ("rename", "CHECKPOINT.tmp", 1, "before"),
    ("rename", "CHECKPOINT.tmp", 1, "after"),
    ("unlink", ".journal", 1, "before"),
]


def run_child(data_dir: str, kill_at: tuple[str, str, int, str], **extra: str) -> list[str]:
    """Run the child until it kills itself at `kill_at`; the lines it completed."""
    env = {
        **os.environ,
        **ENV,
        **extra,
        "PYTHONPATH": str(REPO_ROOT),
        "SHARECOORD_KILL_AT": ":".join(map(str, kill_at)),
    }
    args = [str(CHILD), data_dir, str(NUM_PARTITIONS), str(SEGMENT_BYTES), "7"]
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, env=env, timeout=120, check=False
    )
    stderr = done.stderr.decode()
    assert done.returncode == -9, f"the child did not reach {kill_at}: {stderr[-2000:]}"
    assert "killed at" in stderr
    return done.stdout.decode().splitlines()


def parse(lines: list[str]) -> tuple[Acknowledged[tuple[int, int], str], int]:
    """What the child reported: each record's digest by (partition, offset), known once
    it was acknowledged, maybe there (or not) once appended; and how many it
    acknowledged."""
    model: Acknowledged[tuple[int, int], str] = Acknowledged({})
    acknowledged = 0
    for line in lines:
        words = line.split()
        if words and words[0] == "appended":
            model.unanswered((int(words[1]), int(words[2])), words[3])
        elif len(words) == 3 and words[0] != "synced":
            model.acknowledge((int(words[0]), int(words[1])), words[2])
            acknowledged += 1
    return model, acknowledged


def recover(data_dir: str) -> Digests:
    found: Digests = {}
    log = StateLog.open(data_dir, NUM_PARTITIONS, segment_bytes=SEGMENT_BYTES)
    try:
        for part in log.partitions:
            part.open()
            for r in part.read():
                found[part.partition, r.offset] = record_digest(
                    r.record_type, r.timestamp, r.key, r.value
                )
    finally:
        log.close()
    return found


def check(data_dir: str, model: Acknowledged[tuple[int, int], str]) -> None:
    found = recover(data_dir)
    # Every acknowledged record there, the others as appended or not at all, and none
    # that was never appended.
    model.verify(found)
    for p in range(NUM_PARTITIONS):
        offsets = sorted(o for q, o in found if q == p)
        assert offsets == list(range(len(offsets))), f"a gap in partition {p}"
    assert verify(data_dir).ok
    assert not list(Path(journal_dir(data_dir)).glob("*.new")), "a half-made segment was left"
    once = tree_snapshot(data_dir)
    assert recover(data_dir) == found
    assert tree_snapshot(data_dir) == once, "a second recovery changed the files"


@pytest.mark.parametrize(
    "kill_at",
    CYCLE + ROLL + CHECKPOINT + PRE_CREATION,
    ids=lambda k: "-".join(map(str, k)),
)
@pytest.mark.parametrize("flush", ["kernel", "thread"])
def test_a_kill_at_every_step_loses_nothing_acknowledged(
    data_dir: str, kill_at, flush: str
) -> None:
    # The journal's flush by the kernel (kernel_flush.py) or by the commit thread: the
    # same steps, the child reports and dies at the kernel's as at fdatasync's.
    extra = {"SHARECOORD_THREAD_FLUSH": "1"} if flush == "thread" else {}
    model, acknowledged = parse(run_child(data_dir, kill_at, **extra))
    assert acknowledged or kill_at[0] == "write", "nothing was acknowledged before the kill"
    check(data_dir, model)


@pytest.mark.parametrize("kill_at", RECOVERY, ids=lambda k: "-".join(map(str, k)))
def test_a_kill_during_recovery_loses_nothing_acknowledged(data_dir: str, kill_at) -> None:
    # A crash that leaves the partitions behind the journal: records written to the
    # journal, and the partition files cut back to their checkpointed size, so
    # recovery has frames to write, a tail to cut, a checkpoint to record.
    model, _ = parse(run_child(data_dir, ("pwrite", "journal", 40, "after")))
    checkpoint = read_checkpoint(FileOps(), journal_dir(data_dir))
    for p in range(NUM_PARTITIONS):
        directory = os.path.join(data_dir, "partitions", str(p))
        newest = max(n for n in os.listdir(directory) if n.endswith(".log"))
        path = os.path.join(directory, newest)
        # What a power loss may take: the newest segment past its last fsync, which a
        # checkpoint records (a segment rolled to since then: all of it). Every partition
        # written since the last checkpoint then has frames to take from the journal,
        # not only those of the last cycle (which may be one partition alone).
        synced = checkpoint.partitions.get(p)
        keep = (
            synced.size
            if synced is not None and path == segment_path(directory, synced.segment)
            else 0
        )
        os.truncate(path, keep)
        with open(path, "ab") as tail:
            tail.write(b"\x7f" * 11)  # a torn frame past what was synced
    run_child(data_dir, kill_at, SHARECOORD_RECOVER_ONLY="1")
    check(data_dir, model)
