"""``sharecoord serve``: run the HTTP server on uvloop until SIGTERM or SIGINT.

Shutdown order: stop listening, let the requests in flight finish (up to
``shutdown_timeout_s``), then the app's cleanup context stops the jobs, commits
what is left and closes the log. Exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys

import uvloop
from aiohttp import web

from persistence import FAILPOINTS_ENV, FaultInjectingFileOps, FileOps, LogError
from server.catalog import CatalogError
from server.cluster import ClusterMap
from server.config import ServeConfig
from server.connection import ApiAppRunner
from server.http import COORDINATOR, create_app
from server.logs import json_line
from server.security import SecurityError, load_token, server_ssl_context

_log = logging.getLogger("sharecoord.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class ListenError(Exception):
    """The listen address cannot be bound (in use, not ours, no permission)."""


def run_server(config: ServeConfig) -> int:
    """Serve until told to stop; returns the process exit code."""
    # Files are read here, before the loop exists, so nothing blocks it later.
    try:
        token = load_token(config.auth_token_file) if config.auth_token_file else None
        ssl_context = (
            server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
            if config.tls_cert and config.tls_key
            else None
        )
    except SecurityError as exc:
        # A token or TLS file that cannot be used is a usage error, as a bad flag is.
        return _fail(config, str(exc), EXIT_USAGE)
    fs: FileOps | None = None
    if os.environ.get(FAILPOINTS_ENV):
        # Fault injection for the reliability suite; never set in production.
        fs = FaultInjectingFileOps.from_env()
        _log.warning("fault injection enabled through %s", FAILPOINTS_ENV)
    app = create_app(config, config.cluster_map, token=token, fs=fs)
    try:
        return uvloop.run(_serve(app, config, ssl_context))
    except (LogError, CatalogError, ListenError) as exc:
        # The data directory is locked by another process, was made for another
        # partition count or holds an unreadable topic catalog, or the address is taken:
        # say so plainly, no trace.
        return _fail(config, str(exc), EXIT_FAILURE)
    except OSError as exc:
        # The data directory cannot be made or opened (permissions, a full or read-only
        # disk, too many open files): the operation failed, said in one line.
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return _fail(config, f"{where}{exc.strerror or exc}", EXIT_FAILURE)


def _fail(config: ServeConfig, message: str, code: int) -> int:
    """The one line saying why the daemon cannot run, in the log format asked for."""
    if config.log_format == "json":
        print(json_line(_log.name, "error", message, exit_code=code), file=sys.stderr)
    else:
        print(f"sharecoord serve: {message}", file=sys.stderr)
    return code


async def _serve(
    app: web.Application, config: ServeConfig, ssl_context: ssl.SSLContext | None
) -> int:
    # Signals first: once the "listening" line is out (or even while the log opens),
    # SIGTERM must mean a clean stop, never the default death of the process.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = ApiAppRunner(
        app,
        request_timeout_s=config.request_timeout_s,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=config.shutdown_timeout_s,
        keepalive_timeout=config.request_timeout_s,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            raise ListenError(
                f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
            ) from exc
        host, port = _bound_address(runner, config)
        coordinator = app[COORDINATOR]
        if config.cluster is None and port != config.port:
            # --listen with port 0: advertise the port actually bound.
            coordinator.rebind(ClusterMap.single(config.node_id, host, port, config.partitions))
        scheme = "https" if ssl_context else "http"
        _log.info("listening on %s://%s:%d", scheme, host, port)
        print(f"sharecoord listening on {scheme}://{host}:{port}", flush=True)
        await stop.wait()
        _log.info("stopping: no new connections; finishing the requests in flight")
    finally:
        await runner.cleanup()
    _log.info("stopped")
    return EXIT_OK


def _bound_address(runner: web.AppRunner, config: ServeConfig) -> tuple[str, int]:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return str(address[0]), int(address[1])
    return config.host, config.port
