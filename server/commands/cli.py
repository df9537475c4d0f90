"""The ``sharecoord`` command (docs/api.md#cli).

Exit codes: 0 ok, 1 a failure found (verify, audit) or an operation failed, 2 usage
error (bad flags or settings). Every error a user can cause is one line on stderr,
``sharecoord COMMAND: what is wrong``, never a trace; it is found before anything
expensive starts (a JVM, a daemon's log).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from persistence import LogError, read_meta
from protocol.sasl import DEFAULT_ITERATIONS
from server.commands import preflight
from server.config import (
    AUDIT_SETTINGS,
    COMPACT_SETTINGS,
    LOG_DUMP_SETTINGS,
    LOG_VERIFY_SETTINGS,
    PARTITION_ADOPT_SETTINGS,
    PARTITION_EXPORT_SETTINGS,
    PARTITION_IMPORT_SETTINGS,
    SERVE_SETTINGS,
    STATE_GET_SETTINGS,
    ConfigError,
    add_arguments,
    load_serve_config,
    load_settings,
)
from spark_jobs import submit
from spark_jobs.preflight import anything_to_compact, checkpoint_problem, history_problem

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT

Command = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    prog: str = args.prog
    if unknown:  # named by the command they were given to, not by the top-level parser
        _say(prog, f"unrecognized arguments: {' '.join(unknown)} (see {prog} --help)")
        return EXIT_USAGE
    try:
        command: Command = args.command
        return command(args)
    except ConfigError as exc:
        _say(prog, str(exc))
        return EXIT_USAGE
    except OSError as exc:
        # What the checks before could not foresee (a disk error, a file gone meanwhile):
        # the operation failed, said in one line.
        _say(prog, _os_error_text(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _say(prog, "interrupted")
        return EXIT_INTERRUPTED


def _say(prog: str, message: str) -> None:
    print(f"{prog}: {' '.join(message.split())}", file=sys.stderr)


def _os_error_text(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror or str(exc)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (argparse prints the usage first,
    which for these commands runs to many lines)."""

    def error(self, message: str) -> NoReturn:
        _say(self.prog, f"{message} (see {self.prog} --help)")
        sys.exit(EXIT_USAGE)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked
    (reading package metadata scans the environment)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        try:
            version = importlib.metadata.version("sharecoord")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown (run from sources that were never installed)"
        print(f"sharecoord {version}")
        parser.exit(0)


def _needs_a_command(parser: argparse.ArgumentParser, choices: Sequence[str]) -> Command:
    def refuse(args: argparse.Namespace) -> int:
        names = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
        parser.error(f"a command is needed: {names}")

    return refuse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sharecoord",
        description="A standalone share coordinator for KIP-932 share groups.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    _add_command(commands, "serve", _serve, SERVE_SETTINGS, help="run the daemon")
    _add_spark_commands(commands)

    log = commands.add_parser("log", help="read a data directory's state log")
    log_commands = log.add_subparsers(title="log commands", metavar="COMMAND")
    _add_command(
        log_commands, "dump", _log_dump, LOG_DUMP_SETTINGS, help="print every record, readable"
    )
    _add_command(
        log_commands,
        "verify",
        _log_verify,
        LOG_VERIFY_SETTINGS,
        help="check every frame's CRC and replay every record; exit 1 on damage",
    )
    log.set_defaults(command=_needs_a_command(log, ["dump", "verify"]), prog=log.prog)

    state = commands.add_parser("state", help="ask a daemon about stored state")
    state_commands = state.add_subparsers(title="state commands", metavar="COMMAND")
    _add_command(
        state_commands,
        "get",
        _state_get,
        STATE_GET_SETTINGS,
        help="print one share-partition's admin state",
    )
    state.set_defaults(command=_needs_a_command(state, ["get"]), prog=state.prog)
    _add_partition_commands(commands)
    _add_scram_commands(commands)
    names = ["serve", "compact", "audit", "log", "state", "partition", "scram"]
    parser.set_defaults(command=_needs_a_command(parser, names), prog=parser.prog)
    return parser


