"""The Kafka listener (``--kafka-listener``): Kafka's binary protocol on its own socket,
on the daemon's event loop, over the same node as HTTP (docs/api.md#the-kafka-listener).

It accepts connections (``server.kafka.connection``: one per client, its framing,
order, back-pressure and deadlines), at most ``--kafka-max-connections``: one more is cut
off at once, counted, and logged at most once a second with how many were refused. The
closes a client caused are logged at info, at most ``CLOSES_SHOWN`` lines a second and
then one line with how many were not shown.

TLS, from the first byte, uses the HTTP listener's context (``--tls-cert``,
``--tls-key``, ``--tls-client-ca``); a TLS connection counts against the cap once its
handshake is done (which ``--request-timeout-s`` bounds).

``KafkaListener.stop`` is the shutdown: stop accepting, stop reading, let the answers in
flight finish within ``--shutdown-timeout-s``, then close every connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from server.config import WILDCARD_HOSTS, advertised_host, parse_listen
from server.kafka.auth import KafkaAuth
from server.kafka.connection import KafkaConnection
from server.kafka.handlers import KafkaApi
from server.logs import ThrottledLog, log_event
from server.metrics import ShareCoordinatorMetrics
from server.node import Drained, Node

_log = logging.getLogger("sharecoord.kafka")

REFUSALS_LOG_INTERVAL_S = 1.0  # at most one line this often about refused connections
# Closes a client caused, logged at info: at most CLOSES_SHOWN lines a second.
CLOSES_SHOWN = 5
CLOSES_LOG_INTERVAL_S = 1.0


class KafkaListener:
    def __init__(
        self,
        api: KafkaApi,
        metrics: ShareCoordinatorMetrics,
        *,
        max_frame: int,
        timeout: float,
        ssl_context: ssl.SSLContext | None,
        max_connections: int,
        shutdown_timeout: float,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.max_frame = max_frame
        self.timeout = timeout
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.shutdown_timeout = shutdown_timeout
        self.connections: set[KafkaConnection] = set()
        self.in_flight = 0
        self.stopping = False
        self.drained = 0
        self.idle = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self.closes = ThrottledLog(
            _log,
            "info",
            "Kafka listener: more connections closed than shown",
            burst=CLOSES_SHOWN,
            interval_s=CLOSES_LOG_INTERVAL_S,
        )
        self._refused_unlogged = 0
        self._refusals_timer: asyncio.TimerHandle | None = None

    def refused(self) -> None:
        """A connection over ``--kafka-max-connections`` was cut off: counted at once,
        logged at most once every ``REFUSALS_LOG_INTERVAL_S`` with how many since the
        last line (a flood of connections must not become a flood of lines)."""
        self.metrics.kafka_refused.inc()
        self._refused_unlogged += 1
        if self._refusals_timer is None:
            self._log_refusals()
            self._refusals_timer = asyncio.get_running_loop().call_later(
                REFUSALS_LOG_INTERVAL_S, self._refusals_due
            )

    def _refusals_due(self) -> None:
        if self._refused_unlogged:
            self._log_refusals()
            self._refusals_timer = asyncio.get_running_loop().call_later(
                REFUSALS_LOG_INTERVAL_S, self._refusals_due
            )
        else:
            self._refusals_timer = None

    def _log_refusals(self) -> None:
        log_event(
            _log,
            "warning",
            "Kafka listener: connections refused, at kafka_max_connections",
            refused=self._refused_unlogged,
            open=len(self.connections),
            kafka_max_connections=self.max_connections,
        )
        self._refused_unlogged = 0

    async def start(self, sock: socket.socket) -> tuple[str, int]:
        """Serve on a bound, listening socket; returns its address."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self),
            sock=sock,
            ssl=self.ssl_context,
            ssl_handshake_timeout=self.timeout if self.ssl_context else None,
        )
        sockets: Any = self._server.sockets
        bound = sockets[0].getsockname()
        self.api.advertised = (str(bound[0]), int(bound[1]))
        return self.api.advertised

    async def stop(self) -> Drained:
        """Stop accepting and reading, wait for the answers in flight (at most
        ``--shutdown-timeout-s``), close every connection."""
        timeout = self.shutdown_timeout
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.pause_for_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.in_flight > 0 and loop.time() < deadline:
            self.idle.clear()
            try:
                await asyncio.wait_for(self.idle.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                break
        cut_off = self.in_flight
        for connection in list(self.connections):
            connection.close("shutdown")
        if self._refusals_timer is not None:
            self._refusals_timer.cancel()
            self._refusals_timer = None
        if self._refused_unlogged:
            self._log_refusals()
        self.closes.close()
        if self._server is not None:
            await self._server.wait_closed()
        return Drained(self.drained, cut_off)


def bind_kafka_socket(address: str) -> socket.socket:
    """Bind and listen at ``--kafka-listener`` before anything else starts, so that an
    address in use is one line and no opened log. ``OSError`` if it cannot be bound."""
    host, port = parse_listen(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


async def start_kafka_listener(
    node: Node,
    ssl_context: ssl.SSLContext | None,
    auth: KafkaAuth,
    sock: socket.socket,
) -> tuple[KafkaListener, str, int]:
    """Build the listener over ``node`` and serve on ``sock``; returns it with the bound
    host and port."""
    config = node.config
    api = KafkaApi(
        lambda: node.service,
        lambda: node.cluster,
        node.metrics,
        node.limits,
        auth,
        config.node_id,
        single_node=config.cluster is None,
        offload=node.offload,
    )
    listener = KafkaListener(
        api,
        node.metrics,
        max_frame=config.max_body_bytes,
        timeout=config.request_timeout_s,
        ssl_context=ssl_context,
        max_connections=config.kafka_max_connections,
        shutdown_timeout=config.shutdown_timeout_s,
    )
    bound_host, bound_port = await listener.start(sock)
    if config.cluster is None and bound_host in WILDCARD_HOSTS:
        # Its FindCoordinator names this node at the bound address, which a wildcard
        # is not: the advertised host stands in, with the Kafka listener's port.
        api.advertised = (advertised_host(config.advertised_listener), bound_port)
    return listener, bound_host, bound_port
