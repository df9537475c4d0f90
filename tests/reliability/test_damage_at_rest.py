"""Issue #7, item 3: damage at rest, against the daemon end to end.

The corruption table of the log's own tests (tests/persistence/
test_recovery_corruption_table.py and test_recovery_half_done_swap_table.py), applied to a
data directory a real daemon wrote and then started on by a real daemon:

* a torn tail (the last record truncated at any byte, the tail sector zeroed, a bit
  flipped in the last frame) is cut, a ``*.broken`` copy of the cut bytes is kept, and
  the partition serves exactly what was acknowledged before the damaged record;
* damage in the middle (a bit flipped mid-file, a zeroed sector in the newest segment
  followed by whole frames, or in an older segment) fails that partition alone: its keys
  answer 15, ``/v1/admin/partitions`` shows ``status: failed`` with an ``error`` naming
  the file and the byte offset, ``/readyz`` lists it, and every other partition serves;
* a compaction swap interrupted at any step is finished or rolled back, and the
  partition serves the same state.

Each daemon start checks several damaged partitions at once (one row per partition); one
partition is always left intact.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import aiohttp
import pytest

from persistence import (
    FaultInjectingFileOps,
    SwapIncompleteError,
    commit_staged,
    list_segments,
    partition_dir,
    write_staged,
)
from persistence.frame import iter_frames
from tests.harness import (
    INITIAL,
    TOPIC,
    Api,
    Expected,
    body,
    init_entry,
    next_write,
    partitions_in,
    read_entry,
    run_cli,
)
from tests.persistence.log_helpers import fold_sealed

NUM_PARTITIONS = 6
INTACT = 0  # never damaged
SEGMENT_BYTES = 1024
SECTOR = 512
GROUP = "rest"
FLAGS = (
    "--segment-bytes",
    str(SEGMENT_BYTES),
    "--prune-interval-ms",
    "600000",
    "--cold-partition-snapshot-interval-ms",
    "600000",
    "--compaction-commit-interval-ms",
    "600000",
)


@dataclass
class Built:
    """A data directory a daemon wrote and stopped cleanly. Per partition: its keys (the
    first is written again and again, the others only initialized) and the state of the
    first key after each of the partition's records, in log order."""

    data_dir: Path
    keys: dict[int, list[int]]
    history: dict[int, list[Expected | None]]  # after record n of the partition

    def frames(self, partition: int) -> list[tuple[str, int, int]]:
        """(segment path, start, end) of every frame of the partition, in log order."""
        out = []
        for segment in list_segments(partition_dir(str(self.data_dir), partition)):
            with open(segment.path, "rb") as f:
                data = f.read()
            starts = [pos for pos, _ in iter_frames(data)] + [len(data)]
            out += [(segment.path, a, b) for a, b in itertools.pairwise(starts)]
        return out


async def build(spawn, directory: Path, rng: random.Random) -> Built:
    data_dir = directory / "built"
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    keys = {p: partitions_in(p, NUM_PARTITIONS, group_id=GROUP, count=3) for p in range(6)}
    history: dict[int, list[Expected | None]] = {}
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        for p, ks in keys.items():
            entries = [init_entry(k, 1, 0) for k in ks]
            assert await api.codes("initialize", body(GROUP, (TOPIC, entries))) == [0] * 3
            # Key 0 is the one whose state follows the records; the others were only
            # initialized (records 1 and 2, before key 0 is ever written).
            history[p] = [INITIAL, INITIAL, INITIAL]
            state = INITIAL
            while True:
                entry, state = next_write(rng, ks[0], state)
                assert await api.codes("write", body(GROUP, (TOPIC, [entry]))) == [0]
                history[p].append(state)
                segments = await asyncio.to_thread(list_segments, partition_dir(str(data_dir), p))
                # Enough for every row: older segments, and a newest one with its last
                # sector followed by nothing and its first sector followed by frames.
                if len(segments) >= 4 and segments[-1].size_bytes > SECTOR + 200:
                    break
    assert await asyncio.to_thread(daemon.terminate) == 0
    return Built(data_dir, keys, history)


