"""Crashes around compaction: the job killed while it writes its staging output, and the
commit failing at every step of the swap. Afterwards the log replays to the same state,
verifies, and compaction still succeeds."""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import pytest

from persistence import (
    FaultInjectingFileOps,
    StateLog,
    SwapIncompleteError,
    commit_staged,
    partition_dir,
    pending_staged,
    verify,
)
from persistence.fileops import FaultRule
from protocol.records import ShareKey
from spark_jobs.compact import COMMITTED_SELF, compact_partition
from tests.harness import REPO_ROOT, SHARECOORD, child_env, wait_until_blocking
from tests.shard.ops import InitializeOp, Op, WriteOp
from tests.spark.histories import log_bytes, run_rpcs, states_on_disk, write_log

NUM_PARTITIONS = 3
TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"
PIPE_CAPACITY = 1 << 16  # Linux's default pipe buffer
JOB_TIMEOUT_S = 300


def many_keys_history(keys: int, writes_per_key: int = 2) -> list[object]:
    """Enough keys that a partition's compacted output outgrows a pipe's buffer."""
    ops: list[Op] = []
    all_keys = [ShareKey(f"group-{i}", TOPIC, i % 4) for i in range(keys)]
    ops.extend(InitializeOp(key, 1, 0) for key in all_keys)
    for round_ in range(writes_per_key):
        ops.extend(WriteOp(key, -1, -1, round_, []) for key in all_keys)
    return run_rpcs(ops, NUM_PARTITIONS, records_per_snapshot=500)  # type: ignore[return-value]


def sharecoord(*args: str, output: IO[bytes] | int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*SHARECOORD, *args],
        cwd=REPO_ROOT,
        env=child_env(),
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: spark-submit, the JVM, ...
    )


def run_sharecoord(*args: str) -> tuple[int, list[str]]:
    with sharecoord(*args) as process:
        out, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    return process.returncode, out.decode().splitlines()


# -- the job killed mid-write ----------------------------------------------------------


@pytest.mark.spark  # spark-submit, in a subprocess
def test_a_job_killed_while_it_writes_its_staging_output_changes_nothing(
    tmp_path: Path, data_dir: str
) -> None:
    write_log(data_dir, many_keys_history(3000), NUM_PARTITIONS, segment_bytes=8192)  # type: ignore[arg-type]
    before = states_on_disk(data_dir)
    files = [log_bytes(data_dir, p) for p in range(NUM_PARTITIONS)]
    # The cleaned file of partition 1 is a pipe: the job's write blocks once the pipe is
    # full, and the test kills it right there, mid-write.
    stage = os.path.join(partition_dir(data_dir, 1), "compaction")
    os.mkdir(stage)
    cleaned = os.path.join(stage, f"{0:020d}.cleaned")
    os.mkfifo(cleaned)
    reader = os.open(cleaned, os.O_RDONLY | os.O_NONBLOCK)
    job_output = open(tmp_path / "killed-job.out", "wb")  # noqa: SIM115 - closed below
    job = sharecoord("compact", "--data-dir", data_dir, "--master", "local[2]", output=job_output)
    try:
        ready, _, _ = select.select([reader], [], [], JOB_TIMEOUT_S)
        assert ready, "the job never started writing its staging output"
        time.sleep(0.5)  # let it fill the pipe and block
        written = os.read(reader, 4096)  # what a disk would hold of the cleaned file
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
        _drain_until_every_writer_is_gone(reader)
    finally:
        os.close(reader)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        job_output.close()
    assert len(written) == 4096
    os.unlink(cleaned)
    with open(cleaned, "wb") as partial:
        partial.write(written)

    assert pending_staged(partition_dir(data_dir, 1)) == []
    assert [log_bytes(data_dir, p) for p in range(NUM_PARTITIONS)] == files
    assert states_on_disk(data_dir) == before
    assert verify(data_dir).ok

    code, lines = run_sharecoord("compact", "--data-dir", data_dir, "--master", "local[2]")
    assert code == 0, lines
    assert COMMITTED_SELF in lines
    assert states_on_disk(data_dir) == before
    assert verify(data_dir).ok
    assert [len(log_bytes(data_dir, p)) for p in range(NUM_PARTITIONS)] == [2] * NUM_PARTITIONS
    assert sorted(os.listdir(stage)) == []


def _drain_until_every_writer_is_gone(reader: int) -> None:
    """Read the pipe until EOF: the killed job's Python workers (in their own process
    group, under pyspark's daemon) exit once the JVM is gone."""
    wait_until_blocking(
        partial(_drained_to_the_end, reader),
        "every writer of the killed job to close the staging pipe",
    )


