"""docker-compose.yml and the Dockerfile, checked by reading them (no Docker engine
runs here): every service's command is one the CLI accepts, the image's Spark is the
installed pyspark's, every file they name exists, every service shares the one data
volume and runs the one image, published ports stay on loopback, the daemon requires
its token from a secret, the Spark services report their health, and the one-shot
jobs' drivers advertise an address the executors can reach."""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyspark
import pytest
import yaml

from server.commands.cli import build_parser
from server.commands.spark import run_audit, run_compact
from server.config import (
    AUDIT_SETTINGS,
    COMPACT_SETTINGS,
    SERVE_SETTINGS,
    load_serve_config,
    load_settings,
)
from spark_jobs.submit import SHIPPED_PACKAGES
from tests.spark.conftest import REPO_ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
DATA_VOLUME = "sharecoord-data"
CLASSES_VOLUME = "sharecoord-spark-classes:/var/cache/sharecoord/spark-classes"
SPARK_CLASS = "/opt/spark/bin/spark-class"
TOKEN_SECRET = "sharecoord-token"
SPARK_UID = "185"  # the spark user of the apache/spark images, which the services run as
ONE_SHOT_JOBS = ("compact", "audit")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
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
    """The daemon and Spark's services (the cluster profile's: tests/test_compose_cluster.py)."""
    found: dict[str, dict[str, Any]] = compose["services"]
    return {name: s for name, s in found.items() if "cluster" not in s.get("profiles", [])}


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
    # A subpackage ("protocol.kafka_specs") comes with its top-level directory.
    needed = {
        "pyproject.toml",
        pyproject["project"]["readme"],
        *(package.split(".")[0] for package in pyproject["tool"]["setuptools"]["packages"]),
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
    assert "pip install --no-cache-dir '.[spark,postgres]'" in runs
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
        assert service["image"] == image, name
        assert service["volumes"][0] == f"{DATA_VOLUME}:/data", name
        assert service["volumes"][1:] == ([CLASSES_VOLUME] if name in ONE_SHOT_JOBS else [])
    assert compose["volumes"][DATA_VOLUME] is None


def test_the_jobs_keep_their_driver_classes_in_a_volume_the_image_made_theirs(
    compose: dict[str, Any],
) -> None:
    """A `run --rm` container's home goes with it: the class cache the image names
    (spark_jobs/classcache.py) is a volume, its mount point made and owned by the
    image's user so that a new volume is theirs to write."""
    instructions = dockerfile_instructions()
    env = " ".join(rest for word, rest in instructions if word == "ENV")
    cache = CLASSES_VOLUME.split(":", 1)[1]
    assert f"SHARECOORD_SPARK_CLASS_CACHE={cache}" in env.split()
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert f"mkdir -p /data {cache}" in runs and f"chown spark:spark /data {cache}" in runs
    assert compose["volumes"][CLASSES_VOLUME.split(":", 1)[0]] is None


def test_one_service_builds_the_image_the_others_reuse(compose: dict[str, Any]) -> None:
    """Built once: the others name the same image and never look for it in a registry
    (Compose builds before it creates containers, and skips pulling an image another
    service builds)."""
    builders = [name for name, service in services(compose).items() if "build" in service]
    assert builders == ["sharecoord"]
    assert (REPO_ROOT / services(compose)["sharecoord"]["build"] / "Dockerfile").is_file()
    for name, service in services(compose).items():
        if name != "sharecoord":
            assert service["pull_policy"] == "never", name


def test_published_ports_listen_on_loopback_only(compose: dict[str, Any]) -> None:
    """The API's admin endpoints (DELETE /v1/admin/topics/{id}) and Spark's UIs are not
    for the network at large."""
    published = 0
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str), (name, port)  # the short syntax, host IP first
            host_ip, host_port, container_port = port.split(":")
            assert ipaddress.ip_address(host_ip).is_loopback, (name, port)
            assert host_port == container_port
            published += 1
    # The daemon, the master's UI and the worker's UI; the cluster profile's two nodes.
    assert published == 5


