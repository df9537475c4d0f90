"""A real crash: SIGKILL a process appending with group commit, at random moments, many
times over the same data directory. Every record it reported durable must be there,
byte for byte, and the log must verify.

A SIGKILL leaves every completed write() in the page cache, so by itself it neither
tears frames nor loses what was written but not fsynced. Half of the kills are
therefore followed by a power-loss emulation: each partition's newest segment is cut
at a random byte at or after the size its last successful fsync covered (the child
reports those; a recovery here syncs everything), which loses unsynced bytes and
leaves torn frames for recovery. An acknowledgement that ran ahead of its fsync fails
the test.

Odd iterations check the directory read-only (verify and the offline reader, which
must cope with the torn tail) and leave recovery to the next child; even ones recover
it here. Moments vary: some kills land before the child is ready (during start-up or
recovery), most while it appends.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from persistence import StateLog, list_segments, read_partition, verify
from persistence.statelog import partition_dir
from tests.harness import Acknowledged
from tests.persistence.crash_child import record_digest

CHILD = Path(__file__).with_name("crash_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_PARTITIONS = 4
# The digest of each acknowledged record, by (partition, offset). Records appended and
# never acknowledged are not in it: the log may keep them or not (nor are they looked at).
Acked = Acknowledged[tuple[int, int], str]


def run_child_until_killed(data_dir: str, segment_bytes: int, rng: random.Random) -> list[str]:
    """Start a child, SIGKILL it at a random moment, return the lines it completed."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    args = [
        str(CHILD),
        data_dir,
        str(NUM_PARTITIONS),
        str(segment_bytes),
        str(rng.randrange(10**9)),
    ]
    child = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert child.stdout is not None
    assert child.stderr is not None
    lines: list[str] = []
    ready = threading.Event()

    def collect() -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode()
            lines.append(line)
            if line == "ready\n":
                ready.set()

    reader = threading.Thread(target=collect)
    reader.start()
    try:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0, 0.15))  # killed maybe still starting or recovering
        else:
            assert ready.wait(60), "the child never became ready"
            time.sleep(rng.uniform(0, 0.25))  # the random moment of the kill
        assert child.poll() is None, f"the child died by itself: {child.stderr.read().decode()}"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        reader.join()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return [line for line in lines if line.endswith("\n") and line != "ready\n"]


def record_lines(acked: Acked, synced: dict[str, int], lines: list[str]) -> None:
    for line in lines:
        if line.startswith("appended "):
            continue
        first, second, third = line.split()
        if first == "synced":
            synced[second] = int(third)
            continue
        key = (int(first), int(second))
        if key in acked.possible:
            assert acked.exact(key) == third, f"offset {key} acknowledged twice"
        acked.acknowledge(key, third)


def tear_unsynced_tails(data_dir: str, synced: dict[str, int], rng: random.Random) -> None:
    """Cut each partition's newest segment somewhere at or after its last fsynced size."""
    for p in range(NUM_PARTITIONS):
        newest = list_segments(partition_dir(data_dir, p))[-1]
        durable = min(synced.get(newest.path, 0), newest.size_bytes)
        os.truncate(newest.path, rng.randint(durable, newest.size_bytes))


def check_acked_present(
    acked: Acked, data_dir: str, *, recover: bool, synced: dict[str, int] | None = None
) -> None:
    """With `recover`, this process recovers the log and closes it, which fsyncs every
    partition and checkpoints: what the files then hold is what a power loss cannot
    take, and goes into `synced` for the next emulation."""
    report = verify(data_dir)
    assert report.ok, [d for p in report.partitions for d in p.damage]
    found: dict[tuple[int, int], str] = {}
    if recover:
        log = StateLog.open(data_dir, NUM_PARTITIONS)
        try:
            for part in log.partitions:
                part.open()
                for r in part.read():
                    found[part.partition, r.offset] = record_digest(
                        r.record_type, r.timestamp, r.key, r.value
                    )
        finally:
            log.close()
        assert all(p.tail is None for p in verify(data_dir).partitions)
        for p in range(NUM_PARTITIONS if synced is not None else 0):
            for segment in list_segments(partition_dir(data_dir, p)):
                synced[segment.path] = segment.size_bytes
    else:
        for p in range(NUM_PARTITIONS):
            for r in read_partition(partition_dir(data_dir, p)):
                found[p, r.offset] = record_digest(r.record_type, r.timestamp, r.key, r.value)
    missing = acked.mismatches(found)
    assert not missing, f"{len(missing)} acknowledged records lost or changed: {missing[:5]}"


ENOUGH = 1000  # acknowledged records for a run to have tested something


def crash_many_times(
    data_dir: str,
    iterations: int,
    segment_bytes: int,
    seed: int,
    enough: Callable[[Acked], bool] = lambda acked: len(acked.keys) > ENOUGH,
) -> Acked:
    """At least `iterations` kills, and more (up to ten times as many) until `enough`
    (by default ENOUGH records acknowledged): a busy machine does less between two kills."""
    rng = random.Random(seed)
    acked: Acked = Acknowledged({})
    synced: dict[str, int] = {}
    iteration = 0
    while iteration < iterations or (not enough(acked) and iteration < 10 * iterations):
        record_lines(acked, synced, run_child_until_killed(data_dir, segment_bytes, rng))
        if rng.random() < 0.5:
            tear_unsynced_tails(data_dir, synced, rng)
        check_acked_present(acked, data_dir, recover=iteration % 2 == 0, synced=synced)
        iteration += 1
    check_acked_present(acked, data_dir, recover=True)
    return acked


@pytest.mark.parametrize(
    "many",
    [
        pytest.param(False, id="25-kills"),
        pytest.param(True, id="200-kills", marks=pytest.mark.slow),
    ],
)
def test_every_acknowledged_append_survives_sigkill(data_dir: str, many: bool) -> None:
    acked = crash_many_times(data_dir, 200 if many else 25, 100 * 1024 * 1024, seed=1)
    assert len(acked.keys) > ENOUGH


@pytest.mark.parametrize(
    "many",
    [
        pytest.param(False, id="15-kills"),
        pytest.param(True, id="100-kills", marks=pytest.mark.slow),
    ],
)
def test_every_acknowledged_append_survives_sigkill_across_segment_rolls(
    data_dir: str, many: bool
) -> None:

    def rolled(acked: Acked) -> bool:
        segments = os.listdir(partition_dir(data_dir, 0))
        return len(acked.keys) > ENOUGH and len([n for n in segments if n.endswith(".log")]) > 5

    acked = crash_many_times(data_dir, 100 if many else 15, 16 * 1024, seed=2, enough=rolled)
    assert rolled(acked)
