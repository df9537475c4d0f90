"""The harness's pytest fixtures (a plugin, loaded by tests/conftest.py).

``daemons`` keeps every daemon a test makes and kills whatever still runs at its end;
``spawn`` starts one off the event loop for async tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemon import Daemon, DaemonConfig


class Daemons:
    """The daemons of one test, started or not."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.made: list[Daemon] = []

    def make(self, data_dir: str | Path, *flags: str, **config: Any) -> Daemon:
        """A daemon (not started) on ``data_dir`` with ``flags`` and ``DaemonConfig``'s
        other fields; its stderr goes to the test's log directory unless told."""
        config.setdefault("log_dir", self.log_dir)
        daemon = Daemon(DaemonConfig(Path(data_dir), flags, **config))
        self.made.append(daemon)
        return daemon

    def __iter__(self) -> Iterator[Daemon]:
        return iter(self.made)

    def kill_all(self) -> None:
        for daemon in self.made:
            if daemon.running():
                daemon.kill()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    """Every daemon a test makes; whatever still runs at the end is killed."""
    made = Daemons(tmp_path / "logs")
    yield made
    made.kill_all()


Spawn = Callable[..., Awaitable[Daemon]]


@pytest.fixture
def spawn(daemons: Daemons) -> Spawn:
    """``await spawn(data_dir, *flags, ready=True, **config)``: make a daemon (see
    ``Daemons.make``) and start it off the loop; with ``ready``, once /readyz answers
    200. ``signal_when_listening`` is passed to ``Daemon.start``."""

    async def start(
        data_dir: str | Path,
        *flags: str,
        ready: bool = True,
        signal_when_listening: int | None = None,
        **config: Any,
    ) -> Daemon:
        daemon = daemons.make(data_dir, *flags, **config)
        return await asyncio.to_thread(
            daemon.start, ready=ready, signal_when_listening=signal_when_listening
        )

    return start
