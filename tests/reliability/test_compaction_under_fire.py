"""Issue #7, item 4: compaction under fire. A compaction running and committing beside a
daemon that is SIGKILLed at random moments loses nothing acknowledged and leaves a log
that verifies.

Each cycle: the daemon starts on the data directory (small segments, its staging scan
every 20 ms), writers load it until there are sealed segments to fold, then
`sharecoord compact` runs against the live directory and one of three things happens:

* the daemon is killed just as staged output appears: its scan commits within 20 ms,
  so the kill lands before, during or after the swap;
* the daemon is killed at a random moment while the job runs (the job then finds the
  lock free and commits by itself);
* the Spark job itself is killed mid-run (its process group, JVM included), then the
  daemon.

After each cycle `sharecoord log verify` must pass, and after each restart every key's
admin state must be one the model allows (model.py): exactly the acknowledged state
where no answer was lost.

The data directory keeps a history from the start (issue #14), so the daemon prunes only
exported segments and the jobs export before they stage. At the end the history and the
live log together hold every offset of every state partition exactly once, however the
kills fell: no duplicate, no gap.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from persistence.history import HistoryConfig, resolve_dir, write_declaration
from spark_jobs.logsource import Source, read_whole_partition
from tests.harness import REPO_ROOT, SHARECOORD, Api, child_env, run_cli, wait_until
from tests.reliability.model import Model
from tests.reliability.traffic import Traffic, admin_states

NUM_PARTITIONS = 4
GROUPS = ["fire-a", "fire-b"]
PARTITIONS_PER_GROUP = 8
WORKERS = 3
WRITES_PER_CYCLE = 150
JOB_TIMEOUT_S = 600


def serve_flags(rng: random.Random) -> list[str]:
    return [
        "--segment-bytes",
        "2048",
        "--compaction-commit-interval-ms",
        "20",
        "--prune-interval-ms",
        str(rng.choice((200, 300000))),
        "--snapshot-update-records-per-snapshot",
        str(rng.choice((0, 3, 500))),
    ]


async def start_compaction(data_dir: Path) -> asyncio.subprocess.Process:
    """`sharecoord compact` in its own process group (the JVM goes with it on a kill)."""
    return await asyncio.create_subprocess_exec(
        *SHARECOORD,
        "compact",
        "--data-dir",
        str(data_dir),
        "--master",
        "local[1]",
        env=child_env(),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )


def keep_a_history(data_dir: Path) -> None:
    write_declaration(str(data_dir), HistoryConfig(resolve_dir(str(data_dir), None), -1))


def history_and_log_offsets(data_dir: Path) -> dict[int, list[int]]:
    """Every offset the history and the live log hold, per state partition, in the order
    a reader (the audit, the data source) gets them."""
    source = Source.open(str(data_dir))
    assert source.history_root is not None, "the history declaration went missing"
    return {
        p: [
            o
            for batch in read_whole_partition(source, p)
            for o in batch.column("log_offset").to_pylist()
        ]
        for p in range(NUM_PARTITIONS)
    }


def staged_output(data_dir: Path) -> bool:
    """Whether some partition has a fully staged compaction output (its manifest)."""
    for partition in range(NUM_PARTITIONS):
        staging = data_dir / "partitions" / str(partition) / "compaction"
        if staging.is_dir() and any(p.suffix == ".manifest" for p in staging.iterdir()):
            return True
    return False


async def staged_or_ended(data_dir: Path, job: asyncio.subprocess.Process) -> bool:
    return job.returncode is not None or await asyncio.to_thread(staged_output, data_dir)


async def compaction_under_fire(spawn, data_dir: Path, cycles: int, seed: int, figures) -> None:
    rng = random.Random(seed)
    model = Model(GROUPS, PARTITIONS_PER_GROUP, NUM_PARTITIONS)
    traffic = Traffic(model, rng)
    lost: list[str] = []
    async with aiohttp.ClientSession() as session:
        for cycle in range(cycles):
            daemon = await spawn(data_dir, *serve_flags(rng), partitions=NUM_PARTITIONS)
            if cycle == 0:
                # Before any traffic, so before anything could be pruned.
                await asyncio.to_thread(keep_a_history, data_dir)
            for key, state in (await admin_states(session, daemon.url, model, rng)).items():
                if not model.reconcile(key, state):
                    lost.append(f"cycle {cycle}, key {key}: {state} not in {model.possible[key]}")
            assert not lost, "\n".join(lost)
            traffic.release_all()

            writers = asyncio.ensure_future(traffic.run(daemon.url, WORKERS))
            target = traffic.acknowledged + WRITES_PER_CYCLE
            await wait_until(
                lambda target=target: traffic.acknowledged >= target,
                f"{WRITES_PER_CYCLE} more requests acknowledged",
            )
            job = await start_compaction(data_dir)
            how = rng.choice(("daemon at the commit", "daemon during the job", "the job"))
            # The pauses before a kill are the random moment it lands, not waits.
            if how == "daemon at the commit":
                # The daemon commits staged output within 20 ms: looked for as often.
                # (A job that stages nothing ends, and the kill lands after it.)
                await wait_until(
                    partial(staged_or_ended, data_dir, job),
                    "the job to stage its output or end",
                    timeout=JOB_TIMEOUT_S,
                    max_pause=0.002,
                )
                if job.returncode is None:
                    await asyncio.sleep(rng.random() * 0.03)  # the kill's moment
                    figures.add("daemon_kills_at_a_commit")
            elif how == "daemon during the job":
                await asyncio.sleep(rng.uniform(0.5, 8.0))  # the kill's moment
                figures.add("daemon_kills_during_a_job")
            else:
                await asyncio.sleep(rng.uniform(1.0, 8.0))  # the kill's moment
                if job.returncode is None:
                    os.killpg(job.pid, signal.SIGKILL)
                    figures.add("jobs_killed")
            os.kill(daemon.pid, signal.SIGKILL)
            assert await asyncio.to_thread(daemon.wait) == -signal.SIGKILL
            await writers
            output, _ = await asyncio.wait_for(job.communicate(), JOB_TIMEOUT_S)
            # 0: compacted; 1: a partition changed under it (reported, nothing harmed);
            # -9: killed. Never a crash that leaves the log damaged.
            assert job.returncode in (0, 1, -signal.SIGKILL), output.decode(errors="replace")
            figures.add("compactions_run")
            verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
            assert verify.returncode == 0, (cycle, how, verify.stdout + verify.stderr)

        daemon = await spawn(data_dir, partitions=NUM_PARTITIONS)
        for key, state in (await admin_states(session, daemon.url, model, rng)).items():
            if not model.reconcile(key, state):
                lost.append(f"final, key {key}: {state} not in {model.possible[key]}")
        await Api(session, daemon.url).wait_ready()
        assert await asyncio.to_thread(daemon.terminate) == 0
    verify = await asyncio.to_thread(run_cli, "log", "verify", "--data-dir", str(data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    offsets_seen = await asyncio.to_thread(history_and_log_offsets, data_dir)
    for partition, offsets in offsets_seen.items():
        assert offsets == list(range(len(offsets))), (
            f"state partition {partition}: history + log hold offsets "
            f"{sorted(set(range(max(offsets, default=-1) + 1)) - set(offsets))[:10]} "
            f"missing, {len(offsets) - len(set(offsets))} duplicated"
        )
    figures.add("offsets_in_history_and_log", sum(map(len, offsets_seen.values())))
    figures.add("cycles_survived", cycles)
    figures.add("requests_acknowledged", traffic.acknowledged)
    figures.add("writes_lost", len(lost))
    assert not lost, "\n".join(lost)


@pytest.mark.spark
async def test_compaction_under_fire_loses_nothing_acknowledged(spawn, tmp_path, figures):
    await compaction_under_fire(spawn, tmp_path / "data", cycles=2, seed=3, figures=figures)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(5400)
async def test_compaction_under_fire_long(spawn, tmp_path, figures):
    await compaction_under_fire(spawn, tmp_path / "data", cycles=30, seed=4, figures=figures)