def _add_command(
    subparsers: Any, name: str, command: Command, settings: Sequence[Any], **kwargs: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(name, **kwargs)
    add_arguments(parser, settings)
    parser.set_defaults(command=command, prog=parser.prog)
    return parser


def _add_partition_commands(subparsers: Any) -> None:
    """`partition export | import | adopt`: moving a state partition between nodes
    (docs/operations.md#moving-a-state-partition). Each takes DATA/LOCK: its node's
    daemon must be stopped."""
    partition = subparsers.add_parser(
        "partition", help="move a state partition between nodes (the daemon stopped)"
    )
    commands = partition.add_subparsers(title="partition commands", metavar="COMMAND")
    _add_command(
        commands,
        "export",
        _partition_export,
        PARTITION_EXPORT_SETTINGS,
        help="copy a state partition out, verified, and stop serving it here",
    )
    _add_command(
        commands,
        "import",
        _partition_import,
        PARTITION_IMPORT_SETTINGS,
        help="check an export and make it this node's state partition",
    )
    _add_command(
        commands,
        "adopt",
        _partition_adopt,
        PARTITION_ADOPT_SETTINGS,
        help="serve partitions this data directory would refuse, as they are here",
    )
    partition.set_defaults(
        command=_needs_a_command(partition, ["export", "import", "adopt"]), prog=partition.prog
    )


def _partition_export(args: argparse.Namespace) -> int:
    from server.partition_tools import ToolError, export_partition

    values = load_settings(PARTITION_EXPORT_SETTINGS, args, required=("partition", "out"))
    data_dir, partition = values["data_dir"], values["partition"]
    try:
        manifest = export_partition(data_dir, partition, values["out"])
    except ToolError as exc:
        _say(args.prog, str(exc))
        return exc.code
    size = sum(segment.size for segment in manifest.segments)
    print(
        f"exported state partition {partition} of {data_dir} to {os.path.abspath(values['out'])}"
        f": {manifest.records} records, offsets {manifest.log_start_offset}.."
        f"{manifest.log_end_offset - 1}, {len(manifest.segments)} segments, {size} bytes"
    )
    if manifest.history:
        print(f"with its history: {len(manifest.history)} files")
    print(f"{data_dir} no longer serves state partition {partition} (its OWNER says exported)")
    print(
        "next: with the new owner stopped, `sharecoord partition import --data-dir ITS_DATA "
        "--from DIR` there; then start it"
    )
    return 0


def _partition_import(args: argparse.Namespace) -> int:
    from server.partition_import import import_partition
    from server.partition_tools import ToolError

    values = load_settings(PARTITION_IMPORT_SETTINGS, args, required=("source",))
    data_dir = values["data_dir"]
    _refuse(preflight.data_directory_problem(data_dir, created_if_missing=True))
    try:
        done = import_partition(data_dir, values["source"], values["node_id"])
    except ToolError as exc:
        _say(args.prog, str(exc))
        return exc.code
    manifest = done.manifest
    if done.already:
        print(
            f"state partition {manifest.partition} of {data_dir} already holds this export "
            "(an import of it finished before): nothing to do"
        )
        return 0
    print(
        f"imported state partition {manifest.partition} into {data_dir} for node {done.node}: "
        f"{manifest.records} records, offsets {manifest.log_start_offset}.."
        f"{manifest.log_end_offset - 1} (checked against the export's manifest)"
    )
    if done.history_root is not None:
        kept = "" if done.history_declared else " (the first compaction here takes it up)"
        print(f"its history: {len(manifest.history)} files, in {done.history_root}{kept}")
    return 0


def _partition_adopt(args: argparse.Namespace) -> int:
    from server.partition_tools import ToolError, adopt_partitions

    values = load_settings(PARTITION_ADOPT_SETTINGS, args, required=("partition",))
    try:
        lines = adopt_partitions(values["data_dir"], list(values["partition"]), values["node_id"])
    except ToolError as exc:
        _say(args.prog, str(exc))
        return exc.code
    for line in lines:
        print(line)
    return 0


def _add_scram_commands(subparsers: Any) -> None:
    """`scram add` / `scram remove`: the Kafka listener's SCRAM credentials file. Plain
    flags (no environment or config file): they name one user, not a daemon's setting."""
    scram = subparsers.add_parser(
        "scram", help="manage the Kafka listener's SCRAM credentials file"
    )
    scram_commands = scram.add_subparsers(title="scram commands", metavar="COMMAND")
    mechanisms = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    add = scram_commands.add_parser(
        "add",
        help="add or replace a user's salted keys; the password comes from stdin or a prompt",
        description="Derive the salted keys (RFC 5802) of a user's password and write them "
        "to the credentials file atomically. The password is read from standard input (one "
        "line) or, on a terminal, prompted for twice; it is never stored.",
    )
    remove = scram_commands.add_parser("remove", help="remove a user (or one mechanism of it)")
    for parser in (add, remove):
        parser.add_argument("--file", required=True, metavar="FILE", help="credentials file")
        parser.add_argument("--user", required=True, metavar="USER", help="SASL user name")
    add.add_argument("--mechanism", required=True, choices=mechanisms)
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        metavar="N",
        help=f"PBKDF2 rounds (default {DEFAULT_ITERATIONS})",
    )
    remove.add_argument("--mechanism", choices=mechanisms, help="only this mechanism")
    add.set_defaults(command=_scram_add, prog=add.prog)
    remove.set_defaults(command=_scram_remove, prog=remove.prog)
    scram.set_defaults(command=_needs_a_command(scram, ["add", "remove"]), prog=scram.prog)


