"""Apache Kafka's broker, pinned to one version, run beside sharecoord for the
differential tests (tests/kafka_peer) and the bench (bench/kafka_peer.py). Never part of
what `make serve` installs or runs: its jars live in a cache directory outside git."""

from kafka_peer.broker import (
    KAFKA_VERSION,
    Broker,
    BrokerSettings,
    PeerUnavailable,
    fetch,
    running_broker,
)

__all__ = [
    "KAFKA_VERSION",
    "Broker",
    "BrokerSettings",
    "PeerUnavailable",
    "fetch",
    "running_broker",
]
