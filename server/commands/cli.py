"""The ``sharecoord`` command (docs/api.md#cli): its parser, and the dispatch to the
command named. Each family of commands is a module of ``server.commands`` (serve,
compact and audit, log, state, partition, cluster, scram) that adds its parsers and runs them;
what a command needs beyond its flags is imported when it runs (``log verify`` loads no
aiohttp).

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
from collections.abc import Sequence
from typing import Any, NoReturn

from server.commands import cluster, log, partition, scram, serve, spark, state
from server.commands.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Command,
    needs_a_command,
    os_error_text,
    say,
)
from server.config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    prog: str = args.prog
    if unknown:  # named by the command they were given to, not by the top-level parser
        say(prog, f"unrecognized arguments: {' '.join(unknown)} (see {prog} --help)")
        return EXIT_USAGE
    try:
        command: Command = args.command
        code = command(args)
        sys.stdout.flush()  # here, where a reader gone away is caught below
        return code
    except ConfigError as exc:
        say(prog, str(exc))
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`| head`): nothing to say. Python would complain again
        # when it flushes stdout at exit, so stdout now points at /dev/null; the exit code
        # is the one a shell reports for a process SIGPIPE ended.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        # What the checks before could not foresee (a disk error, a file gone meanwhile):
        # the operation failed, said in one line.
        say(prog, os_error_text(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        say(prog, "interrupted")
        return EXIT_INTERRUPTED


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (argparse prints the usage first,
    which for these commands runs to many lines). The commands' parsers are of its
    class too (argparse makes subparsers of their parent's class)."""

    def error(self, message: str) -> NoReturn:
        say(self.prog, f"{message} (see {self.prog} --help)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sharecoord",
        description="A standalone share coordinator for KIP-932 share groups.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for family in (serve, spark, log, state, partition, cluster, scram):
        family.add_commands(commands)
    names = ["serve", "compact", "audit", "log", "state", "partition", "cluster", "scram"]
    parser.set_defaults(command=needs_a_command(parser, names), prog=parser.prog)
    return parser


if __name__ == "__main__":
    sys.exit(main())
