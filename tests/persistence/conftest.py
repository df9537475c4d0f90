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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long variants (marked slow) run with `-m slow` only: a plain run of the suite
    keeps to the short ones."""
    if config.option.markexpr:
        return
    here = Path(__file__).parent
    slow = [i for i in items if i.get_closest_marker("slow") and here in i.path.parents]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]
