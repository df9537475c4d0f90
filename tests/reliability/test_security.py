"""Issue #7, item 6: only authorized callers get in — against the daemon process.

tests/server/test_e2e_security.py proves the token on a fixed list of routes of the app
served in process, and mutual TLS on one RPC. Here, against ``sharecoord serve
--auth-token-file``: every route ``create_app`` registers under /v1/ (taken from its
router, so a route added later is covered without editing this file) refuses a missing
token, a wrong one, and the right one in another scheme, with 401 / 31 in the request's
format, before reading any body, and applies nothing; the open endpoints stay open; no
spelling of a path reaches a /v1/ handler without the token; a fuzzer of Authorization
values finds no other way in. Under mutual TLS a client without a certificate (or with
one of another CA) is refused at the handshake on every endpoint, the open ones too,
and the daemon keeps serving proper clients after many refusals.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.config import load_serve_config
from server.http.app import create_app
from server.node import Node
from server.security import client_ssl_context
from tests.harness import MEDIA, TOPIC, Api, Daemon, DaemonConfig, body, encode, init_entry
from tests.reliability.raw_http import exchange, request_bytes

TOKEN = "reliability-s3cret-token"
OPEN = {"/healthz", "/readyz", "/metrics"}
MSG_UNAUTHORIZED = "Cluster authorization failed."
WRONG = [
    None,
    "",
    "Bearer",
    "Bearer ",
    "Bearer wrong",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    f"Bearer {TOKEN.upper()}",
    f"Basic {TOKEN}",
    f"Token {TOKEN}",
    f"Bearer: {TOKEN}",
    f"BearerX {TOKEN}",
    TOKEN,
    f"{TOKEN} Bearer",
    f"Bearer {TOKEN} {TOKEN}",
]


def v1_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """Every (method, concrete path) of create_app's router under /v1/."""
    flags = argparse.Namespace(data_dir=str(tmp_path / "routes"), partitions="4")
    config = load_serve_config(flags, {})
    app = create_app(Node(config, config.cluster_map))
    out = []
    for route in app.router.routes():
        path = route.resource.canonical.replace("{topic_id}", TOPIC)
        if path.startswith("/v1/"):
            if path == "/v1/admin/state":
                path += f"?group_id=sec&topic_id={TOPIC}&partition=0"
            out.append((route.method, path))
    assert len(out) >= 11, out
    return out


@pytest.fixture
async def guarded(spawn, tmp_path) -> Daemon:
    return await spawn(tmp_path / "data", token=TOKEN)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_every_v1_route_refuses_a_missing_or_wrong_token(guarded, tmp_path, session, fmt):
    routes = await asyncio.to_thread(v1_routes, tmp_path)
    api = Api(session, guarded.url, fmt)
    write = encode(body("sec", (TOPIC, [init_entry(0, 1, 7)])), fmt)
    for authorization in WRONG:
        headers = {"Content-Type": MEDIA[fmt], "Accept": MEDIA[fmt]}
        if authorization is not None:
            headers["Authorization"] = authorization
        for method, path in routes:
            where = (authorization, method, path)
            if method == "HEAD":
                status = await head(guarded, path, headers)
                assert status == 401, where
                continue
            reply = await api.request(method, path, data=write, headers=headers)
            assert reply.status == 401, (where, reply.status, reply.body)
            assert reply.format == fmt, where
            assert reply.body == {"error_code": 31, "error_message": MSG_UNAUTHORIZED}
    # Nothing was applied; the right token opens every route (no 401, no 5xx).
    authorized = Api(session, guarded.url, fmt, token=TOKEN)
    assert await authorized.state("sec", TOPIC, 0) is None
    for method, path in routes:
        if method == "HEAD":
            status = await head(guarded, path, {"Authorization": f"Bearer {TOKEN}"})
            assert status not in (401, 500), (method, path)
            continue
        reply = await authorized.request(
            method, path, data=write, headers={"Content-Type": MEDIA[fmt]}
        )
        assert reply.status not in (401, 500), (method, path, reply.body)
    assert (await authorized.request("GET", "/v1/admin/partitions")).status == 200


async def head(daemon: Daemon, path: str, headers: dict[str, str]) -> int:
    raw = request_bytes("HEAD", path, headers=headers)
    reply = await asyncio.to_thread(exchange, daemon.host, daemon.port, raw, head=True)
    return reply.status


async def test_the_open_endpoints_need_no_token(guarded, session):
    api = Api(session, guarded.url)
    for path in sorted(OPEN):
        assert (await api.request("GET", path)).status == 200, path
        assert await head(guarded, path, {}) == 200, path


async def test_the_token_is_checked_before_any_body_is_read(guarded):
    """A body the daemon would wait for, or refuse as too large, is never looked at."""
    for declared in (10**12, 1000):
        raw = request_bytes(
            "POST",
            "/v1/share-group-state/write",
            b"{",
            {"Content-Type": "application/json"},
            content_length=declared,
        )
        reply = await asyncio.to_thread(exchange, guarded.host, guarded.port, raw)
        assert reply.status == 401, reply
        assert reply.error_body()["error_code"] == 31


PATH_SPELLINGS = [
    "/v1/admin/partitions",
    "/v1//admin/partitions",
    "//v1/admin/partitions",
    "/v1/admin/partitions/",
    "/v1/admin/%70artitions",
    "/%76%31/admin/partitions",
    "/v1%2Fadmin%2Fpartitions",
    "/v1/./admin/partitions",
    "/v1/admin/../admin/partitions",
    "/healthz/../v1/admin/partitions",
    "/./v1/admin/partitions",
    "/V1/admin/partitions",
    "/v1/admin/partitions;x=1",
    "/v1/admin/partitions?x=/healthz",
    "/v1/admin/partitions#/healthz",
    "http://sharecoord/v1/admin/partitions",
    "/healthz?/v1/admin/partitions",
    "/v1/admin/partitions%00",
    "/v1/admin/partitions%20",
]


