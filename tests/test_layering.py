"""docs/design.md#the-layers: imports point downwards only.

server -> persistence -> protocol; client -> protocol; spark_jobs -> persistence,
protocol. Nothing in protocol touches another layer; the server's CLI may start the
Spark jobs' runner (spark_jobs.submit), which imports no server code. kafka_peer (Kafka's
broker, for the tests and the bench) uses protocol only, and no layer uses it: the
broker is never part of what `make serve` runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("protocol", "persistence", "server", "client", "spark_jobs", "kafka_peer")
ALLOWED = {
    "protocol": {"protocol"},
    "persistence": {"persistence", "protocol"},
    "server": {"server", "persistence", "protocol", "spark_jobs"},
    "client": {"client", "protocol"},
    "spark_jobs": {"spark_jobs", "persistence", "protocol"},
    "kafka_peer": {"kafka_peer", "protocol"},
}


def imported_layers(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & set(LAYERS)
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_downwards_only(layer):
    for path in sorted((REPO / layer).rglob("*.py")):
        wrong = imported_layers(path) - ALLOWED[layer]
        assert not wrong, f"{path.relative_to(REPO)} imports {sorted(wrong)}"


def test_server_uses_spark_jobs_only_to_start_them():
    for path in sorted((REPO / "server").rglob("*.py")):
        if "spark_jobs" in imported_layers(path):
            assert path.name == "cli.py", f"{path.name} imports spark_jobs"
