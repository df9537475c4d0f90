"""docs/design.md#the-layers: imports point downwards only.

server -> persistence -> protocol; client -> protocol; spark_jobs -> persistence,
protocol. Nothing in protocol touches another layer; the server's compact and audit
commands may start the Spark jobs' runner (spark_jobs.submit), which imports no server
code. kafka_peer (Kafka's broker, for the tests and the bench) uses protocol only, and
no layer uses it: the broker is never part of what `make serve` runs.

Inside server/ (docs/design.md#one-node-two-transports): the two transports (server.http,
server.kafka) do not import each other, nor a command (server.commands) or the daemon
that composes them (server.daemon); nothing below them (the node, its store, runtimes,
service, and what they use) imports a transport, a command or the daemon.

``server_rule_violations`` applies the server's rules to any tree; the tests run it on
the repository, and on made-up trees holding one forbidden import each, so that every
rule is seen to fail where it should.
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
TRANSPORTS = ("server.http", "server.kafka")
COMMANDS = "server.commands"
DAEMON = "server.daemon"
# The one module of server/ that may import spark_jobs: the compact and audit launchers.
SPARK_LAUNCHERS = "server.commands.spark"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(root: Path, path: Path) -> set[str]:
    """Every module ``path`` imports, by its full name (``from a.b import c`` counts as
    ``a.b`` and ``a.b.c``: ``c`` may be a module), relative imports resolved."""
    package = module_name(root, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def imported_layers(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(REPO, path)} & set(LAYERS)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def broken_rule(module: str, name: str) -> str | None:
    """The server's rule that ``module`` importing ``name`` breaks, if any."""
    own = next((t for t in TRANSPORTS if within(module, t)), None)
    if within(name, "spark_jobs") and module != SPARK_LAUNCHERS:
        return f"only {SPARK_LAUNCHERS} starts the Spark jobs"
    if own is not None:
        if any(within(name, t) for t in TRANSPORTS if t != own):
            return "the transports do not import each other"
        if within(name, COMMANDS) or within(name, DAEMON):
            return "a transport imports no command and not the daemon"
    elif not (within(module, COMMANDS) or module == DAEMON) and any(
        within(name, t) for t in (*TRANSPORTS, COMMANDS, DAEMON)
    ):
        return "below the transports, nothing imports a transport, a command or the daemon"
    return None


def server_rule_violations(root: Path) -> list[str]:
    """Every module in ``root``/server that breaks one of the server's rules, once per
    rule, as ``module imports name: rule``."""
    problems: dict[tuple[str, str], str] = {}
    for path in sorted((root / "server").rglob("*.py")):
        module = module_name(root, path)
        for name in sorted(imported_modules(root, path)):
            rule = broken_rule(module, name)
            if rule is not None:
                problems.setdefault((module, rule), f"{module} imports {name}: {rule}")
    return list(problems.values())


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_point_downwards_only(layer):
    for path in sorted((REPO / layer).rglob("*.py")):
        wrong = imported_layers(path) - ALLOWED[layer]
        assert not wrong, f"{path.relative_to(REPO)} imports {sorted(wrong)}"


def test_the_node_and_its_transports_keep_their_places():
    assert server_rule_violations(REPO) == []


def test_the_rules_see_the_server_s_real_modules():
    """The rules name modules that exist: a rename would otherwise make them vacuous."""
    for name in (*TRANSPORTS, COMMANDS, DAEMON, SPARK_LAUNCHERS, "server.node"):
        path = REPO / Path(*name.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name


# --- each rule, broken once in a made-up tree ------------------------------------------------

FORBIDDEN = {
    "http-imports-kafka": ("server/http/app.py", "from server.kafka.listener import X"),
    "kafka-imports-http": ("server/kafka/listener.py", "import server.http.edge"),
    "kafka-imports-http-relatively": ("server/kafka/listener.py", "from ..http import edge"),
    "node-imports-http": ("server/node.py", "from server.http import app"),
    "node-imports-kafka": ("server/node.py", "from server.kafka.listener import X"),
    "node-imports-a-command": ("server/node.py", "from server.commands.serve import run"),
    "store-imports-the-daemon": ("server/store.py", "from server.daemon import run_server"),
    "transport-imports-a-command": ("server/http/app.py", "from server.commands import cli"),
    "transport-imports-the-daemon": ("server/kafka/listener.py", "import server.daemon"),
    "node-imports-spark-jobs": ("server/node.py", "from spark_jobs import submit"),
    "another-command-imports-spark-jobs": ("server/commands/log.py", "import spark_jobs.submit"),
}
ALLOWED_IMPORTS = (
    ("server/daemon.py", "from server.http.transport import X\nfrom server.kafka import Y"),
    ("server/commands/serve.py", "from server.daemon import run_server"),
    ("server/commands/scram.py", "from server.kafka.auth import add_user"),
    ("server/commands/spark.py", "from spark_jobs import submit"),
    ("server/http/app.py", "from server.node import Node\nfrom server.http import edge"),
    ("server/kafka/listener.py", "from server.node import Node\nfrom . import connection"),
)


def made_up_tree(root: Path, extra: tuple[str, str] | None) -> Path:
    """A server/ of empty modules where the rules apply, one of them importing ``extra``."""
    for name, _ in (*FORBIDDEN.values(), *ALLOWED_IMPORTS):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in (path.parent, *path.parent.parents):
            if package == root:
                break
            (package / "__init__.py").touch()
        path.touch()
    if extra is not None:
        name, line = extra
        (root / name).write_text(line + "\n")
    return root


@pytest.mark.parametrize("case", FORBIDDEN, ids=list(FORBIDDEN))
def test_each_rule_refuses_its_forbidden_import(tmp_path, case):
    name, line = FORBIDDEN[case]
    (problem,) = server_rule_violations(made_up_tree(tmp_path, (name, line)))
    assert problem.startswith(module_name(tmp_path, tmp_path / name) + " imports"), problem


@pytest.mark.parametrize("allowed", ALLOWED_IMPORTS, ids=[a for a, _ in ALLOWED_IMPORTS])
def test_the_rules_let_the_composition_through(tmp_path, allowed):
    assert server_rule_violations(made_up_tree(tmp_path, allowed)) == []