async def test_no_spelling_of_a_path_reaches_a_v1_handler_without_the_token(guarded):
    """Whatever aiohttp makes of the target, the check and the router agree: a handler
    behind /v1/ never answers 200 without the token."""
    for target in PATH_SPELLINGS:
        raw = request_bytes("GET", target)
        reply = await asyncio.to_thread(exchange, guarded.host, guarded.port, raw)
        assert reply.status != 200 or b"partitions" not in reply.body, (target, reply)
        assert reply.status < 500, (target, reply)


# --- a fuzzer of Authorization values ----------------------------------------------------------

_ALPHABET = st.characters(codec="latin-1", exclude_characters="\r\n\x00")
SCHEMES = st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Token", "Bearer:", ""])
AUTHORIZATIONS = st.one_of(
    st.text(_ALPHABET, max_size=60),
    st.builds(lambda scheme, rest: f"{scheme} {rest}", SCHEMES, st.text(_ALPHABET, max_size=40)),
    st.builds(
        lambda at, extra: f"Bearer {TOKEN[:at]}{extra}{TOKEN[at:]}",
        st.integers(0, len(TOKEN)),
        st.text(_ALPHABET, min_size=1, max_size=3),
    ),
    st.builds(lambda at: f"Bearer {TOKEN[:at]}", st.integers(0, len(TOKEN) - 1)),
)


# What RFC 9110 lets through, on the bytes the daemon receives (request_bytes sends the
# value as latin-1): the scheme in any ASCII case, spaces or tabs, the token, and the
# spaces or tabs HTTP allows around a field value.
_THE_TOKEN = re.compile(
    rb"[ \t]*bearer[ \t]+" + re.escape(TOKEN.encode()) + rb"[ \t]*", re.IGNORECASE
)


def _is_the_token(value: str) -> bool:
    return _THE_TOKEN.fullmatch(value.encode("latin-1", "replace")) is not None


@pytest.fixture(scope="module")
def guarded_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("auth-fuzz")
    daemon = Daemon(DaemonConfig(root / "data", token=TOKEN, log_dir=root)).start()
    yield daemon
    assert daemon.process.poll() is None
    assert daemon.terminate() == 0
    assert "Traceback" not in daemon.stderr_text()


def check_authorization(daemon: Daemon, value: str, figures) -> None:
    raw = request_bytes("GET", "/v1/admin/partitions", headers={"Authorization": value})
    reply = exchange(daemon.host, daemon.port, raw)
    assert reply.status < 500, (value, reply)
    if _is_the_token(value):
        assert reply.status == 200, (value, reply)
    else:
        assert reply.status in (400, 401), (value, reply)  # 400: a header aiohttp refuses
        assert reply.error_body()["error_code"] in (31, 42), (value, reply)
    figures.add("authorization_values_tried")


FUZZ = settings(
    deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@settings(FUZZ, max_examples=300)
@given(value=AUTHORIZATIONS)
def test_no_authorization_value_but_the_token_gets_in(guarded_module, figures, value):
    check_authorization(guarded_module, value, figures)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(FUZZ, max_examples=20000)
@given(value=AUTHORIZATIONS)
def test_no_authorization_value_but_the_token_gets_in_long(guarded_module, figures, value):
    check_authorization(guarded_module, value, figures)


# --- mutual TLS ---------------------------------------------------------------------------------


def handshake(host: str, port: int, context: ssl.SSLContext) -> bool:
    """Whether a TLS connection with ``context`` gets an answer to GET /healthz."""
    try:
        with (
            socket.create_connection((host, port), timeout=30) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(request_bytes("GET", "/healthz"))
            return tls.recv(100).startswith(b"HTTP/1.1 200")
    except (ssl.SSLError, OSError):
        return False


async def refusals_under_mutual_tls(spawn, tmp_path, pki, rounds: int, figures) -> None:
    daemon = await spawn(
        tmp_path / "data",
        *pki.mtls_flags(),
        ready=False,
    )
    good = await asyncio.to_thread(client_ssl_context, pki.ca, pki.client_cert, pki.client_key)
    no_cert = await asyncio.to_thread(client_ssl_context, pki.ca)
    rogue = await asyncio.to_thread(
        client_ssl_context, pki.ca, pki.rogue_client_cert, pki.rogue_client_key
    )
    async with aiohttp.ClientSession() as session:
        await Api(session, daemon.url, ssl_context=good).wait_ready()
        for _ in range(rounds):
            for refused in (no_cert, rogue):
                assert not await asyncio.to_thread(handshake, daemon.host, daemon.port, refused)
            figures.add("tls_handshakes_refused", 2)
        assert await asyncio.to_thread(handshake, daemon.host, daemon.port, good)
        api = Api(session, daemon.url, "msgpack", ssl_context=good)
        assert await api.codes("initialize", body("tls", (TOPIC, [init_entry(0)]))) == [0]
    assert daemon.process.poll() is None
    stderr = await asyncio.to_thread(daemon.stderr_text)
    assert "Traceback" not in stderr, stderr[-3000:]


async def test_mutual_tls_refuses_clients_without_a_proper_certificate(
    spawn, tmp_path, pki, figures
):
    await refusals_under_mutual_tls(spawn, tmp_path, pki, 5, figures)


@pytest.mark.slow
async def test_mutual_tls_refusals_many_times(spawn, tmp_path, pki, figures):
    await refusals_under_mutual_tls(spawn, tmp_path, pki, 1000, figures)
