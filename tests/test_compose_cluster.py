"""docker-compose.yml's `cluster` profile (docs/operations.md, "Running a cluster on
PostgreSQL"), checked by reading it: a PostgreSQL primary that waits at every commit for
its synchronous standby, the standby made from it, and two sharecoord nodes on both
through libpq's multi-host URI, each with the token, published on 127.0.0.1 only, the
password nowhere in a command or a URI. (Docker is not part of what the suite needs, so
`docker compose config` is not run here.)
"""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from server.commands.cli import build_parser
from server.config import load_serve_config
from tests.harness import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
PROFILE = "cluster"
DATABASES = ("pg-primary", "pg-standby")
NODES = ("node-1", "node-2")
TOKEN_FILE = "/run/secrets/sharecoord-token"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def profile(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if PROFILE in service.get("profiles", [])
    }


def serve_config(service: dict[str, Any]) -> Any:
    """The node's settings as its command and environment give them."""
    parsed: argparse.Namespace = build_parser().parse_args(service["command"][1:])
    environment = {k: str(v) for k, v in service["environment"].items()}
    return load_serve_config(parsed, environ=environment)


def postgres_settings(service: dict[str, Any]) -> dict[str, str]:
    command = service["command"]
    assert command[0] == "postgres"
    pairs = [command[i + 1] for i, word in enumerate(command) if word == "-c"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_profile_is_a_primary_a_standby_and_two_nodes(compose: dict[str, Any]) -> None:
    assert set(profile(compose)) == {*DATABASES, *NODES}
    for name in DATABASES:
        assert profile(compose)[name]["image"].startswith("postgres:15")


def test_the_primary_waits_for_the_standby_at_every_commit(compose: dict[str, Any]) -> None:
    services = profile(compose)
    settings = postgres_settings(services["pg-primary"])
    assert settings["synchronous_commit"] == "on"
    standby_script = next(
        REPO_ROOT / volume.split(":")[0]
        for volume in services["pg-standby"]["volumes"]
        if volume.startswith("./")
    )
    script = standby_script.read_text()
    # The standby calls itself what the primary waits for, and is made from the primary.
    assert f"cluster_name={settings['synchronous_standby_names']}" in script
    assert "pg_basebackup -h pg-primary" in script and " -R" in script
    assert "pg-primary" in services["pg-standby"]["depends_on"]
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (REPO_ROOT / volume.split(":")[0]).is_file(), volume


def test_the_nodes_follow_whichever_server_accepts_writes(compose: dict[str, Any]) -> None:
    ids = set()
    for name in NODES:
        service = profile(compose)[name]
        config = serve_config(service)
        uri = conninfo_to_dict(config.state_store)
        assert uri["host"] == ",".join(DATABASES)
        assert uri["target_session_attrs"] == "read-write"
        assert "password" not in uri  # libpq's PGPASSWORD, from .env
        assert service["environment"]["PGPASSWORD"].startswith("${SHARECOORD_PG_PASSWORD:?")
        assert set(DATABASES) <= set(service["depends_on"])
        ids.add(config.node_id)
    assert len(ids) == len(NODES)


def test_each_node_is_published_on_loopback_only_where_it_says_it_is(
    compose: dict[str, Any],
) -> None:
    for name in NODES:
        service = profile(compose)[name]
        config = serve_config(service)
        (port,) = service["ports"]
        host_ip, host_port, container_port = port.split(":")
        assert ipaddress.ip_address(host_ip).is_loopback, (name, port)
        assert int(host_port) == int(container_port) == config.port
        # find-coordinator names the address a client on the host reaches.
        assert config.advertised_listener == f"{host_ip}:{host_port}"
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{config.port}/readyz" in probe
    for name in DATABASES:
        assert "ports" not in profile(compose)[name]  # reached by the nodes alone


def test_each_node_requires_the_token_from_a_secret(compose: dict[str, Any]) -> None:
    for name in NODES:
        service = profile(compose)[name]
        assert serve_config(service).auth_token_file == TOKEN_FILE
        (granted,) = service["secrets"]
        assert granted["source"] == TOKEN_FILE.rsplit("/", 1)[1]
        assert granted["mode"] == 0o400
    assert set(compose["secrets"]["sharecoord-token"]) == {"environment"}


def test_the_top_comment_says_how_to_start_the_cluster() -> None:
    head = COMPOSE.read_text().split("\nname:", 1)[0]
    assert f"docker compose --profile {PROFILE} up -d {' '.join(NODES)}" in head
    assert "SHARECOORD_PG_PASSWORD" in head and "SHARECOORD_REPLICATION_PASSWORD" in head
