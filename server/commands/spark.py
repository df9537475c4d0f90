"""``sharecoord compact`` and ``sharecoord audit``: the Spark jobs' launchers
(``spark_jobs.submit``), after the checks that take an instant instead of a JVM's start:
the data directory (or the PostgreSQL store: reachable, a sharecoord store in that
schema), the spark extra, a java, the job's own preconditions.

The one module of the daemon's package that imports ``spark_jobs`` (tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from persistence import LogError, read_meta
from persistence.store_uri import is_postgres_uri, masked
from server import native
from server.commands import preflight
from server.commands.common import add_command, os_error_text, refuse
from server.config import AUDIT_SETTINGS, COMPACT_SETTINGS, ConfigError, load_settings
from spark_jobs import submit
from spark_jobs.preflight import anything_to_compact, checkpoint_problem, history_problem
from spark_jobs.storeref import STATE_STORE_ENV, StoreRef


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
    if values["state_store"] is not None:
        return _compact_on_store(values)
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
    return _submit("compact", values, job_args)


def run_audit(args: argparse.Namespace) -> int:
    values = load_settings(AUDIT_SETTINGS, args, required=("out",))
    store = _checked_store(values, "audit")
    data_dir = _checked_data_dir(values["data_dir"]) if store is None else str(store)
    out = os.path.abspath(values["out"])
    _check_spark("audit", store)
    if store is not None:
        _reachable(store)
    # Last, as it makes the directory: only once nothing else stands in the way.
    refuse(preflight.writable_directory(out, "--out"))
    refuse(checkpoint_problem(out, data_dir, values["delivery_limit"], values["since_last"]))
    job_args = ["--out", out]
    job_args += _location_args(store, data_dir)
    job_args += ["--delivery-limit", str(values["delivery_limit"])]
    if values["since_last"]:
        job_args.append("--since-last")
    return _submit("audit", values, job_args)


def _submit(job: str, values: dict[str, Any], job_args: list[str]) -> int:
    return submit.run_job(
        job,
        values["master"],
        job_args,
        env_cache=values["spark_env_cache"],
        class_cache=values["spark_class_cache"],
        compiled_root=_compiled_root(),
    )


def _compiled_root() -> str | None:
    """The checkout whose compiled modules (server/native.py) this command imports, if
    their build is of the sources as they are: a local master's executors import them
    too. With a stale build (which `serve` refuses) the executors run the sources."""
    if not native.compiled_modules() or native.stale_build() is not None:
        return None
    return str(native.ROOT)


def _compact_on_store(values: dict[str, Any]) -> int:
    """compact over a PostgreSQL store (spark_jobs/pgcompact.py)."""
    store = _checked_store(values, "compact")
    assert store is not None
    if values["history_dir"] is not None:
        raise ConfigError(
            "history_dir is for a data directory: on the PostgreSQL store the history is "
            f"the table {store.schema}.sharecoord_history; unset history_dir"
        )
    _check_spark("compact", store)
    _reachable(store)
    job_args = _location_args(store, "")
    job_args += ["--tombstone-retention-ms", str(values["tombstone_retention_ms"])]
    job_args += ["--history-retention-ms", str(values["history_retention_ms"])]
    return _submit("compact", values, job_args)


def _checked_store(values: dict[str, Any], command: str) -> StoreRef | None:
    """The PostgreSQL store the settings name, None for the data directory; a
    ConfigError (shown masked) for a URI that is not PostgreSQL's."""
    uri = values["state_store"]
    if uri is None:
        return None
    if not is_postgres_uri(uri):
        raise ConfigError(
            f"state_store = {masked(uri)} is not a PostgreSQL URI: give "
            f"postgresql://USER@HOST:PORT/DATABASE, or leave it unset for sharecoord "
            f"{command} to read --data-dir"
        )
    return StoreRef(uri, values["state_store_schema"])


def _reachable(store: StoreRef) -> None:
    """The store answers and holds a sharecoord store in that schema: said in one line
    (exit 1, as `cluster status`), before any JVM starts."""
    # Only here: the driver (psycopg) is needed on the PostgreSQL store alone.
    from spark_jobs.pgsource import store_facts

    try:
        store_facts(store)
    except OSError:
        raise  # StoreUnavailableError: a failed operation, one line (exit 1)
    except LogError as exc:
        raise OSError(str(exc)) from None


def _location_args(store: StoreRef | None, data_dir: str) -> list[str]:
    """What the job is told of where the state is: the data directory, or the store's
    schema, its URI going by the environment (spark_jobs/storeref.py: not on a command
    line, where `ps` shows it)."""
    if store is None:
        return ["--data-dir", data_dir]
    os.environ[STATE_STORE_ENV] = store.uri
    return ["--state-store-schema", store.schema]


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


def _check_spark(command: str, store: StoreRef | None = None) -> None:
    """pyspark (and what the job imports, the driver on the PostgreSQL store) installed,
    and a java for its JVM: checked here, in an instant, instead of by a JVM that fails
    seconds later."""
    modules = _SPARK_MODULES[command] + (() if store is None else ("psycopg",))
    refuse(preflight.missing_modules(modules, f"sharecoord {command}"))
    refuse(preflight.java_problem(os.environ))
