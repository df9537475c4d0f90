"""``sharecoord serve``: one node (``server.node``) and its transports, HTTP and, with
``--kafka-listener``, Kafka's protocol, on uvloop until SIGTERM or SIGINT.

Start order: bind the listen addresses (the Kafka listener's, then HTTP's: an address in
use is one line, exit 1, and nothing is made on disk), start the node (open the data
directory; the partitions load in the background), serve HTTP and Kafka over it.

Shutdown order: cut the HTTP requests still waiting for their body (they were never
answered and may never come), then the node's drain: each transport stops listening and
lets its requests in flight finish (up to ``shutdown_timeout_s``; the Kafka listener's
first, then HTTP's); then the node stops the jobs, commits what is left and closes the
log. Exit 0. The last line logged says how many requests were drained and whether the
final commit made every appended record durable.

Once listening, it prints ``sharecoord listening on URL`` on stdout (tests and tools
wait for that line); with ``--log-format json`` that line is a JSON record instead,
``"msg": "listening"`` with ``url``, ``host`` and ``port``. With ``--kafka-listener``, the
line before it says ``sharecoord kafka listener on HOST:PORT`` (JSON: ``"msg":
"kafka listening"``), so that whoever waits for the first line knows both.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import socket
import ssl
import sys
from dataclasses import dataclass

import uvloop

from persistence import FAILPOINTS_ENV, FaultInjectingFileOps, FileOps, LogError
from server import native
from server.catalog import CatalogError
from server.cluster import ClusterMap
from server.config import WILDCARD_HOSTS, ServeConfig, advertised_host
from server.http.transport import HttpTransport, bind_sockets
from server.kafka.auth import CredentialsError, KafkaAuth, load_credentials
from server.kafka.listener import KafkaListener, bind_kafka_socket, start_kafka_listener
from server.logs import json_line, log_event
from server.node import Node
from server.security import SecurityError, load_token, server_ssl_context

_log = logging.getLogger("sharecoord.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class ListenError(Exception):
    """The listen address cannot be bound (in use, not ours, no permission)."""


def run_server(config: ServeConfig) -> int:
    """Serve until told to stop; returns the process exit code."""
    stale = native.stale_build()
    if stale is not None:
        return _fail(config, stale, EXIT_FAILURE)
    return_big_buffers_to_the_system()
    # Files are read here, before the loop exists, so nothing blocks it later.
    try:
        token = load_token(config.auth_token_file) if config.auth_token_file else None
        ssl_context = (
            server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
            if config.tls_cert and config.tls_key
            else None
        )
        scram_file = config.scram_credentials_file
        kafka_auth = KafkaAuth(
            token=token,
            credentials=load_credentials(scram_file) if scram_file else {},
            scram_enabled=bool(scram_file),
        )
    except (SecurityError, CredentialsError) as exc:
        # A token, TLS or credentials file that cannot be used is a usage error, as a bad
        # flag is.
        return _fail(config, str(exc), EXIT_USAGE)
    fs: FileOps | None = None
    if os.environ.get(FAILPOINTS_ENV):
        # Fault injection for the reliability suite; never set in production.
        fs = FaultInjectingFileOps.from_env()
        _log.warning("fault injection enabled through %s", FAILPOINTS_ENV)
    try:
        # Before anything is made on disk: an address in use leaves no data directory.
        listeners = _bind(config)
    except ListenError as exc:
        return _fail(config, str(exc), EXIT_FAILURE)
    node = Node(config, _advertised_cluster(config, listeners.http_address[1]), fs=fs)
    if listeners.kafka is not None:
        node.kafka_advertised = _advertised_kafka(config, listeners.kafka)
    try:
        return uvloop.run(_serve(node, listeners, token, ssl_context, kafka_auth))
    except (LogError, CatalogError) as exc:
        # The data directory is locked by another process, was made for another
        # partition count or holds an unreadable topic catalog: say so plainly, no trace.
        return _fail(config, str(exc), EXIT_FAILURE)
    except OSError as exc:
        # The data directory cannot be made or opened (permissions, a full or read-only
        # disk, too many open files): the operation failed, said in one line.
        named = exc.filename is not None and os.path.abspath(exc.filename) != os.path.abspath(
            config.data_dir
        )
        where = f"{exc.filename}: " if named else ""
        problem = f"{where}{exc.strerror or exc}"
        return _fail(config, f"data directory {config.data_dir}: {problem}", EXIT_FAILURE)
    finally:
        listeners.close()


def _fail(config: ServeConfig, message: str, code: int) -> int:
    """The one line saying why the daemon cannot run, in the log format asked for."""
    if config.log_format == "json":
        print(json_line(_log.name, "error", message, exit_code=code), file=sys.stderr)
    else:
        print(f"sharecoord serve: {message}", file=sys.stderr)
    return code


@dataclass
class _Listeners:
    """The sockets ``serve`` listens on, bound before the node starts."""

    http: list[socket.socket]
    kafka: socket.socket | None

    @property
    def http_address(self) -> tuple[str, int]:
        """The host and port bound first (the port chosen, for --listen :0)."""
        host, port = self.http[0].getsockname()[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Once served, the transports closed them (this is then a no-op); before, they
        are closed here."""
        for sock in [*self.http, *([self.kafka] if self.kafka else [])]:
            sock.close()


