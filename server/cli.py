"""The ``sharecoord`` command (docs/api.md#cli).

Exit codes: 0 ok, 1 a failure found (verify, audit) or an operation failed, 2 usage
error (bad flags or settings).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from persistence import LogError, read_meta
from server.config import (
    AUDIT_SETTINGS,
    COMPACT_SETTINGS,
    LOG_DUMP_SETTINGS,
    LOG_VERIFY_SETTINGS,
    SERVE_SETTINGS,
    STATE_GET_SETTINGS,
    ConfigError,
    add_arguments,
    load_serve_config,
    load_settings,
)
from spark_jobs import submit

EXIT_USAGE = 2

Command = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command", None)
    if command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return command(args)
    except ConfigError as exc:
        print(f"sharecoord: {exc}", file=sys.stderr)
        return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sharecoord",
        description="A standalone share coordinator for KIP-932 share groups.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the daemon")
    add_arguments(serve, SERVE_SETTINGS)
    serve.set_defaults(command=_serve)
    _add_spark_commands(commands)

    log = commands.add_parser("log", help="read a data directory's state log")
    log_commands = log.add_subparsers(title="log commands", metavar="COMMAND")
    dump = log_commands.add_parser("dump", help="print every record, readable")
    add_arguments(dump, LOG_DUMP_SETTINGS)
    dump.set_defaults(command=_log_dump)
    verify = log_commands.add_parser(
        "verify", help="check every frame's CRC and replay every record; exit 1 on damage"
    )
    add_arguments(verify, LOG_VERIFY_SETTINGS)
    verify.set_defaults(command=_log_verify)

    state = commands.add_parser("state", help="ask a daemon about stored state")
    state_commands = state.add_subparsers(title="state commands", metavar="COMMAND")
    get = state_commands.add_parser("get", help="print one share-partition's admin state")
    add_arguments(get, STATE_GET_SETTINGS)
    get.set_defaults(command=_state_get)
    return parser


def _add_spark_commands(subparsers: Any) -> None:
    """Add `compact` and `audit` to the `sharecoord` command's subparsers."""
    compact = subparsers.add_parser(
        "compact",
        help="compact the state log with Spark: one ShareSnapshot per live key",
        description="Fold each state partition's sealed segments into one ShareSnapshot "
        "per live key and commit them (or leave them to the running daemon).",
    )
    add_arguments(compact, COMPACT_SETTINGS)
    compact.set_defaults(command=run_compact)
    audit = subparsers.add_parser(
        "audit",
        help="audit delivery counts with Spark; exit 1 if violations are found",
        description="Replay the whole state log and report delivery-count histograms, "
        "the most redelivered offsets and violations (JSON, Parquet, PNG, HTML).",
    )
    add_arguments(audit, AUDIT_SETTINGS)
    audit.set_defaults(command=run_audit)


def run_compact(args: argparse.Namespace) -> int:
    values = load_settings(COMPACT_SETTINGS, args)
    data_dir = _checked_data_dir("compact", values["data_dir"])
    if data_dir is None:
        return EXIT_USAGE
    job_args = ["--data-dir", data_dir]
    job_args += ["--tombstone-retention-ms", str(values["tombstone_retention_ms"])]
    return submit.run_job("compact", values["master"], job_args)


def run_audit(args: argparse.Namespace) -> int:
    values = load_settings(AUDIT_SETTINGS, args, required=("out",))
    data_dir = _checked_data_dir("audit", values["data_dir"])
    if data_dir is None:
        return EXIT_USAGE
    job_args = ["--data-dir", data_dir, "--out", os.path.abspath(values["out"])]
    job_args += ["--delivery-limit", str(values["delivery_limit"])]
    return submit.run_job("audit", values["master"], job_args)


def _checked_data_dir(command: str, data_dir: str) -> str | None:
    """The data directory as an absolute path (executors may run elsewhere), or None
    after saying why it is not one."""
    try:
        read_meta(data_dir)
    except LogError as exc:
        print(f"sharecoord {command}: {exc}", file=sys.stderr)
        return None
    return os.path.abspath(data_dir)


def _serve(args: argparse.Namespace) -> int:
    config = load_serve_config(args, os.environ)
    from server.daemon import run_server
    from server.logs import setup_logging

    setup_logging(config.log_level, config.log_format)
    return run_server(config)


def _log_dump(args: argparse.Namespace) -> int:
    from server.tools import log_dump

    values = load_settings(LOG_DUMP_SETTINGS, args)
    return log_dump(values["data_dir"], values["partition"], values["json"])


def _log_verify(args: argparse.Namespace) -> int:
    from server.tools import log_verify

    values = load_settings(LOG_VERIFY_SETTINGS, args)
    return log_verify(values["data_dir"])


def _state_get(args: argparse.Namespace) -> int:
    from server.tools import state_get

    values = load_settings(
        STATE_GET_SETTINGS, args, required=("url", "group", "topic", "partition")
    )
    return state_get(
        values["url"],
        values["group"],
        values["topic"],
        values["partition"],
        token_file=values["token_file"],
        cacert=values["cacert"],
        cert=values["cert"],
        key=values["key"],
    )


if __name__ == "__main__":
    sys.exit(main())
