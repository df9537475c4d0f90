"""``sharecoord log dump | verify``: read a data directory's state log, the daemon
stopped or not (``server.tools``), or a PostgreSQL store's, its cluster running or not
(``server.postgres_tools``)."""

from __future__ import annotations

import argparse
from typing import Any

from server.commands import preflight
from server.commands.common import add_command, needs_a_command, postgres_store, refuse
from server.config import LOG_DUMP_SETTINGS, LOG_VERIFY_SETTINGS, load_settings


def add_commands(subparsers: Any) -> None:
    log = subparsers.add_parser("log", help="read a data directory's or a store's state log")
    commands = log.add_subparsers(title="log commands", metavar="COMMAND")
    add_command(commands, "dump", run_dump, LOG_DUMP_SETTINGS, help="print every record, readable")
    add_command(
        commands,
        "verify",
        run_verify,
        LOG_VERIFY_SETTINGS,
        help="check every frame's CRC and replay every record; exit 1 on damage",
    )
    log.set_defaults(command=needs_a_command(log, ["dump", "verify"]), prog=log.prog)


def run_dump(args: argparse.Namespace) -> int:
    values = load_settings(LOG_DUMP_SETTINGS, args)
    if postgres_store(values, args) is not None:
        from server.postgres_tools import log_dump_postgres

        return log_dump_postgres(
            values["state_store"], values["state_store_schema"], values["partition"], values["json"]
        )
    from server.tools import log_dump

    refuse(preflight.data_directory_problem(values["data_dir"], created_if_missing=False))
    return log_dump(values["data_dir"], values["partition"], values["json"])


def run_verify(args: argparse.Namespace) -> int:
    values = load_settings(LOG_VERIFY_SETTINGS, args)
    if postgres_store(values, args) is not None:
        from server.postgres_tools import log_verify_postgres

        return log_verify_postgres(values["state_store"], values["state_store_schema"])
    from server.tools import log_verify

    return log_verify(values["data_dir"])
