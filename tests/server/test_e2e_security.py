"""Security end to end (docs/api.md#security): the bearer token on every /v1/ route, and
TLS / mutual TLS with real handshakes against a real daemon process."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from server.security import client_ssl_context
from tests.harness import (
    MEDIA,
    TOPIC,
    Api,
    body,
    encode,
    init_entry,
    read_entry,
    run_cli,
)

TOKEN = "s3cr3t-e2e-token"
MSG_UNAUTHORIZED = "Cluster authorization failed."

V1_ROUTES = [
    ("POST", "/v1/share-group-state/initialize"),
    ("POST", "/v1/share-group-state/read"),
    ("POST", "/v1/share-group-state/write"),
    ("POST", "/v1/share-group-state/delete"),
    ("POST", "/v1/share-group-state/read-summary"),
    ("POST", "/v1/find-coordinator"),
    ("GET", f"/v1/admin/state?group_id=g&topic_id={TOPIC}&partition=0"),
    ("PUT", "/v1/admin/topics"),
    ("DELETE", f"/v1/admin/topics/{TOPIC}"),
    ("POST", "/v1/admin/compaction/commit"),
    ("GET", "/v1/admin/partitions"),
    ("GET", "/v1/no-such-route"),
]


# --- the bearer token -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN],
)
async def test_every_v1_route_needs_the_token(serve, fmt, authorization):
    served = await serve(token=TOKEN)
    api = Api(served.session, served.url, fmt)  # no token of its own
    headers = {"Content-Type": MEDIA[fmt]}
    if authorization is not None:
        headers["Authorization"] = authorization
    for method, path in V1_ROUTES:
        data = encode(body("g", (TOPIC, [init_entry(0)])), fmt)
        reply = await api.request(method, path, data=data, headers=headers)
        assert reply.status == 401, (method, path, reply.body)
        assert reply.body == {"error_code": 31, "error_message": MSG_UNAUTHORIZED}
        assert reply.format == fmt
    # Nothing was applied.
    assert await served.api(fmt).state("g", TOPIC, 0) is None


async def test_the_right_token_is_served_on_every_route(serve, fmt):
    served = await serve(token=TOKEN)
    api = served.api(fmt)
    assert await api.codes("initialize", body("g", (TOPIC, [init_entry(0)]))) == [0]
    assert await api.codes("read", body("g", (TOPIC, [read_entry(0)]))) == [0]
    assert await api.state("g", TOPIC, 0) is not None
    reply = await api.request("GET", "/v1/admin/partitions")
    assert reply.status == 200
    # The scheme is case-insensitive.
    lower = Api(served.session, served.url, fmt)
    reply = await lower.request(
        "GET", "/v1/admin/partitions", headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert reply.status == 200


async def test_health_readiness_and_metrics_stay_open(serve):
    served = await serve(token=TOKEN)
    api = Api(served.session, served.url)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await api.request("GET", path)).status == 200, path


# --- TLS and mutual TLS, against the daemon process ---------------------------------------------


@dataclass(frozen=True)
class Clients:
    trusting: ssl.SSLContext
    with_cert: ssl.SSLContext
    with_rogue_cert: ssl.SSLContext
    trusting_nobody: ssl.SSLContext


@pytest.fixture(scope="module")
def clients(pki) -> Clients:
    """Client contexts, built outside any event loop (they read files)."""
    return Clients(
        trusting=client_ssl_context(pki.ca),
        with_cert=client_ssl_context(pki.ca, pki.client_cert, pki.client_key),
        with_rogue_cert=client_ssl_context(pki.ca, pki.rogue_client_cert, pki.rogue_client_key),
        trusting_nobody=client_ssl_context(pki.rogue_ca),
    )


async def _served(api: Api) -> list[int]:
    return await api.codes("read-summary", body("g", (TOPIC, [read_entry(0)])))


async def test_tls_serves_a_client_that_trusts_the_ca(spawn, tmp_path, pki, clients, session):
    daemon = await spawn(
        tmp_path / "data",
        *pki.tls_flags(),
        probe_ssl=clients.trusting,
    )
    assert daemon.scheme == "https"
    api = Api(session, daemon.url, "msgpack", ssl_context=clients.trusting)
    assert await _served(api) == [0]
    # The server is verified: a client trusting another CA refuses it.
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _served(Api(session, daemon.url, ssl_context=clients.trusting_nobody))
    # Plain HTTP on the TLS port is no request at all.
    with pytest.raises(aiohttp.ClientError):
        await _served(Api(session, daemon.url.replace("https:", "http:")))


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    spawn, tmp_path, pki, clients, session
):
    daemon = await spawn(
        tmp_path / "data",
        *pki.mtls_flags(),
        probe_ssl=clients.with_cert,
    )
    with pytest.raises(aiohttp.ClientConnectionError):
        await _served(Api(session, daemon.url, ssl_context=clients.trusting))
    with pytest.raises(aiohttp.ClientConnectionError):
        await _served(Api(session, daemon.url, ssl_context=clients.with_rogue_cert))
    # A certificate signed by the client CA is served, in both formats.
    for fmt in ("json", "msgpack"):
        assert await _served(Api(session, daemon.url, fmt, ssl_context=clients.with_cert)) == [0]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


async def test_mutual_tls_and_token_together(spawn, tmp_path, pki, clients, session, token_file):
    daemon = await spawn(
        tmp_path / "data",
        *pki.mtls_flags(),
        "--auth-token-file",
        str(token_file),
        probe_ssl=clients.with_cert,
    )
    api = Api(session, daemon.url, ssl_context=clients.with_cert)
    reply = await api.rpc_reply("read-summary", body("g", (TOPIC, [read_entry(0)])))
    assert (reply.status, reply.body["error_code"]) == (401, 31)
    api.token = TOKEN
    assert await api.codes("initialize", body("g", (TOPIC, [init_entry(0, 2, 9)]))) == [0]
    # sharecoord state get speaks the same: mTLS and the token.
    result = await _state_get(daemon.url, pki, token_file)
    assert result.returncode == 0, result.stderr
    assert '"start_offset": 9' in result.stdout
    assert '"state_epoch": 2' in result.stdout


async def _state_get(url: str, pki, token_file: Path):
    return await asyncio.to_thread(
        run_cli,
        "state",
        "get",
        "--url",
        url,
        "--group",
        "g",
        "--topic",
        TOPIC,
        "--partition",
        "0",
        "--token-file",
        str(token_file),
        "--cacert",
        pki.ca,
        "--cert",
        pki.client_cert,
        "--key",
        pki.client_key,
    )
