"""docker-compose.yml and the Dockerfile, checked by reading them (no registry is
reachable to run them): every service's command is one the CLI accepts, the image's
Spark is the installed pyspark's, every file they name exists, and every service shares
the one data volume."""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyspark
import pytest

from server.cli import build_parser, run_audit, run_compact
from server.config import (
    AUDIT_SETTINGS,
    COMPACT_SETTINGS,
    SERVE_SETTINGS,
    load_serve_config,
    load_settings,
)
from spark_jobs.submit import SHIPPED_PACKAGES
from tests.spark.compose_yaml import parse
from tests.spark.conftest import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
DATA_VOLUME = "sharecoord-data"
SPARK_CLASS = "/opt/spark/bin/spark-class"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = parse(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def spark_master_url(compose: dict[str, Any]) -> str:
    command = services(compose)["spark-master"]["command"]
    host = command[command.index("--host") + 1]
    port = command[command.index("--port") + 1]
    return f"spark://{host}:{port}"


def test_the_image_runs_the_spark_of_the_installed_and_pinned_pyspark(
    pyproject: dict[str, Any],
) -> None:
    (base,) = [rest for word, rest in dockerfile_instructions() if word == "FROM"]
    version = pyspark.__version__
    assert base == f"apache/spark:{version}-scala2.13-java17-python3-ubuntu"
    assert f"pyspark=={version}" in pyproject["project"]["optional-dependencies"]["spark"]
    # The Scala of the tag is the Scala of pyspark's jars.
    jars = os.listdir(Path(pyspark.__file__).parent / "jars")
    assert f"spark-core_2.13-{version}.jar" in jars


def test_the_image_installs_the_project_from_files_that_exist(pyproject: dict[str, Any]) -> None:
    instructions = dockerfile_instructions()
    copied = []
    for word, rest in instructions:
        if word == "COPY":
            *sources, _ = rest.split()
            copied.extend(sources)
    for source in copied:
        assert (REPO_ROOT / source).exists(), source
    needed = {
        "pyproject.toml",
        pyproject["project"]["readme"],
        *pyproject["tool"]["setuptools"]["packages"],
    }
    assert needed <= set(copied)
    ignored = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in needed:
        assert not any(fnmatch.fnmatch(path, pattern) for pattern in ignored), path
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    # The jobs run from this image: it needs the spark extra, not only the daemon.
    assert "pip install --no-cache-dir '.[spark]'" in runs
    assert "chown spark:spark /data" in runs
    users = [rest for word, rest in instructions if word == "USER"]
    assert users[-1] == "spark"  # the services do not run as root


def test_every_service_runs_the_one_image_and_shares_the_data_volume(
    compose: dict[str, Any], pyproject: dict[str, Any]
) -> None:
    assert set(services(compose)) == {
        "sharecoord",
        "spark-master",
        "spark-worker",
        "compact",
        "audit",
    }
    image = f"sharecoord:{pyproject['project']['version']}"
    for name, service in services(compose).items():
        assert service["build"] == ".", name
        assert (REPO_ROOT / service["build"] / "Dockerfile").is_file()
        assert service["image"] == image, name
        assert service["volumes"] == [f"{DATA_VOLUME}:/data"], name
    assert compose["volumes"] == {DATA_VOLUME: None}


def test_the_sharecoord_commands_are_ones_the_cli_takes(compose: dict[str, Any]) -> None:
    parser = build_parser()
    master = spark_master_url(compose)
    by_name = services(compose)

    serve = parser.parse_args(by_name["sharecoord"]["command"][1:])
    config = load_serve_config(serve, environ={})
    assert (config.host, config.port, config.data_dir) == ("0.0.0.0", 9095, "/data")

    compact = parser.parse_args(by_name["compact"]["command"][1:])
    assert compact.command is run_compact
    values = load_settings(COMPACT_SETTINGS, compact, environ={})
    assert (values["data_dir"], values["master"]) == ("/data", master)

    audit = parser.parse_args(by_name["audit"]["command"][1:])
    assert audit.command is run_audit
    values = load_settings(AUDIT_SETTINGS, audit, environ={}, required=("out",))
    assert (values["data_dir"], values["master"]) == ("/data", master)
    assert values["out"].startswith("/data/")  # where the executors can write too

    for name in ("sharecoord", "compact", "audit"):
        assert by_name[name]["command"][0] == "sharecoord"  # the console script


def test_the_daemon_is_checked_on_readyz_and_stopped_with_time_to_drain(
    compose: dict[str, Any],
) -> None:
    daemon = services(compose)["sharecoord"]
    listen = daemon["command"][daemon["command"].index("--listen") + 1]
    port = listen.rsplit(":", 1)[1]
    assert f"{port}:{port}" in daemon["ports"]
    probe = " ".join(daemon["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/readyz" in probe
    assert daemon["stop_signal"] == "SIGTERM"
    grace = int(re.fullmatch(r"(\d+)s", daemon["stop_grace_period"]).group(1))  # type: ignore[union-attr]
    shutdown = next(s for s in SERVE_SETTINGS if s.name == "shutdown_timeout_s").default
    assert grace > shutdown
    assert "profiles" not in daemon


def test_the_spark_services_run_classes_of_this_spark_against_one_master(
    compose: dict[str, Any],
) -> None:
    by_name = services(compose)
    master, worker = by_name["spark-master"]["command"], by_name["spark-worker"]["command"]
    assert master[:2] == [SPARK_CLASS, "org.apache.spark.deploy.master.Master"]
    assert worker[:2] == [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker"]
    assert worker[-1] == spark_master_url(compose)
    assert "spark-master" in by_name["spark-worker"]["depends_on"]
    core = Path(pyspark.__file__).parent / "jars" / f"spark-core_2.13-{pyspark.__version__}.jar"
    with zipfile.ZipFile(core) as jar:
        names = set(jar.namelist())
    for command in (master, worker):
        assert command[1].replace(".", "/") + ".class" in names


def test_compaction_and_audit_are_one_shot_jobs_behind_profiles(compose: dict[str, Any]) -> None:
    for name in ("compact", "audit"):
        job = services(compose)[name]
        assert job["profiles"] == [name]
        assert job["restart"] == "no"
        assert {"spark-master", "spark-worker"} <= set(job["depends_on"])


def test_the_image_ships_every_package_an_executor_imports(pyproject: dict[str, Any]) -> None:
    assert set(SHIPPED_PACKAGES) <= set(pyproject["tool"]["setuptools"]["packages"])