def _drained_to_the_end(reader: int) -> bool:
    """Reads what the pipe holds (waiting up to a second for it); whether that was the
    end of the file, every writer gone."""
    ready, _, _ = select.select([reader], [], [], 1)
    if not ready:
        return False
    try:
        return os.read(reader, PIPE_CAPACITY) == b""
    except BlockingIOError:
        return False


# -- the commit failing at every step --------------------------------------------------


@dataclass(frozen=True)
class Call:
    op: str
    path: str


class RecordingFileOps(FaultInjectingFileOps):
    """Remembers every call a fault could be injected into."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def _maybe_fail(self, op: str, path: str) -> None:
        if op in ("rename", "unlink", "fsync", "fdatasync", "fsync_dir"):
            self.calls.append(Call(op, path))
        super()._maybe_fail(op, path)


def staged_log(data_dir: str) -> int:
    """A log with output staged for its busiest partition; returns that partition."""
    write_log(data_dir, many_keys_history(60, writes_per_key=6), NUM_PARTITIONS, segment_bytes=900)  # type: ignore[arg-type]
    partition = max(range(NUM_PARTITIONS), key=lambda p: len(log_bytes(data_dir, p)))
    result = compact_partition(data_dir, partition, tombstone_cutoff_ms=0)
    assert result.status == "staged", result
    return partition


def recorded_calls(data_dir: str, partition: int, online: bool) -> tuple[list[Call], int]:
    """Every call a clean commit makes (on a copy), and the index of the swap's first
    step: the fsync of the cleaned file (step 3 of persistence/swap.py); what comes
    before it is opening the log and reading the staged output."""
    copy = data_dir + ".steps"
    shutil.copytree(data_dir, copy)
    recorder = RecordingFileOps()
    try:
        assert commit(copy, partition, recorder, online) == "committed"
    finally:
        shutil.rmtree(copy)
    calls = [Call(c.op, c.path.replace(copy, data_dir)) for c in recorder.calls]
    first = next(i for i, c in enumerate(calls) if c.op == "fsync" and c.path.endswith(".cleaned"))
    return calls, first


def commit(data_dir: str, partition: int, fs: FaultInjectingFileOps, online: bool) -> str:
    if not online:
        return commit_staged(partition_dir(data_dir, partition), 0, fs=fs)
    log = StateLog.open(data_dir, NUM_PARTITIONS, segment_bytes=900, fs=fs)
    try:
        log.partition(partition).open()
        return log.partition(partition).commit_staged(0)
    finally:
        log.close()


@pytest.mark.parametrize("online", [False, True], ids=["offline", "daemon"])
def test_a_commit_failing_at_any_step_of_the_swap_leaves_the_same_state(
    data_dir: str, online: bool
) -> None:
    partition = staged_log(data_dir)
    before = states_on_disk(data_dir)
    pristine = data_dir + ".pristine"
    shutil.copytree(data_dir, pristine)
    calls, first = recorded_calls(data_dir, partition, online)
    # The swap's steps; closing the log afterwards also records a journal CHECKPOINT,
    # which is no step of the swap.
    steps = [
        (index, call)
        for index, call in enumerate(calls)
        if index >= first and f"{os.sep}journal{os.sep}" not in call.path
    ]
    assert [c.op for _, c in steps].count("rename") == 2  # cleaned -> swap -> log
    assert {c.op for _, c in steps} >= {"fsync", "unlink", "fsync_dir"}

    for index, step in steps:
        shutil.rmtree(data_dir)
        shutil.copytree(pristine, data_dir)
        fs = FaultInjectingFileOps()
        rule = FaultRule(step.op, errno.EIO, path_contains=step.path)
        earlier = sum(1 for c in calls[:index] if rule.matches(c.op, c.path))
        fs.fail(step.op, errno.EIO, path_contains=step.path, after=earlier)
        with pytest.raises((OSError, SwapIncompleteError)):
            commit(data_dir, partition, fs, online)

        # Reopening the log (recovery) finishes or rolls back the swap.
        log = StateLog.open(data_dir, NUM_PARTITIONS, segment_bytes=900)
        try:
            for p in range(NUM_PARTITIONS):
                log.partition(p).open()
        finally:
            log.close()
        assert states_on_disk(data_dir) == before, f"after a failure at step {index}: {step}"
        assert verify(data_dir).ok, f"after a failure at step {index}: {step}"
        # And whatever is still staged commits now.
        for base in pending_staged(partition_dir(data_dir, partition)):
            assert commit_staged(partition_dir(data_dir, partition), base) == "committed"
        assert states_on_disk(data_dir) == before
        assert len(log_bytes(data_dir, partition)) == 2, f"after a failure at step {index}"
