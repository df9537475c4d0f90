"""Fixtures of the reliability suite (issue #7).

The daemons come from the harness (``spawn``, ``daemons``: tests/harness), the client
session from the end-to-end tests (``session``), the test PKI from the suite-wide
``pki`` fixture. ``figures`` collects what a run measured (cycles survived, faults
injected, bad inputs tried, ...): they are printed at the end of the run, and written as
JSON to the file named by ``SHARECOORD_RELIABILITY_FIGURES`` when it is set, whence
RELIABILITY.md's figures.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fullfs import full_disk  # noqa: F401
from tests.server.conftest import session  # noqa: F401

FIGURES_ENV = "SHARECOORD_RELIABILITY_FIGURES"

_collected: dict[str, dict[str, Any]] = {}


class Figures:
    """What one test measured, under its node id."""

    def __init__(self, node_id: str) -> None:
        self.values: dict[str, Any] = {}
        _collected[node_id] = self.values

    def add(self, name: str, amount: int | float = 1) -> None:
        self.values[name] = self.values.get(name, 0) + amount

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    started = time.monotonic()
    recorded = Figures(request.node.nodeid)
    yield recorded
    recorded.set("seconds", round(time.monotonic() - started, 1))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _collected:
        return
    terminalreporter.section("reliability figures")
    for node_id, values in _collected.items():
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        terminalreporter.write_line(f"{node_id}: {shown}")
    path = os.environ.get(FIGURES_ENV)
    if path:
        document = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "tests": _collected,
        }
        with open(path, "w") as out:
            json.dump(document, out, indent=2, sort_keys=True)
