"""``sharecoord serve``: the daemon (``server.daemon``), once its settings are loaded and
its data directory checked; a setting that cannot be used is one line and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from server.commands import preflight
from server.commands.common import EXIT_USAGE, add_command, refuse
from server.config import SERVE_SETTINGS, ConfigError, load_serve_config, load_settings


def add_commands(subparsers: Any) -> None:
    add_command(subparsers, "serve", run_serve, SERVE_SETTINGS, help="run the daemon")


def run_serve(args: argparse.Namespace) -> int:
    try:
        config = load_serve_config(args, os.environ)
        if config.state_store is None:
            refuse(preflight.data_directory_problem(config.data_dir, created_if_missing=True))
        else:
            refuse(preflight.postgres_driver_problem())
    except ConfigError as exc:
        if not _json_logs_asked(args):
            raise
        # A supervisor reading JSON lines gets this one as JSON too.
        from server.logs import json_line

        print(json_line("sharecoord.cli", "error", str(exc), exit_code=EXIT_USAGE), file=sys.stderr)
        return EXIT_USAGE
    # The daemon's modules (aiohttp, uvloop) are loaded for serve alone.
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
