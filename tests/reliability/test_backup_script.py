"""The backup script of docs/operations.md ("A file copy while the daemon runs"), taken
from the document as it is written there, against a daemon that prunes and checkpoints
every few milliseconds while writers keep writing. Each copy must pass `log verify`
(the script's last step), load in a daemon of its own with every state partition
active, and show each key at a state it really had while the copy was made: at least
what was acknowledged before the script started, at most what was sent before it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.harness import (
    INITIAL,
    REPO_ROOT,
    TOPIC,
    AcknowledgedGroup,
    Api,
    Expected,
    body,
    child_env,
    next_write,
)
from tests.planted_history import history_of, plant_history

NUM_PARTITIONS = 8
KEYS = 16
WORKERS = 4
GROUP = "backup-group"

# Small segments and a prune and a checkpoint every few milliseconds: segments of the
# partitions and of the journal go away while the script copies them.
BUSY_FLAGS = (
    "--segment-bytes",
    "2048",
    "--prune-interval-ms",
    "20",
    "--snapshot-update-records-per-snapshot",
    "0",
    "--journal-segment-bytes",
    str(64 * 1024),
    "--journal-checkpoint-interval-ms",
    "20",
    "--journal-checkpoint-bytes",
    "1",
)


def backup_script() -> str:
    """The sh block of docs/operations.md that starts with the script's name line."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    scripts = [b for b in blocks if "# sharecoord-backup DATA BACKUP" in b]
    assert len(scripts) == 1, "docs/operations.md must hold the backup script once"
    return scripts[0]


class History:
    """Per key: every state written in order (0 is the state after initialize), how
    many of them were acknowledged and how many were sent."""

    def __init__(self) -> None:
        self.states: list[list[Expected]] = [[INITIAL] for _ in range(KEYS)]
        self.acked = [0] * KEYS
        self.sent = [0] * KEYS


async def write_forever(api: Api, keys: list[int], history: History, seed: int) -> None:
    rng = random.Random(seed)
    while True:
        key = rng.choice(keys)
        entry, expected = next_write(rng, key, history.states[key][-1])
        history.states[key].append(expected)
        history.sent[key] = len(history.states[key]) - 1
        codes = await api.codes("write", body(GROUP, (TOPIC, [entry])))
        assert codes == [0], codes
        history.acked[key] = len(history.states[key]) - 1


@contextlib.asynccontextmanager
async def restored(spawn: Any, backup: Path) -> AsyncIterator[Api]:
    """A daemon on the copy, with every state partition active; stopped cleanly after."""
    daemon = await spawn(backup, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url)
        partitions = (await api.request("GET", "/v1/admin/partitions")).body
        assert {p["status"] for p in partitions["partitions"]} == {"active"}, partitions
        yield api
    assert await asyncio.to_thread(daemon.terminate) == 0


def run_script(script: Path, data_dir: Path, backup: Path) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run(
        ["sh", str(script), str(data_dir), str(backup)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.asyncio
async def test_copies_of_a_busy_daemon_restore_to_a_state_it_had(
    spawn, tmp_path: Path, figures
) -> None:
    script = tmp_path / "sharecoord-backup"
    await asyncio.to_thread(script.write_text, await asyncio.to_thread(backup_script))
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, *BUSY_FLAGS, partitions=NUM_PARTITIONS)
    history = History()
    windows: list[tuple[Path, list[int], list[int]]] = []
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        init = [{"partition": k, "state_epoch": 1, "start_offset": 0} for k in range(KEYS)]
        assert await api.codes("initialize", body(GROUP, (TOPIC, init))) == [0] * KEYS
        writers = [
            asyncio.create_task(write_forever(api, list(range(w, KEYS, WORKERS)), history, w))
            for w in range(WORKERS)
        ]
        try:
            for attempt in range(3):
                await asyncio.sleep(0.5)  # let segments and journal segments pile up
                backup = tmp_path / f"backup-{attempt}"
                acked_before = list(history.acked)
                done = await asyncio.to_thread(run_script, script, data_dir, backup)
                sent_after = list(history.sent)
                assert done.returncode == 0, done.stdout + done.stderr
                assert done.stdout.splitlines()[-1].startswith("ok:"), done.stdout
                figures.add("backups", 1)
                figures.add("journal_copies_repeated", done.stderr.count("(checkpoint)"))
                figures.add("partition_copies_repeated", done.stderr.count("(pruned)"))
                windows.append((backup, acked_before, sent_after))
        finally:
            for writer in writers:
                writer.cancel()
            results = await asyncio.gather(*writers, return_exceptions=True)
        for result in results:
            if not isinstance(result, asyncio.CancelledError):
                raise result
    figures.set("writes_acknowledged", sum(history.acked))
    assert await asyncio.to_thread(daemon.terminate) == 0

    for backup, acked_before, sent_after in windows:
        # The copy holds, per key, the state last acknowledged before it began or one
        # written after it, up to the last sent before it ended (answered or not then).
        model = AcknowledgedGroup(GROUP, range(KEYS))
        for key in range(KEYS):
            model.acknowledge(key, history.states[key][acked_before[key]])
            model.unanswered(key, *history.states[key][acked_before[key] + 1 : sent_after[key] + 1])
        async with restored(spawn, backup) as api:
            shown = {key: await api.state(GROUP, TOPIC, key) for key in range(KEYS)}
        wrong = model.mismatches(shown)
        assert not wrong, (backup.name, wrong)
        await asyncio.to_thread(shutil.rmtree, backup)


@pytest.mark.asyncio
async def test_the_copy_carries_the_history(spawn, tmp_path: Path) -> None:
    """A history inside the data directory (what compaction leaves: history.json, Parquet
    files, export markers) is in the copy byte for byte; without it the restored node
    would lose the audit trail of everything compaction had folded."""
    script = tmp_path / "sharecoord-backup"
    await asyncio.to_thread(script.write_text, await asyncio.to_thread(backup_script))
    data_dir = tmp_path / "data"
    daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
    async with aiohttp.ClientSession() as session:
        api = Api(session, daemon.url, "msgpack")
        init = [{"partition": k, "state_epoch": 1, "start_offset": 0} for k in range(KEYS)]
        assert await api.codes("initialize", body(GROUP, (TOPIC, init))) == [0] * KEYS
    planted = await asyncio.to_thread(plant_history, data_dir, [1, 5])
    backup = tmp_path / "backup"
    done = await asyncio.to_thread(run_script, script, data_dir, backup)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("ok:"), done.stdout
    assert await asyncio.to_thread((backup / "history.json").read_bytes) == (
        await asyncio.to_thread((data_dir / "history.json").read_bytes)
    )
    for partition, files in planted.items():
        assert await asyncio.to_thread(history_of, backup / "history", partition) == files
    assert await asyncio.to_thread(daemon.terminate) == 0
    async with restored(spawn, backup) as api:
        for key in range(KEYS):
            assert INITIAL.matches(await api.state(GROUP, TOPIC, key))
