"""What `pip install sharecoord` and `make serve` install: the daemon's dependencies only.

The Spark jobs' packages (pyspark, matplotlib) are the `spark` extra and the test tools
the `dev` extra; the daemon, the log tools and the client import none of them. The
Makefile keeps one stamp per install, so going from `make serve` to `make test` installs
the extras, and the other way round installs nothing.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import child_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
# Declared on purpose (the project's brief names them); where they go is ours to say.
REQUIRED = {"aiohttp", "msgpack", "sortedcontainers", "pyspark", "uvloop", "pytest-asyncio"}
NOT_FOR_THE_DAEMON = {"pyspark", "pyarrow", "matplotlib", "pytest-asyncio", "pytest", "psycopg"}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        document: dict[str, Any] = tomllib.load(f)["project"]
    return document


def test_the_core_install_is_the_daemon_s_dependencies(project: dict[str, Any]) -> None:
    core = names(project["dependencies"])
    assert core == {
        "aiohttp",
        "msgpack",
        "msgspec",
        "prometheus-client",
        "sortedcontainers",
        "uvloop",
        "tomli",
    }
    assert not core & NOT_FOR_THE_DAEMON
    extras = project["optional-dependencies"]
    # What a cluster's executors import, packed and shipped by the jobs (listed one by
    # one: spark_jobs/shipenv.py packs exactly these and what they require). pyarrow:
    # the data source hands Arrow batches to the JVM; the history is Parquet. psycopg:
    # the jobs over the PostgreSQL store read it by COPY out in the executors.
    assert names(extras["spark-executor"]) == {"msgpack", "msgspec", "numpy", "pyarrow", "psycopg"}
    assert "sharecoord[spark-executor]" in extras["spark"]
    assert names(extras["spark"]) == {"sharecoord", "pyspark", "matplotlib", "packaging"}
    assert "pytest-asyncio" in names(extras["dev"])
    # The PostgreSQL store's driver: its own extra, which `make test` pulls in too.
    assert names(extras["postgres"]) == {"psycopg"}
    assert "sharecoord[postgres]" in extras["dev"]
    declared = core.union(*(names(e) for e in extras.values()))
    assert declared >= REQUIRED | {"matplotlib", "pyarrow"}


def test_the_license_is_an_spdx_expression(project: dict[str, Any]) -> None:
    assert project["license"] == "Apache-2.0"
    with open(REPO / "pyproject.toml", "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    (setuptools,) = (r for r in requires if r.startswith("setuptools"))
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert minimum is not None and int(minimum[1]) >= 77  # PEP 639 expressions


def test_the_kafka_declarations_ship_with_the_package() -> None:
    """The Kafka listener's codec is compiled from protocol/kafka_specs/*.json: a wheel
    without them would install a daemon that cannot start."""
    with open(REPO / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    assert "protocol.kafka_specs" in setuptools["packages"]
    patterns = setuptools["package-data"]["protocol.kafka_specs"]
    files = sorted(p.name for p in (REPO / "protocol" / "kafka_specs").iterdir())
    assert files and all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files)


def test_the_daemon_and_the_client_run_without_the_extras() -> None:
    """Every module a lean install runs, imported with the extras' packages hidden."""
    hidden = (
        "pyspark",
        "pyarrow",
        "matplotlib",
        "pytest",
        "pytest_asyncio",
        "hypothesis",
        "yaml",
        "psycopg",
        "packaging",
    )
    code = "; ".join(
        [
            "import sys",
            *(f"sys.modules[{m!r}] = None" for m in hidden),
            "import server.commands.cli, server.daemon, server.http.app, server.tools, client",
            "from server.commands.cli import main",
            "sys.exit(main(['log', 'verify', '--help']))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


# --- the Makefile's stamps -----------------------------------------------------------------


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The Makefile and pyproject.toml beside a .venv whose python exists (so the venv
    is not made again); `make -n` then says which installs a target would run."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    set_mtime(tmp_path / "pyproject.toml", 1000)
    return tmp_path


def set_mtime(path: Path, when: int) -> None:
    path.touch()
    os.utime(path, (when, when))


def installs(checkout: Path, target: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target], cwd=checkout, capture_output=True, text=True, check=True
    )
    return [line for line in done.stdout.splitlines() if "pip install" in line]


LEAN = "pip install --quiet -e ."
FULL = "pip install --quiet -e '.[dev,spark]'"


@pytest.mark.parametrize("target", ["test", "lint", "openapi", "bench", "reliability", "venv"])
def test_the_tool_targets_install_the_extras(checkout: Path, target: str) -> None:
    assert [line.split("/bin/python -m ")[-1] for line in installs(checkout, target)] == [FULL]


def test_serve_installs_the_daemon_only(checkout: Path) -> None:
    assert [line.split("/bin/python -m ")[-1] for line in installs(checkout, "serve")] == [LEAN]


def test_test_after_serve_still_installs_the_extras(checkout: Path) -> None:
    set_mtime(checkout / ".venv" / ".installed-core", 2000)  # `make serve` ran
    assert installs(checkout, "serve") == []
    assert [line.split("/bin/python -m ")[-1] for line in installs(checkout, "test")] == [FULL]


def test_serve_after_test_installs_nothing_more(checkout: Path) -> None:
    for stamp in (".installed-core", ".installed-dev"):  # what `make test` leaves
        set_mtime(checkout / ".venv" / stamp, 2000)
    assert installs(checkout, "serve") == []
    assert installs(checkout, "test") == []


def test_a_changed_pyproject_renews_each_install(checkout: Path) -> None:
    for stamp in (".installed-core", ".installed-dev"):
        set_mtime(checkout / ".venv" / stamp, 2000)
    set_mtime(checkout / "pyproject.toml", 3000)
    assert [line.split("/bin/python -m ")[-1] for line in installs(checkout, "serve")] == [LEAN]
    assert [line.split("/bin/python -m ")[-1] for line in installs(checkout, "test")] == [FULL]
