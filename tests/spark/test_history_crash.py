"""Issue #14: the history survives a compaction killed at any step between its export and
its swap. The compaction of one state partition (what a Spark task runs, then the commit
the driver runs under DATA/LOCK) runs in a child process that SIGKILLs itself just before
its N-th durable file step (a mkdir, fsync, rename, replace or unlink), for every N the
whole run takes. After each kill the log is opened (recovery finishes or rolls back a
half-done swap), compaction runs again to the end, and the history must hold every
record that was folded away exactly once: no duplicate, nothing missing, in the Parquet
files themselves and through the reader the audit and the data source use.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from persistence import StateLog, list_segments, partition_dir
from persistence.history import (
    HistoryConfig,
    expire,
    read_exports,
    write_declaration,
)
from spark_jobs.compact import commit_partition, compact_partition
from spark_jobs.logsource import Source, read_whole_partition
from tests.spark.conftest import REPO_ROOT
from tests.spark.histories import Appended, state_partition_of, write_log
from tests.spark.test_audit import AVAILABLE, NUM_PARTITIONS, b, key, snap, upd
from tests.spark.test_history import prune_as_the_daemon_does

MS_PER_DAY = 86_400_000
# Just before midnight UTC: the partition's records fall on two days, so an export
# writes two Parquet files.
MIDNIGHT_MS = 1_700_006_400_000
STEPS = ("mkdir", "fsync", "rename", "replace", "unlink")

CHILD = """
import json, os, signal, sys
from spark_jobs.compact import commit_partition, compact_partition

data_dir, root, partition, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
steps = []

def counted(name):
    real = getattr(os, name)
    def step(*args, **kwargs):
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(os, name, step)

for name in sys.argv[5].split(","):
    counted(name)
