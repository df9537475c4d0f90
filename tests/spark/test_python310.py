"""The code Spark runs in the image runs on its Python, 3.10 (Ubuntu 22.04): the jobs'
drivers and executors must share a minor version, and the image has no other.

Checked by reading: the sources parse as Python 3.10 and use no name the 3.11+
standard library added."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spark_jobs.submit import SHIPPED_PACKAGES
from tests.spark.conftest import REPO_ROOT

# Standard-library names added in 3.11 or later that code could reach for.
NEWER_MODULES = {"tomllib", "wsgiref.types"}
NEWER_NAMES = {
    ("typing", "Self"),
    ("typing", "LiteralString"),
    ("typing", "Never"),
    ("typing", "assert_never"),
    ("typing", "reveal_type"),
    ("typing", "Required"),
    ("typing", "NotRequired"),
    ("typing", "TypeVarTuple"),
    ("typing", "Unpack"),
    ("typing", "override"),
    ("enum", "StrEnum"),
    ("enum", "ReprEnum"),
    ("enum", "verify"),
    ("datetime", "UTC"),
    ("asyncio", "TaskGroup"),
    ("asyncio", "timeout"),
    ("asyncio", "Runner"),
    ("hashlib", "file_digest"),
    ("itertools", "batched"),
    ("builtins", "ExceptionGroup"),
    ("builtins", "BaseExceptionGroup"),
}
BUILTINS_ADDED = {name for module, name in NEWER_NAMES if module == "builtins"}

SOURCES = sorted(
    path for package in SHIPPED_PACKAGES for path in (REPO_ROOT / package).glob("*.py")
)


def newer_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name in NEWER_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module in NEWER_MODULES:
                found.append(node.module)
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if (node.module, alias.name) in NEWER_NAMES
            ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in NEWER_NAMES:
                found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in BUILTINS_ADDED:
            found.append(node.id)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_executor_code_is_python_3_10(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path), feature_version=(3, 10))
    assert newer_uses(tree) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import tomllib",
        "from typing import Self",
        "from enum import StrEnum",
        "import datetime\ndatetime.UTC",
        "raise ExceptionGroup('x', [])",
    ],
)
def test_the_check_sees_what_3_10_lacks(snippet: str) -> None:
    assert newer_uses(ast.parse(snippet)) != []


def test_the_check_sees_3_11_syntax() -> None:
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))
