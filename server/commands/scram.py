"""``sharecoord scram add | remove``: the Kafka listener's SCRAM credentials file
(docs/api.md#the-kafka-listener, ``server.kafka.auth``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from protocol.sasl import DEFAULT_ITERATIONS, MAX_ITERATIONS, MIN_ITERATIONS
from server.commands.common import needs_a_command, refuse
from server.config import ConfigError


def add_commands(subparsers: Any) -> None:
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
    add.set_defaults(command=run_add, prog=add.prog)
    remove.set_defaults(command=run_remove, prog=remove.prog)
    scram.set_defaults(command=needs_a_command(scram, ["add", "remove"]), prog=scram.prog)


def run_add(args: argparse.Namespace) -> int:
    from server.kafka.auth import CredentialsError, add_user, load_credentials

    if not args.user:
        raise ConfigError("--user must not be empty")
    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise ConfigError(f"--iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    refuse(_credentials_file_problem(args.file))
    try:
        if os.path.exists(args.file):
            load_credentials(args.file)  # a file we cannot use, before the password
        password = _read_password()
        add_user(args.file, args.user, args.mechanism, password, args.iterations)
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None
    print(f"{args.user}: {args.mechanism} credentials written to {args.file}")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    from server.kafka.auth import CredentialsError, remove_user

    refuse(_credentials_file_problem(args.file))
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