result = compact_partition(data_dir, partition, 0, root)
commit = commit_partition(data_dir, partition)
print(json.dumps({"steps": steps, "status": result.status, "committed": commit.committed}))
"""


def crash_log(data_dir: str) -> tuple[int, list[Appended]]:
    """One state partition with a few sealed segments whose records straddle midnight."""
    k = key("crash")
    records = [snap(k, 1, 0, b(0, 3, AVAILABLE, 1))]
    records += [upd(k, -1, b(i, i, AVAILABLE, 1 + i % 3)) for i in range(24)]
    p = state_partition_of(k, NUM_PARTITIONS)
    appended = [
        Appended(p, offset, MIDNIGHT_MS - 12 * 60_000 + offset * 60_000, record)
        for offset, record in enumerate(records)
    ]
    write_log(data_dir, appended, NUM_PARTITIONS, segment_bytes=500)
    assert len(list_segments(partition_dir(data_dir, p))) >= 4
    return p, appended


def run_child(
    data_dir: str, root: str, partition: int, kill_at: int
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            data_dir,
            root,
            str(partition),
            str(kill_at),
            ",".join(STEPS),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def recover_and_finish(data_dir: str, root: str, partition: int) -> None:
    """What happens after a crash: the daemon (or the next job) opens the log, which
    finishes or rolls back a half-done swap; the next compaction runs to the end."""
    with StateLog.open(data_dir, NUM_PARTITIONS) as log:
        log.partition(partition).open()
    for _ in range(3):
        result = compact_partition(data_dir, partition, 0, root)
        commit = commit_partition(data_dir, partition)
        assert result.status != "failed" and not commit.error, (result, commit)
        if result.status == "skipped" and not commit.committed:
            return
    raise AssertionError("compaction kept finding work")


def history_offsets(root: str, partition: int) -> list[int]:
    """The offsets in every Parquet file of the history (hidden temporary files aside:
    no reader lists them)."""
    offsets: list[int] = []
    base = Path(root) / f"state_partition={partition}"
    for path in sorted(base.rglob("*.parquet")):
        if not path.name.startswith("."):
            offsets += pq.read_table(path, columns=["log_offset"]).column(0).to_pylist()
    return offsets


def whole_partition(data_dir: str, partition: int) -> list[tuple[int, int, str]]:
    rows = []
    for batch in read_whole_partition(Source.open(data_dir), partition):
        columns = batch.to_pydict()
        rows += zip(
            columns["log_offset"],
            [
                int(t.timestamp() * 1000) if hasattr(t, "timestamp") else t
                for t in columns["timestamp"]
            ],
            columns["record_type"],
            strict=True,
        )
    return rows


def test_a_compaction_killed_at_every_step_leaves_a_history_without_duplicates_or_gaps(
    data_dir: str, tmp_path: Path
) -> None:
    partition, appended = crash_log(data_dir)
    root = os.path.join(data_dir, "history")
    write_declaration(data_dir, HistoryConfig(root, -1))
    expected = [(a.offset, a.timestamp, type(a.record).__name__) for a in appended]
    pristine = str(tmp_path / "pristine")
    shutil.copytree(data_dir, pristine)

    # A clean run: how many steps there are, and what the history holds afterwards.
    clean = run_child(data_dir, root, partition, 0)
    assert clean.returncode == 0, clean.stderr
    outcome = json.loads(clean.stdout)
    assert outcome["status"] == "staged" and outcome["committed"] == [0]
    steps = outcome["steps"]
    assert {"fsync", "replace", "rename", "unlink"} <= set(steps), steps
    folded = sorted(history_offsets(root, partition))
    sealed_end = read_exports(root, partition)[-1].covered_end
    assert folded == list(range(sealed_end)) and sealed_end < len(appended)
    assert whole_partition(data_dir, partition) == expected

    for kill_at in range(1, len(steps) + 1):
        shutil.rmtree(data_dir)
        shutil.copytree(pristine, data_dir)
        killed = run_child(data_dir, root, partition, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stdout, killed.stderr)
        recover_and_finish(data_dir, root, partition)
        where = f"killed before step {kill_at} ({steps[kill_at - 1]})"
        offsets = history_offsets(root, partition)
        assert len(offsets) == len(set(offsets)), f"{where}: duplicates in the history"
        assert sorted(offsets) == folded, f"{where}: the history lost or gained records"
        assert whole_partition(data_dir, partition) == expected, where
        live = list_segments(partition_dir(data_dir, partition))
        assert len(live) == 2, f"{where}: not compacted in the end: {live}"


@pytest.mark.parametrize("retention_ms", [MS_PER_DAY])
def test_retention_expires_whole_days_and_keeps_the_markers_prune_needs(
    data_dir: str, retention_ms: int
) -> None:
    """Expiry deletes day directories past the retention; the marker of a segment still
    in the live log stays (the daemon's prune needs it), and so does the watermark's."""
    partition, appended = crash_log(data_dir)
    root = os.path.join(data_dir, "history")
    write_declaration(data_dir, HistoryConfig(root, retention_ms))
    result = compact_partition(data_dir, partition, 0, root)
    assert result.status == "staged"
    commit = commit_partition(data_dir, partition)
    assert commit.committed == [0]
    days = sorted(p.name for p in (Path(root) / f"state_partition={partition}").iterdir())
    assert days == ["day=2023-11-14", "day=2023-11-15"]
    now = MIDNIGHT_MS + retention_ms + 1  # the first day is past the retention, not the second
    expired = expire(root, data_dir, range(NUM_PARTITIONS), now, retention_ms)
    assert expired.days == [f"{partition}/2023-11-14"]
    # The compacted segment's marker outlived its (record-less) export: prune may go.
    assert prune_as_the_daemon_does(data_dir, partition), "prune was held back"
    # What the history still holds are the second day's records, each once.
    sealed_end = read_exports(root, partition)[-1].covered_end
    second_day = [
        a.offset for a in appended if a.timestamp >= MIDNIGHT_MS and a.offset < sealed_end
    ]
    assert second_day and sorted(history_offsets(root, partition)) == second_day
