"""Fixtures for the log's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from blockbuster import BlockBuster, blockbuster_ctx


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Any blocking call made on a running event loop fails the test (as aiohttp's own
    suite does): the group commit must do its file work in threads."""
    with blockbuster_ctx() as detector:
        yield detector


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")
