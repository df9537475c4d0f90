"""``sharecoord state get``: ask a running daemon for one share-partition's admin state
(``GET /v1/admin/state``, ``server.tools.state_get``)."""

from __future__ import annotations

import argparse
from typing import Any

from server.commands.common import add_command, needs_a_command
from server.config import STATE_GET_SETTINGS, load_settings


def add_commands(subparsers: Any) -> None:
    state = subparsers.add_parser("state", help="ask a daemon about stored state")
    commands = state.add_subparsers(title="state commands", metavar="COMMAND")
    add_command(
        commands, "get", run_get, STATE_GET_SETTINGS, help="print one share-partition's admin state"
    )
    state.set_defaults(command=needs_a_command(state, ["get"]), prog=state.prog)


def run_get(args: argparse.Namespace) -> int:
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
