"""What every command of ``sharecoord`` shares: the exit codes, the one line an error
is said in, and how a command joins the parser (docs/api.md#cli)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from persistence.store_uri import is_postgres_uri, masked
from server.commands import preflight
from server.config import ConfigError, add_arguments

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT
EXIT_BROKEN_PIPE = 141  # the shell's 128 + SIGPIPE: the reader of stdout went away

# What a command runs: its parsed flags in, the exit code out. A ConfigError it raises
# is a usage error (exit 2), an OSError a failed operation (exit 1), said in one line.
Command = Callable[[argparse.Namespace], int]


def say(prog: str, message: str) -> None:
    """The one line on stderr: ``sharecoord COMMAND: what is wrong``."""
    print(f"{prog}: {' '.join(message.split())}", file=sys.stderr)


def os_error_text(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror or str(exc)


def refuse(problem: str | None) -> None:
    """A check's problem (``server.commands.preflight``), if any, as a usage error."""
    if problem is not None:
        raise ConfigError(problem)


def postgres_store(values: dict[str, Any], args: argparse.Namespace) -> str | None:
    """The PostgreSQL store a tool's settings name (``state_store``), or None for the
    data directory; a URI of another kind, no driver installed, or a ``--data-dir``
    flag beside it (which of the two was meant?) is a usage error."""
    uri: str | None = values["state_store"]
    if uri is None:
        return None
    if hasattr(args, "data_dir"):
        raise ConfigError(
            f"--data-dir and a state store ({masked(uri)}) are both given: the command "
            "reads one of them; leave out one (state_store may come from "
            "SHARECOORD_STATE_STORE or the config file)"
        )
    if not is_postgres_uri(uri):
        raise ConfigError(
            f"--state-store {masked(uri)} is not a PostgreSQL URI: give "
            "postgresql://USER@HOST:PORT/DATABASE, or leave it unset for --data-dir"
        )
    refuse(preflight.postgres_driver_problem())
    return uri


def add_command(
    subparsers: Any, name: str, command: Command, settings: Sequence[Any], **kwargs: Any
) -> argparse.ArgumentParser:
    """A command whose flags are its settings (``server.config``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, **kwargs)
    add_arguments(parser, settings)
    parser.set_defaults(command=command, prog=parser.prog)
    return parser


def needs_a_command(parser: argparse.ArgumentParser, choices: Sequence[str]) -> Command:
    """What a command family runs when no command of it was named: a usage error."""

    def refuse_it(args: argparse.Namespace) -> int:
        names = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
        parser.error(f"a command is needed: {names}")

    return refuse_it
