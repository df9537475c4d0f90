"""The client's bearer token and TLS against real daemons (docs/api.md#security)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest

from client import (
    ClusterAuthorizationFailed,
    CoordinatorNotAvailable,
    DeadlineExceeded,
    ReadSummaryPartition,
    ShareCoordinatorClient,
    make_ssl_context,
)
from tests.client.conftest import TOPIC
from tests.harness import Daemon, DaemonConfig
from tests.pki import Pki

TOKEN = "s3cr3t-token"


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    directory = tmp_path_factory.mktemp("token")
    daemon = Daemon(DaemonConfig(directory / "data", partitions=None, token=TOKEN)).start()
    yield daemon
    daemon.stop()


@dataclass(frozen=True)
class Contexts:
    trusting: ssl.SSLContext
    with_certificate: ssl.SSLContext
    trusting_another_ca: ssl.SSLContext


@pytest.fixture(scope="module")
def contexts(pki: Pki) -> Contexts:
    """Built outside the event loop: they read files."""
    return Contexts(
        trusting=make_ssl_context(pki.ca),
        with_certificate=make_ssl_context(pki.ca, pki.client_cert, pki.client_key),
        trusting_another_ca=make_ssl_context(pki.rogue_ca),
    )


@pytest.fixture(scope="module")
def tls_daemons(
    pki: Pki, contexts: Contexts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Daemon]]:
    """Two daemons: TLS, and mutual TLS (it asks for a client certificate)."""
    directory = tmp_path_factory.mktemp("tls")
    daemons = [
        Daemon(
            DaemonConfig(
                directory / "tls",
                pki.tls_flags(),
                partitions=None,
                probe_ssl=contexts.trusting,
            )
        ),
        Daemon(
            DaemonConfig(
                directory / "mtls",
                pki.mtls_flags(),
                partitions=None,
                probe_ssl=contexts.with_certificate,
            )
        ),
    ]
    for daemon in daemons:
        daemon.start()
    yield daemons
    for daemon in daemons:
        daemon.stop()


async def test_without_the_token_every_call_fails_with_31_at_once(token_daemon, clients, group):
    client = clients(token_daemon.url)
    with pytest.raises(ClusterAuthorizationFailed) as info:
        await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=0)
    assert info.value.errno == 31
    [result] = await client.read_summary_many(group, [(TOPIC, ReadSummaryPartition(0))])
    assert result.error_code == 31
    with pytest.raises(ClusterAuthorizationFailed):
        await client.register_topic(TOPIC, 1)
    assert client.stats.retries == 0


async def test_a_wrong_token_is_refused_too(token_daemon, clients, group):
    client = clients(token_daemon.url, token="s3cr3t-tokem")
    with pytest.raises(ClusterAuthorizationFailed):
        await client.read_summary(group, TOPIC, 0)


async def test_with_the_token_every_call_works(token_daemon, clients, group):
    client = clients(token_daemon.url, token=TOKEN)
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=8)
    assert (await client.read(group, TOPIC, 0, leader_epoch=0)).start_offset == 8
    state = await client.admin_state(group, TOPIC, 0)
    assert state is not None and state.start_offset == 8
    [coordinator] = await client.find_coordinator([f"{group}:{TOPIC}:0"])
    assert coordinator.error_code == 0


def test_a_token_a_header_cannot_carry_is_refused_at_once():
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        ShareCoordinatorClient("http://127.0.0.1:1", token="two words")
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        ShareCoordinatorClient("http://127.0.0.1:1", token="")


async def test_tls_with_the_ca_works_and_routes_over_https(tls_daemons, contexts, clients, group):
    daemon = tls_daemons[0]
    assert daemon.url.startswith("https://")
    # host:port takes https when a TLS context is given.
    client = clients(f"127.0.0.1:{daemon.port}", ssl=contexts.trusting)
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=21)
    assert (await client.read_summary(group, TOPIC, 0)).start_offset == 21


async def test_tls_refuses_a_daemon_its_ca_did_not_sign_without_retrying(
    tls_daemons, contexts, clients, group
):
    daemon = tls_daemons[0]
    client = clients(daemon.url, ssl=contexts.trusting_another_ca)
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await client.read_summary(group, TOPIC, 0)
    assert client.stats.coordinator_lookups == 1


async def test_mutual_tls_works_with_a_client_certificate(tls_daemons, contexts, clients, group):
    daemon = tls_daemons[1]
    client = clients(daemon.url, ssl=contexts.with_certificate)
    await client.initialize(group, TOPIC, 0, state_epoch=0, start_offset=34)
    assert (await client.read(group, TOPIC, 0, leader_epoch=0)).start_offset == 34


async def test_mutual_tls_without_a_client_certificate_never_gets_through(
    tls_daemons, contexts, clients, group
):
    daemon = tls_daemons[1]
    client = clients(daemon.url, ssl=contexts.trusting, deadline_s=0.5)
    with pytest.raises(DeadlineExceeded) as info:
        await client.read_summary(group, TOPIC, 0)
    # TLS 1.3 refuses the client after its side of the handshake: it looks like a
    # disconnect, which is retriable, so the call runs into its deadline.
    assert isinstance(info.value.last_error, CoordinatorNotAvailable)
