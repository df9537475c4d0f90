"""Bearer tokens and TLS, with real handshakes on loopback (docs/api.md#security)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from blockbuster import blockbuster_ctx

from server.security import (
    SecurityError,
    check_bearer,
    client_ssl_context,
    load_token,
    server_ssl_context,
)
from tests.pki import Pki

# --- a tiny HTTPS server on loopback (aiohttp, as the daemon) ----------------------------


async def _hello(request: web.Request) -> web.Response:
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    return web.Response(text=f"hello {_common_name(peer)}")


def _common_name(peer: dict | None) -> str:
    subject = dict(item for rdn in peer["subject"] for item in rdn) if peer else {}
    return subject.get("commonName", "anonymous")


@pytest.fixture
async def tls_app() -> AsyncIterator[Callable[[ssl.SSLContext], Awaitable[str]]]:
    """Start an HTTPS app answering ``hello <client certificate CN>``; gives its URL."""
    runners: list[web.AppRunner] = []

    async def start(context: ssl.SSLContext) -> str:
        app = web.Application()
        app.router.add_get("/", _hello)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        return f"https://127.0.0.1:{runner.addresses[0][1]}/"

    yield start
    for runner in runners:
        await runner.cleanup()


async def get(url: str, context: ssl.SSLContext) -> str:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        return await response.text()


# --- one raw handshake, to see the server's own verdict ------------------------------------
# asyncio drops a failed server handshake without a word to the client, so the reason a
# client was refused is taken from a blocking server socket on the other side.


def _accept_one(listener: socket.socket, context: ssl.SSLContext) -> str | ssl.SSLError:
    conn, _ = listener.accept()
    conn.settimeout(SOCKET_TIMEOUT_S)
    with conn:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                name = _common_name(tls.getpeercert())
                tls.sendall(b"hello")
                return name
        except ssl.SSLError as exc:
            return exc


def _connect(port: int, context: ssl.SSLContext) -> bytes:
    raw = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S)
    with raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.recv(5)


async def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext
) -> tuple[str | ssl.SSLError, bytes | BaseException]:
    """One TLS connection on loopback: (server's outcome, client's outcome)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(SOCKET_TIMEOUT_S)
        port = listener.getsockname()[1]
        accepted, connected = await asyncio.gather(
            asyncio.to_thread(_accept_one, listener, server),
            asyncio.to_thread(_connect, port, client),
            return_exceptions=True,
        )
    assert isinstance(accepted, (str, ssl.SSLError)), accepted
    return accepted, connected


# A safety net against a hung test, not a timing assertion.
SOCKET_TIMEOUT_S = 30


# --- TLS ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contexts:
    tls_server: ssl.SSLContext
    mtls_server: ssl.SSLContext
    client: ssl.SSLContext
    client_with_cert: ssl.SSLContext
    client_with_rogue_cert: ssl.SSLContext
    client_trusting_rogue_ca: ssl.SSLContext


@pytest.fixture(scope="session")
def contexts(pki: Pki) -> Contexts:
    """Built outside the event loop: loading them reads files (the daemon does it at start)."""
    return Contexts(
        tls_server=server_ssl_context(pki.server_cert, pki.server_key),
        mtls_server=server_ssl_context(pki.server_cert, pki.server_key, pki.ca),
        client=client_ssl_context(pki.ca),
        client_with_cert=client_ssl_context(pki.ca, pki.client_cert, pki.client_key),
        client_with_rogue_cert=client_ssl_context(
            pki.ca, pki.rogue_client_cert, pki.rogue_client_key
        ),
        client_trusting_rogue_ca=client_ssl_context(pki.rogue_ca),
    )


@pytest.fixture
def no_blocking_calls() -> Iterator[None]:
    """The handshakes below run on the event loop; nothing there may block it."""
    with blockbuster_ctx():
        yield


async def test_tls_works_and_the_client_verifies_the_server(contexts, tls_app, no_blocking_calls):
    url = await tls_app(contexts.tls_server)
    assert await get(url, contexts.client) == "hello anonymous"


async def test_client_refuses_a_server_its_ca_did_not_sign(contexts, no_blocking_calls):
    _, connected = await handshake(contexts.tls_server, contexts.client_trusting_rogue_ca)
    assert isinstance(connected, ssl.SSLCertVerificationError)


async def test_mtls_refuses_a_client_without_a_certificate(contexts, tls_app, no_blocking_calls):
    accepted, connected = await handshake(contexts.mtls_server, contexts.client)
    assert isinstance(accepted, ssl.SSLError)
    assert accepted.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert connected != b"hello"
    # and through aiohttp, as the daemon serves it: the request never reaches a handler
    url = await tls_app(contexts.mtls_server)
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(url, contexts.client)


async def test_mtls_refuses_a_client_certificate_of_another_ca(contexts, no_blocking_calls):
    accepted, connected = await handshake(contexts.mtls_server, contexts.client_with_rogue_cert)
    assert isinstance(accepted, ssl.SSLError)
    assert accepted.reason == "CERTIFICATE_VERIFY_FAILED"
    assert connected != b"hello"