def test_the_sharecoord_commands_are_ones_the_cli_takes(compose: dict[str, Any]) -> None:
    parser = build_parser()
    master = spark_master_url(compose)
    by_name = services(compose)

    serve = parser.parse_args(by_name["sharecoord"]["command"][1:])
    config = load_serve_config(serve, environ={})
    assert (config.host, config.port, config.data_dir) == ("0.0.0.0", 9095, "/data")
    assert config.auth_token_file == f"/run/secrets/{TOKEN_SECRET}"

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
    assert f"127.0.0.1:{port}:{port}" in daemon["ports"]
    probe = " ".join(daemon["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/readyz" in probe  # open without the token
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
    for name in ONE_SHOT_JOBS:
        job = services(compose)[name]
        assert job["profiles"] == [name]
        assert job["restart"] == "no"
        assert {"spark-master", "spark-worker"} <= set(job["depends_on"])


def test_the_daemon_takes_its_token_from_a_secret_only_it_can_read(
    compose: dict[str, Any],
) -> None:
    secret = compose["secrets"][TOKEN_SECRET]
    assert set(secret) == {"environment"}  # copied in by Compose, not bind-mounted
    by_name = services(compose)
    (granted,) = by_name["sharecoord"]["secrets"]
    assert granted["source"] == TOKEN_SECRET
    assert "target" not in granted  # so it is /run/secrets/<source>
    assert (granted["uid"], granted["gid"], granted["mode"]) == (SPARK_UID, SPARK_UID, 0o400)
    assert [name for name, s in by_name.items() if "secrets" in s] == ["sharecoord"]
    # The token reaches neither the image's build context nor git.
    for ignore_file in (DOCKERIGNORE, REPO_ROOT / ".gitignore"):
        assert ".env" in ignore_file.read_text().split(), ignore_file


def test_the_spark_services_report_their_health_and_start_in_order(
    compose: dict[str, Any],
) -> None:
    by_name = services(compose)
    for name, ui_port in (("spark-master", "8080"), ("spark-worker", "8081")):
        service = by_name[name]
        assert f"--webui-port {ui_port}" in " ".join(service["command"])
        check = service["healthcheck"]
        assert check["test"][0] == "CMD"
        assert f"http://127.0.0.1:{ui_port}/" in " ".join(check["test"])
    assert "'ALIVE'" in " ".join(by_name["spark-master"]["healthcheck"]["test"])
    healthy = {"condition": "service_healthy"}
    assert by_name["spark-worker"]["depends_on"] == {"spark-master": healthy}
    for name in ONE_SHOT_JOBS:
        assert by_name[name]["depends_on"] == {"spark-master": healthy, "spark-worker": healthy}


@pytest.mark.parametrize("job", ONE_SHOT_JOBS)
def test_the_jobs_drivers_advertise_an_address_the_executors_reach(
    compose: dict[str, Any], job: str
) -> None:
    """Run here, the entrypoint puts spark.driver.host, a non-loopback address of this
    machine, into SPARK_SUBMIT_OPTS and then runs the command it was given."""
    entrypoint = services(compose)[job]["entrypoint"]
    assert entrypoint[0] == "/opt/entrypoint.sh"  # the image's own, which passes through
    shell = [part.replace("$$", "$") for part in entrypoint[1:]]  # Compose's escaping
    show = ["sh", "-c", 'printf %s "$SPARK_SUBMIT_OPTS"']
    env = {"PATH": os.environ["PATH"], "SPARK_SUBMIT_OPTS": "-Dkept=1"}
    done = subprocess.run(
        shell + show, capture_output=True, text=True, timeout=30, check=True, env=env
    )
    match = re.fullmatch(r"-Dkept=1 -Dspark\.driver\.host=(\S+)", done.stdout)
    assert match is not None, done.stdout
    assert not ipaddress.ip_address(match[1]).is_loopback
    assert services(compose)[job]["command"][:2] == ["sharecoord", job]


def test_the_top_comment_says_how_to_get_the_audit_report_out() -> None:
    head = COMPOSE.read_text().split("\nname:", 1)[0]
    assert "docker compose cp sharecoord:/data/audit" in head
    assert "SHARECOORD_TOKEN" in head


def test_the_image_ships_every_package_an_executor_imports(pyproject: dict[str, Any]) -> None:
    assert set(SHIPPED_PACKAGES) <= set(pyproject["tool"]["setuptools"]["packages"])