def _bind(config: ServeConfig) -> _Listeners:
    """Bind the Kafka listener's address (if any), then HTTP's; ``ListenError`` names
    the one that cannot be bound."""
    kafka = _bind_kafka(config) if config.kafka_listener is not None else None
    try:
        http = bind_sockets(config.host, config.port)
    except OSError as exc:
        if kafka is not None:
            kafka.close()
        raise ListenError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
        ) from exc
    return _Listeners(http, kafka)


def _advertised_cluster(config: ServeConfig, port: int) -> ClusterMap:
    """The cluster map, with a node alone on --listen with port 0 advertised at the port
    actually bound (at the host the configuration chose: a wildcard listen host is
    advertised by name)."""
    cluster = config.cluster_map
    if config.cluster is None and config.advertised_listener is None and port != config.port:
        (alone,) = cluster.nodes
        return ClusterMap.single(config.node_id, alone.host, port, config.partitions)
    return cluster


def _advertised_kafka(config: ServeConfig, sock: socket.socket) -> str:
    """Where the Kafka listener is reached (what a node on leases heartbeats): the bound
    port, at the bound host, or the advertised one for a wildcard."""
    host, port = sock.getsockname()[:2]
    if host in WILDCARD_HOSTS:
        host = advertised_host(config.advertised_listener)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve(
    node: Node,
    listeners: _Listeners,
    token: bytes | None,
    ssl_context: ssl.SSLContext | None,
    kafka_auth: KafkaAuth,
) -> int:
    # Signals first: once the "listening" line is out (or even while the log opens),
    # SIGTERM must mean a clean stop, never the default death of the process.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    config = node.config
    host, port = listeners.http_address
    await node.start()
    try:
        http = HttpTransport(node, token=token)
        node.serves(http)
        await http.start(listeners.http, ssl_context)
        if listeners.kafka is not None:
            kafka = await _start_kafka(node, ssl_context, kafka_auth, listeners.kafka)
            node.serves(kafka)
        scheme = "https" if ssl_context else "http"
        url = f"{scheme}://{host}:{port}"
        log_event(_log, "info", "listening", url=url)
        compiled = native.compiled_modules()
        if compiled:  # (not before: a refusal of bad input is its one line)
            log_event(
                _log, "info", "compiled mode", modules=f"{len(compiled)} of {len(native.MODULES)}"
            )
        if config.log_format == "json":
            print(json_line(_log.name, "info", "listening", url=url, host=host, port=port))
        else:
            print(f"sharecoord listening on {url}")
        sys.stdout.flush()
        _settle_garbage_collector()
        await stop.wait()
        # No waiting, within the shutdown timeout, for bodies that may never come.
        bodies_cut = http.stop_reading_bodies()
        log_event(
            _log,
            "info",
            "stopping: no new connections; finishing the requests in flight",
            in_flight=node.in_flight,
            bodies_cut=bodies_cut,
        )
    finally:
        # The Kafka listener first, then HTTP: the requests in flight need the log open.
        drained = await node.drain()
        await node.stop()
    # The final commit is done and the log closed; what it left behind says whether
    # that commit covered everything.
    not_durable = node.not_durable()
    if not_durable:
        log_event(
            _log,
            "warning",
            "stopped; the final commit left records that are not durable",
            drained=drained.drained,
            cut_off=drained.cut_off,
            final_commit="incomplete",
            partitions=not_durable,
        )
    else:
        log_event(
            _log,
            "info",
            "stopped",
            drained=drained.drained,
            cut_off=drained.cut_off,
            final_commit="done",
        )
    return EXIT_OK