async def test_mtls_accepts_a_client_certificate_signed_by_the_ca(
    contexts, tls_app, no_blocking_calls
):
    assert await handshake(contexts.mtls_server, contexts.client_with_cert) == ("client", b"hello")
    url = await tls_app(contexts.mtls_server)
    assert await get(url, contexts.client_with_cert) == "hello client"


def test_tls_contexts_refuse_versions_below_1_2(pki):
    server = server_ssl_context(pki.server_cert, pki.server_key, pki.ca)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert client_ssl_context(pki.ca).minimum_version == ssl.TLSVersion.TLSv1_2


def test_without_client_ca_the_server_asks_no_certificate(pki):
    assert server_ssl_context(pki.server_cert, pki.server_key).verify_mode == ssl.CERT_NONE


def test_mismatched_certificate_and_key_are_refused(pki):
    with pytest.raises(SecurityError, match="do not match"):
        server_ssl_context(pki.server_cert, pki.client_key)


def test_encrypted_key_is_refused_without_prompting(pki):
    with pytest.raises(SecurityError, match="is encrypted"):
        server_ssl_context(pki.server_cert, pki.encrypted_key)


def test_unreadable_tls_files_are_refused_naming_them(pki, tmp_path):
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(SecurityError, match=r"TLS certificate .*missing\.pem: cannot read it"):
        server_ssl_context(missing, pki.server_key)
    with pytest.raises(SecurityError, match=r"TLS key .*missing\.pem: cannot read it"):
        server_ssl_context(pki.server_cert, missing)
    with pytest.raises(SecurityError, match=r"TLS client CA .*missing\.pem: cannot read it"):
        server_ssl_context(pki.server_cert, pki.server_key, missing)
    with pytest.raises(SecurityError, match=r"TLS CA .*missing\.pem: cannot read it"):
        client_ssl_context(missing)


def test_files_that_are_not_pem_are_refused_naming_them(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(SecurityError, match=r"garbage\.pem.*not a PEM certificate and key"):
        server_ssl_context(str(garbage), pki.server_key)
    with pytest.raises(SecurityError, match=r"garbage\.pem: not a PEM certificate bundle"):
        server_ssl_context(pki.server_cert, pki.server_key, str(garbage))


def test_client_key_without_certificate_is_refused(pki):
    with pytest.raises(SecurityError, match="without a certificate"):
        client_ssl_context(pki.ca, key=pki.client_key)


# --- the bearer token -----------------------------------------------------------------------


def token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_load_token_strips_surrounding_whitespace_and_newline(tmp_path):
    assert load_token(token_file(tmp_path, b"  s3cr3t-token\n")) == b"s3cr3t-token"


@pytest.mark.parametrize("content", [b"", b"\n", b"  \t\r\n"])
def test_load_token_refuses_an_empty_file(tmp_path, content):
    with pytest.raises(SecurityError, match=r"token.*it is empty"):
        load_token(token_file(tmp_path, content))


@pytest.mark.parametrize("content", [b"two words", b"caf\xc3\xa9", b"tab\there"])
def test_load_token_refuses_a_token_a_header_cannot_carry(tmp_path, content):
    with pytest.raises(SecurityError, match="printable ASCII without spaces"):
        load_token(token_file(tmp_path, content))


def test_load_token_refuses_a_missing_file_naming_it(tmp_path):
    with pytest.raises(SecurityError, match=r"auth token file .*nope: cannot read it"):
        load_token(str(tmp_path / "nope"))


def test_load_token_warns_when_others_may_read_the_file(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="sharecoord.security"):
        load_token(token_file(tmp_path, b"t", mode=0o644))
    assert "readable by group or others" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sharecoord.security"):
        load_token(token_file(tmp_path, b"t", mode=0o600))
    assert caplog.text == ""


TOKEN = b"s3cr3t-token"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer s3cr3t-token",
        "bearer s3cr3t-token",
        "BEARER s3cr3t-token",
        "Bearer   s3cr3t-token  ",
        "Bearer\ts3cr3t-token",
    ],
)
def test_check_bearer_accepts_exactly_the_token_with_any_case_scheme(header):
    assert check_bearer(header, TOKEN) is True


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "s3cr3t-token",
        "Basic s3cr3t-token",
        "Bearers3cr3t-token",
        "Bearer s3cr3t-toke",
        "Bearer s3cr3t-token2",
        "Bearer S3CR3T-TOKEN",
        "Bearer s3cr3t-token extra",
        "Token s3cr3t-token",
        "Bearer s3cr3t-tok\u00e9n",
        "Bearer s3cr3t-token\udcff",
        # Only spaces and tabs part the scheme from the token (RFC 9110), not what
        # str.split() also calls whitespace.
        "Bearer\x85s3cr3t-token",
        "Bearer\u00a0s3cr3t-token",
        "Bearer\u2003s3cr3t-token",
        "Bearer s3cr3t-token\x85",
        "\x1cBearer s3cr3t-token",
    ],
)
def test_check_bearer_refuses_anything_else(header):
    assert check_bearer(header, TOKEN) is False


def test_check_bearer_compares_fixed_length_digests_so_length_does_not_show(monkeypatch):
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert check_bearer("Bearer x", TOKEN) is False
    assert check_bearer("Bearer " + "y" * 1000, TOKEN) is False
    assert check_bearer("Bearer s3cr3t-token", TOKEN) is True
    assert compared == [(32, 32)] * 3
