"""A power cut at random moments of a busy group commit (tests/persistence/power_loss.py):
on a copy built from what was flushed, recovery keeps every acknowledged record, invents
none, verifies clean, and a second recovery changes nothing."""

from __future__ import annotations

import asyncio
import os
import random

from persistence import GroupCommitter, LogRecord, StateLog, partition_dir, verify
from tests.harness import Acknowledged
from tests.persistence.log_helpers import append_records, tree_snapshot
from tests.persistence.power_loss import Durable, PowerLossFileOps, materialize

NUM_PARTITIONS = 3
SEGMENT_BYTES = 2_000  # rolls often
JOURNAL_SEGMENT_BYTES = 64 * 1024


def open_all(data_dir: str, fs: PowerLossFileOps | None = None) -> StateLog:
    log = StateLog.open(
        data_dir,
        NUM_PARTITIONS,
        segment_bytes=SEGMENT_BYTES,
        journal_segment_bytes=JOURNAL_SEGMENT_BYTES,
        fs=fs,
    )
    for part in log.partitions:
        part.open()
    return log


def recovered(data_dir: str) -> dict[int, list[LogRecord]]:
    log = open_all(data_dir)
    try:
        return {p: list(log.partition(p).read()) for p in range(NUM_PARTITIONS)}
    finally:
        log.close()


async def busy_commits(
    data_dir: str, rng: random.Random
) -> list[tuple[Durable, dict[int, list[LogRecord]], dict[int, list[LogRecord]]]]:
    """Appends, commits and checkpoints; at random moments a power-cut snapshot with
    what was acknowledged and what was appended by then."""
    fs = await asyncio.to_thread(PowerLossFileOps, data_dir)
    log = await asyncio.to_thread(open_all, data_dir, fs)
    committer = GroupCommitter(log, checkpoint_bytes=3_000)
    committer.start()
    acked: dict[int, list[LogRecord]] = {p: [] for p in range(NUM_PARTITIONS)}
    appended: dict[int, list[LogRecord]] = {p: [] for p in range(NUM_PARTITIONS)}
    cuts = []

    async def writer(p: int) -> None:
        for n in range(60):
            records = append_records(log.partition(p), rng.randint(1, 4), first=n * 10)
            appended[p] += records
            for record in records:
                await committer.wait_durable(p, record.offset)
                acked[p].append(record)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() / 500)  # a writer's own pace, at random

    async def cutter() -> None:
        for _ in range(12):
            await asyncio.sleep(rng.random() / 50)  # the random moment of the cut
            # Taken at once, while cycles and checkpoints run in their threads.
            cuts.append((fs.snapshot(), copy_of(acked), copy_of(appended)))

    await asyncio.gather(*(writer(p) for p in range(NUM_PARTITIONS)), cutter())
    await committer.close()
    await asyncio.to_thread(log.close)
    assert committer.checkpoints > 0
    return [*cuts, (fs.snapshot(), copy_of(acked), copy_of(appended))]


def copy_of(records: dict[int, list[LogRecord]]) -> dict[int, list[LogRecord]]:
    return {p: list(rs) for p, rs in records.items()}


def model_at_the_cut(
    acked: dict[int, list[LogRecord]], appended: dict[int, list[LogRecord]]
) -> Acknowledged[tuple[int, int], LogRecord]:
    """Each partition's records by position: the acknowledged ones (the first ones: a
    writer waits for each in turn) known, the others appended then maybe there."""
    model: Acknowledged[tuple[int, int], LogRecord] = Acknowledged({})
    for p, records in appended.items():
        for i, record in enumerate(records):
            if i < len(acked[p]):
                assert acked[p][i] == record
                model.acknowledge((p, i), record)
            else:
                model.unanswered((p, i), record)
    return model


def test_recovery_after_a_power_cut_keeps_what_was_acknowledged(tmp_path) -> None:
    data_dir = str(tmp_path / "data")
    open_all(data_dir).close()  # the directory exists, and is on disk, before the run
    cuts = asyncio.run(busy_commits(data_dir, random.Random(932)))
    assert len(cuts) >= 5
    for index, (durable, acked, appended) in enumerate(cuts):
        copy = str(tmp_path / f"cut-{index}")
        materialize(durable, data_dir, copy)
        found = recovered(copy)
        # Acknowledged: there. Anything else: only what was appended, in order.
        by_position = {(p, i): r for p, kept in found.items() for i, r in enumerate(kept)}
        model_at_the_cut(acked, appended).verify(by_position)
        assert verify(copy).ok, index
        once = tree_snapshot(copy)
        assert recovered(copy) == found
        assert tree_snapshot(copy) == once, index  # a second recovery changes nothing
        assert os.path.isdir(partition_dir(copy, 0))