# Objects the collector lets accumulate before a young collection (CPython's default is
# 700): the net count of tracked objects made and not yet freed. A request leaves
# almost nothing for the collector (its objects die with their last reference) but keeps
# its decoded entries and answer alive until its commit is durable, so what counts is
# what the requests in flight hold together: some 10,000 objects for sixteen 50-entry
# writes, 16,000 for sixty-four. At 2,000 the young generation was collected ~60 times a
# second under those writes (5% of the daemon's CPU, walking objects about to be freed);
# at 20,000, once in a run (bench 2026-11-28: batched writes 1.03-1.06x, single ones
# 1.00-1.03x, interleaved). A young collection that does run walks at most some 20,000
# objects (measured: 6 ms at worst). Garbage in cycles waits for at most that many
# objects, so what a cycle holds matters: a refused body and a body read cut off were
# each kept in one with their bytes (mended with this threshold), and the 100,000 bad
# requests of tests/reliability/test_memory_bounded.py grew the daemon by 18-23 MiB at
# 20,000 before the mends; after them, 56.4 -> 59.3 MiB (55.2 -> 57.0 at 2,000).
YOUNG_COLLECTION_THRESHOLD = 20_000


def _settle_garbage_collector() -> None:
    """Once up: what exists now (modules, settings, the app; not the state, which loads
    after) is kept for the life of the process, so it leaves the collector's view, and
    a full collection walks only what came since. Collected first, so no garbage of
    the start-up is kept with it."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


# glibc's malloc gives a request of at least its mmap threshold a mapping of its own,
# unmapped when freed; but each such block freed raises the threshold to its size (up
# to 32 MiB), so after the first 200 KB answer every later one comes from the heap, and
# what is freed in the middle of the heap stays with the process. Measured with thirty
# logged-in clients that pipeline Reads of a ~200 KB answer and never read
# (tests/reliability/test_kafka_abuse.py): 6.5-11.6 MB kept after they closed with the
# moving threshold, 1.1-1.6 MB with it fixed at its initial 128 KiB, and no time lost.
_M_MMAP_THRESHOLD = -3  # <malloc.h>
BIG_BUFFER_BYTES = 128 * 1024


def return_big_buffers_to_the_system() -> bool:
    """Fix glibc's mmap threshold at ``BIG_BUFFER_BYTES``: every buffer that large (an
    answer, a read, a request body) goes back to the system when freed. Left alone
    where the operator set it (``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES``) or the C
    library is not glibc. Whether it was set."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in tunables:
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        set_option = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc
        return False
    return bool(set_option(_M_MMAP_THRESHOLD, BIG_BUFFER_BYTES))


def _bind_kafka(config: ServeConfig) -> socket.socket:
    assert config.kafka_listener is not None
    try:
        return bind_kafka_socket(config.kafka_listener)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {config.kafka_listener} (--kafka-listener): {exc.strerror or exc}"
        ) from exc


async def _start_kafka(
    node: Node,
    ssl_context: ssl.SSLContext | None,
    auth: KafkaAuth,
    sock: socket.socket,
) -> KafkaListener:
    """Serve Kafka's protocol and say where, before the HTTP "listening" line."""
    kafka, host, port = await start_kafka_listener(node, ssl_context, auth, sock)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    log_event(_log, "info", "kafka listening", address=address, tls=ssl_context is not None)
    if node.config.log_format == "json":
        print(json_line(_log.name, "info", "kafka listening", host=host, port=port))
    else:
        print(f"sharecoord kafka listener on {address}")
    return kafka
