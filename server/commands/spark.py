"""``sharecoord compact`` and ``sharecoord audit``: the Spark jobs' launchers
(``spark_jobs.submit``), after the checks that take an instant instead of a JVM's start:
the data directory, the spark extra, a java, the job's own preconditions.

The one module of the daemon's package that imports ``spark_jobs`` (tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from persistence import LogError, read_meta
from persistence.store_uri import masked
from server.commands import preflight
from server.commands.common import add_command, os_error_text, refuse
from server.config import AUDIT_SETTINGS, COMPACT_SETTINGS, ConfigError, load_settings
from spark_jobs import submit
from spark_jobs.preflight import anything_to_compact, checkpoint_problem, history_problem


def add_commands(subparsers: Any) -> None:
    """Add `compact` and `audit` to the `sharecoord` command's subparsers."""
    add_command(
        subparsers,
        "compact",
        run_compact,
        COMPACT_SETTINGS,
        help="compact the state log with Spark: one ShareSnapshot per live key",
        description="Fold each state partition's sealed segments into one ShareSnapshot "
        "per live key and commit them (or leave them to the running daemon).",
    )
    add_command(
        subparsers,
        "audit",
        run_audit,
        AUDIT_SETTINGS,
        help="audit delivery counts with Spark; exit 1 if violations are found",
        description="Replay the whole state log and report delivery-count histograms, "
        "the most redelivered offsets and violations (JSON, Parquet, PNG, HTML).",
    )


# What each Spark job imports beyond the core install (the `spark` extra).
_SPARK_MODULES = {"compact": ("pyspark",), "audit": ("pyspark", "matplotlib")}


def run_compact(args: argparse.Namespace) -> int:
    values = load_settings(COMPACT_SETTINGS, args)
    _not_on_postgres(values["state_store"], "compact")
    data_dir = _checked_data_dir(values["data_dir"])
    _check_spark("compact")
    history_dir = values["history_dir"]
    problem = history_problem(data_dir, history_dir, values["history_retention_ms"])
    refuse(problem)
    if not anything_to_compact(data_dir):
        # No JVM for nothing: the one line an operator needs.
        print(f"nothing to compact: no sealed segments (segments roll at "
              f"{values['segment_bytes']} bytes)")  # fmt: skip
        return 0
    job_args = ["--data-dir", data_dir]
    job_args += ["--tombstone-retention-ms", str(values["tombstone_retention_ms"])]
    job_args += ["--history-retention-ms", str(values["history_retention_ms"])]
    job_args += ["--segment-bytes", str(values["segment_bytes"])]
    if history_dir is not None:
        job_args += ["--history-dir", os.path.abspath(history_dir)]
    return submit.run_job(
        "compact", values["master"], job_args, env_cache=values["spark_env_cache"]
    )


def run_audit(args: argparse.Namespace) -> int:
    values = load_settings(AUDIT_SETTINGS, args, required=("out",))
    _not_on_postgres(values["state_store"], "audit")
    data_dir = _checked_data_dir(values["data_dir"])
    out = os.path.abspath(values["out"])
    _check_spark("audit")
    # Last, as it makes the directory: only once nothing else stands in the way.
    refuse(preflight.writable_directory(out, "--out"))
    refuse(checkpoint_problem(out, data_dir, values["delivery_limit"], values["since_last"]))
    job_args = ["--data-dir", data_dir, "--out", out]
    job_args += ["--delivery-limit", str(values["delivery_limit"])]
    if values["since_last"]:
        job_args.append("--since-last")
    return submit.run_job("audit", values["master"], job_args, env_cache=values["spark_env_cache"])


def _not_on_postgres(state_store: str | None, command: str) -> None:
    """The jobs read a data directory's segments; over the PostgreSQL store's tables
    they are the next step (issue 23 leaves them to the next issue): said in one line,
    before anything starts."""
    if state_store is not None:
        raise ConfigError(
            f"state_store is {masked(state_store)}: sharecoord {command} runs on a data "
            "directory only, the Spark jobs on the PostgreSQL store are not there yet; "
            "unset state_store (SHARECOORD_STATE_STORE) and give --data-dir"
        )


def _checked_data_dir(data_dir: str) -> str:
    """The data directory as an absolute path (executors may run elsewhere); a
    ConfigError says why it is not one."""
    refuse(preflight.data_directory_problem(data_dir, created_if_missing=False))
    try:
        read_meta(data_dir)
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--data-dir {data_dir}: {os_error_text(exc)}") from None
    return os.path.abspath(data_dir)


def _check_spark(command: str) -> None:
    """pyspark (and what the job imports) installed, and a java for its JVM: checked
    here, in an instant, instead of by a JVM that fails seconds later."""
    refuse(preflight.missing_modules(_SPARK_MODULES[command], f"sharecoord {command}"))
    refuse(preflight.java_problem(os.environ))