def _scram_add(args: argparse.Namespace) -> int:
    from protocol.sasl import MAX_ITERATIONS, MIN_ITERATIONS
    from server.kafka.auth import CredentialsError, add_user, load_credentials

    if not args.user:
        raise ConfigError("--user must not be empty")
    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise ConfigError(f"--iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    _refuse(_credentials_file_problem(args.file))
    try:
        if os.path.exists(args.file):
            load_credentials(args.file)  # a file we cannot use, before the password
        password = _read_password()
        add_user(args.file, args.user, args.mechanism, password, args.iterations)
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None
    print(f"{args.user}: {args.mechanism} credentials written to {args.file}")
    return 0


def _scram_remove(args: argparse.Namespace) -> int:
    from server.kafka.auth import CredentialsError, remove_user

    _refuse(_credentials_file_problem(args.file))
    try:
        removed = remove_user(args.file, args.user, args.mechanism)
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None
    if not removed:
        raise ConfigError(f"{args.file} has no such user (or mechanism): {args.user}")
    print(f"{args.user}: removed from {args.file}")
    return 0


def _credentials_file_problem(path: str) -> str | None:
    if os.path.isdir(path):
        return f"--file {path} is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"--file {path}: {directory} is not a directory"
    return None


def _read_password() -> bytes:
    """One line from stdin, or (on a terminal) a prompt typed twice."""
    if sys.stdin is not None and not sys.stdin.isatty():
        password = sys.stdin.buffer.readline().rstrip(b"\r\n")
    else:
        import getpass

        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise ConfigError("the two passwords differ")
        password = first.encode("utf-8")
    if not password:
        raise ConfigError("the password is empty (give it on stdin or at the prompt)")
    return password


def _add_spark_commands(subparsers: Any) -> None:
    """Add `compact` and `audit` to the `sharecoord` command's subparsers."""
    _add_command(
        subparsers,
        "compact",
        run_compact,
        COMPACT_SETTINGS,
        help="compact the state log with Spark: one ShareSnapshot per live key",
        description="Fold each state partition's sealed segments into one ShareSnapshot "
        "per live key and commit them (or leave them to the running daemon).",
    )
    _add_command(
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
    data_dir = _checked_data_dir(values["data_dir"])
    _check_spark("compact")
    history_dir = values["history_dir"]
    problem = history_problem(data_dir, history_dir, values["history_retention_ms"])
    _refuse(problem)
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
    return submit.run_job("compact", values["master"], job_args)


def run_audit(args: argparse.Namespace) -> int:
    values = load_settings(AUDIT_SETTINGS, args, required=("out",))
    data_dir = _checked_data_dir(values["data_dir"])
    out = os.path.abspath(values["out"])
    _check_spark("audit")
    # Last, as it makes the directory: only once nothing else stands in the way.
    _refuse(preflight.writable_directory(out, "--out"))
    _refuse(checkpoint_problem(out, data_dir, values["delivery_limit"], values["since_last"]))
    job_args = ["--data-dir", data_dir, "--out", out]
    job_args += ["--delivery-limit", str(values["delivery_limit"])]
    if values["since_last"]:
        job_args.append("--since-last")
    return submit.run_job("audit", values["master"], job_args)


def _checked_data_dir(data_dir: str) -> str:
    """The data directory as an absolute path (executors may run elsewhere); a
    ConfigError says why it is not one."""
    _refuse(preflight.data_directory_problem(data_dir, created_if_missing=False))
    try:
        read_meta(data_dir)
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--data-dir {data_dir}: {_os_error_text(exc)}") from None
    return os.path.abspath(data_dir)


def _check_spark(command: str) -> None:
    """pyspark (and what the job imports) installed, and a java for its JVM: checked
    here, in an instant, instead of by a JVM that fails seconds later."""
    _refuse(preflight.missing_modules(_SPARK_MODULES[command], f"sharecoord {command}"))
    _refuse(preflight.java_problem(os.environ))


def _refuse(problem: str | None) -> None:
    if problem is not None:
        raise ConfigError(problem)


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_serve_config(args, os.environ)
        _refuse(preflight.data_directory_problem(config.data_dir, created_if_missing=True))
    except ConfigError as exc:
        if not _json_logs_asked(args):
            raise
        # A supervisor reading JSON lines gets this one as JSON too.
        from server.logs import json_line

        print(json_line("sharecoord.cli", "error", str(exc), exit_code=EXIT_USAGE), file=sys.stderr)
        return EXIT_USAGE
    from server.daemon import run_server
    from server.logs import setup_daemon_logging

    setup_daemon_logging(config.log_level, config.log_format)
    return run_server(config)


def _json_logs_asked(args: argparse.Namespace) -> bool:
    """Whether --log-format (flag, env or file) says json, when the whole configuration
    could not be loaded."""
    (log_format,) = (s for s in SERVE_SETTINGS if s.name == "log_format")
    try:
        return bool(load_settings((log_format,), args)["log_format"] == "json")
    except ConfigError:
        return False


def _log_dump(args: argparse.Namespace) -> int:
    from server.tools import log_dump

    values = load_settings(LOG_DUMP_SETTINGS, args)
    _refuse(preflight.data_directory_problem(values["data_dir"], created_if_missing=False))
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
        timeout_s=values["timeout_s"],
    )


if __name__ == "__main__":
    sys.exit(main())
