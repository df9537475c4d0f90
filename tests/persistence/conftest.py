"""Fixtures for the log's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


from tests.figures import figures  # noqa: E402, F401
