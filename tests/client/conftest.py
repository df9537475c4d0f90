"""Fixtures of the client's tests: real daemons, clients that close, certificates."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from client import ShareCoordinatorClient
from protocol.topic_id import topic_id_to_rfc4122
from tests.client.daemons import Daemon, metric

# Two spellings of one Kafka topic id (SPEC §1.2): 22-char base64url and RFC 4122.
TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
TOPIC_RFC4122 = topic_id_to_rfc4122(TOPIC)
OTHER_TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"

_groups = itertools.count()


@pytest.fixture(scope="session")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the tests whose behaviour is per key: each uses its own group."""
    daemon = Daemon(tmp_path_factory.mktemp("shared") / "data").start()
    yield daemon
    daemon.stop()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Make daemons (not started) whose processes end with the test."""
    made: list[Daemon] = []
    names = itertools.count()

    def make(**kwargs: Any) -> Daemon:
        daemon = Daemon(tmp_path / f"data{next(names)}", **kwargs)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.stop()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., ShareCoordinatorClient]]:
    """Make clients that are closed after the test."""
    made: list[ShareCoordinatorClient] = []

    def make(*args: Any, **kwargs: Any) -> ShareCoordinatorClient:
        client = ShareCoordinatorClient(*args, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A group id no other test uses (tests share the session daemon)."""
    return f"{request.node.name[:60]}-{next(_groups)}"


@dataclass
class Trace:
    """What a client sent, seen through an aiohttp ``TraceConfig``."""

    config: aiohttp.TraceConfig
    requests: list[tuple[str, str, str | None]]  # method, path, Content-Type

    def paths(self, suffix: str = "") -> list[str]:
        return [path for _, path, _ in self.requests if path.endswith(suffix)]


def trace() -> Trace:
    seen: list[tuple[str, str, str | None]] = []

    async def on_start(session: Any, context: Any, params: aiohttp.TraceRequestStartParams) -> None:
        seen.append((params.method, params.url.path, params.headers.get("Content-Type")))

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_start)
    return Trace(config, seen)


def request_ended(path_suffix: str) -> tuple[aiohttp.TraceConfig, asyncio.Event]:
    """A trace config that sets the event when a request to ``...path_suffix`` ends."""
    ended = asyncio.Event()

    async def on_end(session: Any, context: Any, params: aiohttp.TraceRequestEndParams) -> None:
        if params.url.path.endswith(path_suffix):
            ended.set()

    config = aiohttp.TraceConfig()
    config.on_request_end.append(on_end)
    return config, ended


async def scrape(daemon: Daemon) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{daemon.url}/metrics") as r:
        return await r.text()


async def rpc_requests(daemon: Daemon, rpc: str) -> float:
    """RPC requests the daemon answered for ``rpc`` (any outcome)."""
    return metric(await scrape(daemon), "sharecoord_rpc_requests_total", rpc=rpc)


async def refused_requests(daemon: Daemon, rpc: str) -> float:
    """Requests for ``rpc`` the daemon refused whole (HTTP 400, code 42)."""
    text = await scrape(daemon)
    return metric(text, "sharecoord_rpc_requests_total", rpc=rpc, outcome="42")


async def entry_results(daemon: Daemon, rpc: str, code: int) -> float:
    """Partition entries of ``rpc`` the daemon answered with ``code``."""
    text = await scrape(daemon)
    return metric(text, "sharecoord_partition_results_total", rpc=rpc, error_code=str(code))


# --- certificates, made with the openssl CLI (as tests/server/test_security.py) --------

_REQ_CONFIG = """
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_ca: str


def _openssl(directory: Path, command: str) -> None:
    subprocess.run(["openssl", *command.split()], cwd=directory, check=True, capture_output=True)


def _key_and_request(directory: Path, name: str, extra: str) -> None:
    (directory / f"{name}.cnf").write_text(_REQ_CONFIG.format(cn=name))
    _openssl(
        directory,
        f"req -new -config {name}.cnf -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        f"-nodes -keyout {name}.key {extra}",
    )


def _ca(directory: Path, name: str) -> None:
    _key_and_request(directory, name, f"-x509 -extensions ca -days 2 -out {name}.pem")


def _leaf(directory: Path, name: str, kind: str, serial: int) -> None:
    _key_and_request(directory, name, f"-out {name}.csr")
    _openssl(
        directory,
        f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -set_serial {serial} -days 2 "
        f"-extfile {name}.cnf -extensions {kind} -out {name}.pem",
    )


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests make their certificates with the openssl CLI; install it")
    d = tmp_path_factory.mktemp("client-pki")
    _ca(d, "ca")
    _leaf(d, "server", "server", 2)
    _leaf(d, "client", "client", 3)
    _ca(d, "rogue")
    return Pki(
        ca=str(d / "ca.pem"),
        server_cert=str(d / "server.pem"),
        server_key=str(d / "server.key"),
        client_cert=str(d / "client.pem"),
        client_key=str(d / "client.key"),
        rogue_ca=str(d / "rogue.pem"),
    )