# --- the rows -------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: Literal["clean", "torn", "corrupt"]
    kept: int = 0  # records of the partition the daemon must keep (clean / torn)
    path: str = ""  # the damaged file (corrupt) or the cut one (torn)
    position: int = 0  # where the damage is named (corrupt) or the cut is (torn)
    cut: bytes = b""  # what a torn tail's .broken file must hold


Damage = Callable[[Built, int], Outcome]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _overwrite(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def _flip(path: str, position: int, bit: int = 3) -> None:
    _overwrite(path, position, bytes([_read(path)[position] ^ (1 << bit)]))


def truncate_last_record_at(cut: int) -> Damage:
    def damage(built: Built, p: int) -> Outcome:
        frames = built.frames(p)
        path, start, _ = frames[-1]
        tail = _read(path)[start:]
        os.truncate(path, start + cut)
        if cut == 0:  # the file now ends on a frame boundary: nothing is torn
            return Outcome("clean", len(frames) - 1)
        return Outcome("torn", len(frames) - 1, path, start, tail[:cut])

    damage.__name__ = f"truncate-last-record-at-byte-{cut}"
    return damage


def zero_the_tail_sector_of_the_newest(built: Built, p: int) -> Outcome:
    frames = built.frames(p)
    path = frames[-1][0]
    size = os.path.getsize(path)
    sector = (size - 1) // SECTOR * SECTOR
    index = next(i for i, (f, a, b) in enumerate(frames) if f == path and a <= sector < b)
    start = frames[index][1]
    cut = _read(path)[start:]
    _overwrite(path, sector, b"\0" * (size - sector))
    cut = cut[: sector - start] + b"\0" * (size - sector)
    return Outcome("torn", index, path, start, cut)


def zero_the_first_sector_of_the_newest(built: Built, p: int) -> Outcome:
    path = built.frames(p)[-1][0]
    _overwrite(path, 0, b"\0" * SECTOR)  # whole frames follow the sector
    return Outcome("corrupt", path=path, position=0)


def zero_a_sector_of_an_older_segment(built: Built, p: int) -> Outcome:
    frames = built.frames(p)
    path = frames[0][0]
    start = next(a for f, a, b in frames if f == path and a <= SECTOR < b)
    _overwrite(path, SECTOR, b"\0" * SECTOR)
    return Outcome("corrupt", path=path, position=start)


def flip_a_bit_mid_newest(built: Built, p: int) -> Outcome:
    frames = built.frames(p)
    path = frames[-1][0]
    mine = [(a, b) for f, a, b in frames if f == path]
    start, end = mine[len(mine) // 2 - 1]  # valid frames follow it
    _flip(path, (start + end) // 2)
    return Outcome("corrupt", path=path, position=start)


def flip_a_bit_mid_older(built: Built, p: int) -> Outcome:
    frames = built.frames(p)
    path = frames[0][0]
    middle = os.path.getsize(path) // 2
    start = next(a for f, a, b in frames if f == path and a <= middle < b)
    _flip(path, middle)
    return Outcome("corrupt", path=path, position=start)


def flip_a_bit_in_the_last_frame(built: Built, p: int) -> Outcome:
    """Indistinguishable from a torn last write: treated as one."""
    frames = built.frames(p)
    path, start, end = frames[-1]
    _flip(path, (start + end) // 2)
    return Outcome("torn", len(frames) - 1, path, start, _read(path)[start:end])


DAMAGE_ROWS: list[Damage] = [
    zero_the_tail_sector_of_the_newest,
    zero_the_first_sector_of_the_newest,
    zero_a_sector_of_an_older_segment,
    flip_a_bit_mid_newest,
    flip_a_bit_mid_older,
    flip_a_bit_in_the_last_frame,
]


# --- checking a daemon on damaged partitions --------------------------------------------


async def apply_rows(
    spawn, built: Built, workdir: Path, rows: list[tuple[int, Damage]], figures
) -> None:
    """Copy the built directory, damage one partition per row, start a daemon on it, and
    check every partition's outcome."""
    data_dir = workdir / "damaged"
    await asyncio.to_thread(_fresh_copy, built.data_dir, data_dir)
    moved = Built(data_dir, built.keys, built.history)
    outcomes = {p: await asyncio.to_thread(row, moved, p) for p, row in rows}
    names = {p: getattr(row, "__name__", str(row)) for p, row in rows}
    daemon = await spawn(data_dir, *FLAGS, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "json")
        listing = (await api.request("GET", "/v1/admin/partitions")).body["partitions"]
        ready = await api.readyz()
        corrupt = sorted(p for p, o in outcomes.items() if o.kind == "corrupt")
        assert ready.status == 200, ready.body
        assert ready.body["failed_partitions"] == corrupt, (names, ready.body)
        for p in range(NUM_PARTITIONS):
            outcome = outcomes.get(p, Outcome("clean", len(built.history[p])))
            where = (p, names.get(p, "intact"), outcome)
            status = listing[p]
            if outcome.kind == "corrupt":
                assert status["status"] == "failed", (where, status)
                error = status["error"]
                assert f"{outcome.path}: damaged log at byte {outcome.position}" in error, (
                    where,
                    error,
                )
                await expect_unavailable(api, built.keys[p])
                continue
            assert status["status"] == "active", (where, status)
            expected = built.history[p][outcome.kept - 1]
            state = await api.state(GROUP, TOPIC, built.keys[p][0])
            assert expected is not None and expected.matches(state), (where, expected, state)
            for other in built.keys[p][1:]:
                assert INITIAL.matches(await api.state(GROUP, TOPIC, other)), where
            if outcome.kind == "torn":
                broken = f"{outcome.path}.{outcome.position}.broken"
                assert await asyncio.to_thread(_read, broken) == outcome.cut, where
                size = await asyncio.to_thread(os.path.getsize, outcome.path)
                assert size == outcome.position, where
            # And appends work on what was kept.
            entry, after = next_write(random.Random(p), built.keys[p][0], expected)
            assert await api.codes("write", body(GROUP, (TOPIC, [entry]))) == [0], where
            assert after.matches(await api.state(GROUP, TOPIC, built.keys[p][0])), where
    assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == (1 if corrupt else 0), verify.stdout + verify.stderr
    for p in corrupt:
        assert f"{outcomes[p].path}: byte {outcomes[p].position}" in verify.stdout, verify.stdout
    figures.add("daemon_starts")
    figures.add("damaged_partitions", len(rows))


def _fresh_copy(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)


async def expect_unavailable(api: Api, keys: list[int]) -> None:
    """Every RPC on a failed partition's keys answers 15; admin state 503 / 15."""
    entries = [read_entry(k, 0) for k in keys]
    assert set(await api.codes("read", body(GROUP, (TOPIC, entries)))) == {15}
    assert set(await api.codes("read-summary", body(GROUP, (TOPIC, entries)))) == {15}
    reply = await api.admin_state(GROUP, TOPIC, keys[0])
    assert (reply.status, reply.body["error_code"]) == (503, 15), reply.body


def in_groups(rows: list[Damage]) -> list[list[tuple[int, Damage]]]:
    """Rows spread over the damageable partitions, one daemon start per group."""
    damageable = [p for p in range(NUM_PARTITIONS) if p != INTACT]
    groups = []
    for at in range(0, len(rows), len(damageable)):
        chunk = rows[at : at + len(damageable)]
        groups.append(list(zip(damageable, chunk, strict=False)))
    return groups


@pytest.fixture
def built(spawn, tmp_path):
    async def make() -> Built:
        return await build(spawn, tmp_path, random.Random(7))

    return make


async def test_torn_tails_and_damage_in_the_middle(built, spawn, tmp_path, figures):
    made = await built()
    for group in in_groups(DAMAGE_ROWS):
        await apply_rows(spawn, made, tmp_path, group, figures)


def _last_frame_lengths(built: Built) -> dict[int, int]:
    lengths = {}
    for p in range(NUM_PARTITIONS):
        _, start, end = built.frames(p)[-1]
        lengths[p] = end - start
    return lengths


async def test_the_last_record_truncated_at_sample_bytes(built, spawn, tmp_path, figures):
    made = await built()
    length = min((await asyncio.to_thread(_last_frame_lengths, made)).values())
    cuts = sorted({0, 1, 3, 4, 8, 29, 30, 33, length // 2, length - 1})
    for group in in_groups([truncate_last_record_at(cut) for cut in cuts]):
        await apply_rows(spawn, made, tmp_path, group, figures)


@pytest.mark.slow
async def test_the_last_record_truncated_at_every_byte(built, spawn, tmp_path, figures):
    """Every byte of every damageable partition's last record: each daemon start cuts
    each partition at its next byte."""
    made = await built()
    lengths = await asyncio.to_thread(_last_frame_lengths, made)
    damageable = [p for p in range(NUM_PARTITIONS) if p != INTACT]
    for cut in range(max(lengths[p] for p in damageable)):
        group = [(p, truncate_last_record_at(cut)) for p in damageable if cut < lengths[p]]
        await apply_rows(spawn, made, tmp_path, group, figures)


# --- a compaction swap interrupted at each step -------------------------------------------


@dataclass(frozen=True)
class Fault:
    op: str
    path_contains: str  # "{p}" stands for the partition
    after: int = 0
    short_write: bool = False


# (fault while staging, fault while committing, commit at all) per step, as in
# tests/persistence/test_recovery_half_done_swap_table.py.
SWAP_STEPS: dict[str, tuple[Fault | None, Fault | None, bool]] = {
    "cleaned-partially-written": (Fault("write", ".cleaned", short_write=True), None, False),
    "cleaned-without-manifest": (Fault("open", ".manifest.tmp"), None, False),
    "manifest-temp-not-renamed": (Fault("rename", ".manifest.tmp"), None, False),
    "manifest-written": (None, None, False),
    "cleaned-fsync-at-commit-failed": (None, Fault("fsync", ".cleaned"), True),
    "rename-to-swap-failed": (None, Fault("rename", ".cleaned"), True),
    "renamed-to-swap": (None, Fault("unlink", "partitions/{p}/0000"), True),
    "some-replaced-deleted": (None, Fault("unlink", "partitions/{p}/0000", after=1), True),
    "all-replaced-deleted": (None, Fault("rename", ".swap"), True),
    "renamed-to-log": (None, Fault("unlink", ".manifest"), True),
    "manifest-removed": (None, None, True),
}


def _injecting(fault: Fault | None, p: int) -> FaultInjectingFileOps:
    fs = FaultInjectingFileOps()
    if fault is not None:
        fs.fail(
            fault.op,
            errno.EIO,
            path_contains=fault.path_contains.format(p=p),
            after=fault.after,
            short_write=fault.short_write,
        )
    return fs


def swap_interrupted_at(step: str) -> Damage:
    stage_fault, commit_fault, commit = SWAP_STEPS[step]

    def damage(built: Built, p: int) -> Outcome:
        directory = partition_dir(str(built.data_dir), p)
        base, frames, replaced = fold_sealed(directory)
        crashed = False
        try:
            write_staged(directory, base, frames, replaced, fs=_injecting(stage_fault, p))
            if commit:
                commit_staged(directory, base, fs=_injecting(commit_fault, p))
        except (OSError, SwapIncompleteError):
            crashed = True  # the process "crashes" here
        assert crashed == (stage_fault is not None or commit_fault is not None), step
        # Compaction keeps the state: the partition serves all it held.
        return Outcome("clean", len(built.history[p]))

    damage.__name__ = f"swap-{step}"
    return damage


async def test_a_compaction_swap_interrupted_at_each_step(built, spawn, tmp_path, figures):
    made = await built()
    rows = [swap_interrupted_at(step) for step in SWAP_STEPS]
    for group in in_groups(rows):
        await apply_rows(spawn, made, tmp_path, group, figures)
