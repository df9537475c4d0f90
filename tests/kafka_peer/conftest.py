"""One Kafka broker and one sharecoord daemon for all the tests of this folder (stopped
once they are done, not at the end of the whole run), set up alike
(tests/kafka_peer/sides.py), and the figures the differential tests print at the end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from kafka_peer import KAFKA_VERSION, Broker, PeerUnavailable
from tests.harness import Daemon
from tests.kafka_peer.sequences import Topics
from tests.kafka_peer.sides import start_kafka, start_sharecoord


@dataclass
class Peers:
    broker: Broker
    topics: Topics
    daemon: Daemon
    kafka: tuple[str, int]
    sharecoord: tuple[str, int]


@dataclass
class Figures:
    """What the differential tests compared, for the closing summary."""

    rpcs: int = 0
    sequences: int = 0
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    lines: list[str] = field(default_factory=list)


FIGURES = Figures()


@pytest.fixture(scope="package")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    unavailable = None
    try:
        broker, topics = start_kafka(tmp_path_factory.mktemp("kafka-broker"))
    except PeerUnavailable as exc:
        unavailable = str(exc)
    if unavailable is not None:
        pytest.fail(unavailable, pytrace=False)
    try:
        daemon, address = start_sharecoord(tmp_path_factory.mktemp("sharecoord"), topics)
        try:
            yield Peers(broker, topics, daemon, (broker.host, broker.port), address)
        finally:
            daemon.terminate()
    finally:
        clean = broker.stop()
        FIGURES.lines.append(
            f"Kafka {KAFKA_VERSION} broker stopped {'cleanly' if clean else 'by SIGKILL'}"
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES.lines:
        return
    terminalreporter.section("Kafka peer: differential comparison")
    for line in FIGURES.lines:
        terminalreporter.write_line(line)
