"""The incremental audit's checkpoint, kept in the audit's output directory:

    OUT/checkpoint/checkpoint.json      {"format": 1, "data_dir", "delivery_limit", "runs",
                                         "first_run_at", "last_run_at",
                                         "partitions": {"<p>": "<state file>"}}
    OUT/checkpoint/<run>-<p>.state      one state partition's auditor, dumped
                                         (spark_jobs/auditor.py: Auditor.dump)

Every audit writes it; ``--since-last`` goes on from it. The state files of a run are
written first under new names, then checkpoint.json is replaced atomically, then the
previous run's files are deleted: a crash anywhere leaves the old checkpoint or the new
one, never a mix. No pyspark here: the CLI checks a checkpoint before any JVM starts.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from persistence.history import make_dirs, write_json_atomically

DIRECTORY = "checkpoint"
INDEX = "checkpoint.json"
FORMAT = 1


@dataclass
class Checkpoint:
    data_dir: str
    delivery_limit: int
    runs: int = 0
    first_run_at: int = 0
    last_run_at: int = 0
    partitions: dict[int, str] = field(default_factory=dict)


def directory(out_dir: str) -> str:
    return os.path.join(out_dir, DIRECTORY)


def read_checkpoint(out_dir: str) -> Checkpoint | None:
    """The checkpoint in `out_dir`, None if there is none. ValueError if unreadable."""
    path = os.path.join(directory(out_dir), INDEX)
    try:
        with open(path, "rb") as f:
            document: Any = json.loads(f.read())
        if document.get("format") != FORMAT:
            raise ValueError(f"unknown format {document.get('format')!r}")
        return Checkpoint(
            str(document["data_dir"]),
            int(document["delivery_limit"]),
            int(document["runs"]),
            int(document["first_run_at"]),
            int(document["last_run_at"]),
            {int(p): str(name) for p, name in document["partitions"].items()},
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not an audit checkpoint: {exc}") from None


def problem(out_dir: str, data_dir: str, delivery_limit: int, since_last: bool) -> str | None:
    """Why `--since-last` cannot go on from the checkpoint in `out_dir`, or None."""
    if not since_last:
        return None
    try:
        checkpoint = read_checkpoint(out_dir)
    except ValueError as exc:
        return f"--since-last: {exc}; run a full audit (without --since-last) to start over"
    if checkpoint is None:
        return None  # the first run audits everything
    if os.path.abspath(checkpoint.data_dir) != os.path.abspath(data_dir):
        return (
            f"--since-last: the checkpoint in --out {out_dir} is of {checkpoint.data_dir}, not "
            f"{data_dir}: give each data directory its own --out"
        )
    if checkpoint.delivery_limit != delivery_limit:
        return (
            f"--since-last: the checkpoint in --out {out_dir} was audited with --delivery-limit "
            f"{checkpoint.delivery_limit}; go on with it, or run a full audit with "
            f"{delivery_limit}"
        )
    return None


def load_states(out_dir: str, checkpoint: Checkpoint) -> dict[int, bytes]:
    states = {}
    for partition, name in checkpoint.partitions.items():
        with open(os.path.join(directory(out_dir), name), "rb") as f:
            states[partition] = f.read()
    return states


def write_checkpoint(
    out_dir: str, previous: Checkpoint | None, fresh: Checkpoint, states: dict[int, bytes]
) -> Checkpoint:
    """Write this run's states and make them the checkpoint; `states` lacks partitions
    whose state did not change (their previous file stays)."""
    folder = directory(out_dir)
    make_dirs(folder)
    now = time.time_ns() // 1_000_000
    run = (previous.runs if previous else 0) + 1
    fresh.runs, fresh.last_run_at = run, now
    fresh.first_run_at = previous.first_run_at if previous else now
    for partition, state in states.items():
        name = f"{run}-{partition}.state"
        with open(os.path.join(folder, name), "wb") as f:
            f.write(state)
            f.flush()
            os.fsync(f.fileno())
        fresh.partitions[partition] = name
    write_json_atomically(
        os.path.join(folder, INDEX),
        {
            "format": FORMAT,
            "data_dir": fresh.data_dir,
            "delivery_limit": fresh.delivery_limit,
            "runs": fresh.runs,
            "first_run_at": fresh.first_run_at,
            "last_run_at": fresh.last_run_at,
            "partitions": {str(p): n for p, n in sorted(fresh.partitions.items())},
        },
    )
    keep = set(fresh.partitions.values()) | {INDEX}
    for name in os.listdir(folder):
        if name not in keep and not name.startswith("."):
            os.unlink(os.path.join(folder, name))
    return fresh
