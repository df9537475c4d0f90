"""Security of the Kafka listener (docs/api.md#the-kafka-listener): SASL/PLAIN with the
bearer token as password, SCRAM-SHA-256/512 from a credentials file written by
``sharecoord scram add``, TLS and mutual TLS with the HTTP listener's certificates.

The SCRAM client here is written from RFC 5802 with hashlib and hmac, independently of
protocol/sasl.py; the messages are kio's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
import ssl
import subprocess
import sys

import pytest

from tests.harness import REPO_ROOT, TOPIC, body, child_env, part
from tests.kafka_client import KafkaClient, kafka_address, message_class

TOKEN = "kafka-listener-token"
HANDSHAKE = message_class("sasl_handshake", 1, "request")


def authenticate(version: int, token: bytes):
    return message_class("sasl_authenticate", version, "request")(auth_bytes=token)


async def summary(client: KafkaClient) -> dict:
    return await client.rpc("read-summary", body("sec", (TOPIC, [part(0)])))


@pytest.fixture
async def plain(spawn, tmp_path):
    daemon = await spawn(tmp_path / "data", kafka_listener="127.0.0.1:0", token=TOKEN)
    return kafka_address(daemon.stdout_lines)


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_plain_with_the_token_authenticates(plain, version):
    client = await KafkaClient.connect(*plain)
    try:
        # ApiVersions is allowed before authentication.
        assert (await client.send(message_class("api_versions", 3, "request")(
            client_software_name="t", client_software_version="1"
        ))).api_keys  # fmt: skip
        handshake = await client.send(HANDSHAKE(mechanism="PLAIN"))
        assert int(handshake.error_code) == 0 and "PLAIN" in handshake.mechanisms
        done = await client.send(authenticate(version, b"\x00any-user\x00" + TOKEN.encode()))
        assert int(done.error_code) == 0
        assert (await summary(client))["results"][0]["partitions"][0]["error_code"] == 0
    finally:
        await client.close()


@pytest.mark.parametrize(
    "token", [b"\x00user\x00wrong", b"\x00\x00" + TOKEN.encode(), b"user" + TOKEN.encode()]
)
async def test_plain_with_anything_else_is_refused_and_closed(plain, token):
    client = await KafkaClient.connect(*plain)
    await client.send(HANDSHAKE(mechanism="PLAIN"))
    answer = await client.send(authenticate(1, token))
    assert int(answer.error_code) == 58
    assert await client.closed_by_peer()
    await client.close()


async def test_requests_before_authentication_close_the_connection(plain):
    client = await KafkaClient.connect(*plain)
    data, _ = client.frame(
        message_class("read_share_group_state_summary", 0, "request")(group_id="g", topics=())
    )
    client.writer.write(data)
    assert await client.closed_by_peer()
    await client.close()


async def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(plain):
    client = await KafkaClient.connect(*plain)
    answer = await client.send(HANDSHAKE(mechanism="GSSAPI"))
    assert (int(answer.error_code), list(answer.mechanisms)) == (33, ["PLAIN"])
    assert await client.closed_by_peer()
    await client.close()


# --- SCRAM --------------------------------------------------------------------------------


def scram_add(path, user: str, mechanism: str, password: str, iterations: int | None = 4096):
    """`sharecoord scram add`; ``iterations`` None leaves it its default."""
    flags = [] if iterations is None else ["--iterations", str(iterations)]
    done = subprocess.run(
        [sys.executable, "-m", "server.commands.cli", "scram", "add", "--file", str(path),
         "--user", user, "--mechanism", mechanism, *flags],
        input=password + "\n", capture_output=True, text=True, env=child_env(), cwd=REPO_ROOT,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture
async def scram(spawn, tmp_path):
    credentials = tmp_path / "scram.json"
    await asyncio.to_thread(scram_add, credentials, "alice", "SCRAM-SHA-256", "wonderland")
    await asyncio.to_thread(scram_add, credentials, "bob,=", "SCRAM-SHA-512", "builder")
    assert b"wonderland" not in await asyncio.to_thread(credentials.read_bytes)
    daemon = await spawn(
        tmp_path / "data",
        "--kafka-listener", "127.0.0.1:0", "--scram-credentials-file", str(credentials),
    )  # fmt: skip
    return kafka_address(daemon.stdout_lines)


async def scram_login(client: KafkaClient, mechanism: str, user: str, password: str) -> bool:
    """RFC 5802 from the client's side; whether the server accepted (and proved itself)."""
    name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    handshake = await client.send(HANDSHAKE(mechanism=mechanism))
    assert int(handshake.error_code) == 0
    nonce = secrets.token_urlsafe(18)
    saslname = user.replace("=", "=3D").replace(",", "=2C")
    first_bare = f"n={saslname},r={nonce}"
    answer = await client.send(authenticate(2, ("n,," + first_bare).encode()))
    if int(answer.error_code):
        return False
    server_first = answer.auth_bytes.decode()
    attrs = dict(item.split("=", 1) for item in server_first.split(","))
    assert attrs["r"].startswith(nonce) and int(attrs["i"]) >= 4096
    salted = hashlib.pbkdf2_hmac(name, password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))  # fmt: skip
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}"
    answer = await client.send(authenticate(2, final.encode()))
    if int(answer.error_code):
        assert int(answer.error_code) == 58
        return False
    server_key = hmac.new(salted, b"Server Key", name).digest()
    expected = base64.b64encode(hmac.new(server_key, auth_message, name).digest()).decode()
    assert answer.auth_bytes.decode() == f"v={expected}"
    return True


@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [("SCRAM-SHA-256", "alice", "wonderland"), ("SCRAM-SHA-512", "bob,=", "builder")],
)
async def test_scram_with_the_right_password_authenticates(scram, mechanism, user, password):
    client = await KafkaClient.connect(*scram)
    try:
        assert await scram_login(client, mechanism, user, password)
        assert (await summary(client))["results"][0]["partitions"][0]["error_code"] == 0
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("mechanism", "user", "password"),
    [
        ("SCRAM-SHA-256", "alice", "wrong"),
        ("SCRAM-SHA-512", "alice", "wonderland"),  # alice has no SHA-512 credential
        ("SCRAM-SHA-256", "nobody", "wonderland"),
    ],
)
async def test_scram_with_wrong_credentials_is_refused_and_closed(scram, mechanism, user, password):
    client = await KafkaClient.connect(*scram)
    assert not await scram_login(client, mechanism, user, password)
    assert await client.closed_by_peer()
    await client.close()


async def server_first(address, mechanism: str, user: str) -> dict[str, str]:
    """The server-first message's attributes for ``user`` (a fresh connection, left
    before the proof), with the client's nonce under ``cnonce``."""
    client = await KafkaClient.connect(*address)
    try:
        assert int((await client.send(HANDSHAKE(mechanism=mechanism))).error_code) == 0
        nonce = secrets.token_urlsafe(18)
        answer = await client.send(authenticate(2, f"n,,n={user},r={nonce}".encode()))
        assert int(answer.error_code) == 0
    finally:
        await client.close()
    attributes = dict(item.split("=", 1) for item in answer.auth_bytes.decode().split(","))
    assert list(attributes) == ["r", "s", "i"]
    return {**attributes, "cnonce": nonce}


def shape(first: dict[str, str]) -> tuple[int, int, int, bool]:
    """What tells one server-first message from another apart from its random nonce:
    the salt's length, the iteration count, the server nonce's length and alphabet."""
    server_nonce = first["r"].removeprefix(first["cnonce"])
    assert first["r"].startswith(first["cnonce"])
    urlsafe = all(c.isalnum() or c in "-_" for c in server_nonce)
    return len(base64.b64decode(first["s"])), int(first["i"]), len(server_nonce), urlsafe


async def test_an_unknown_user_gets_the_answer_a_real_user_gets(spawn, tmp_path):
    """One SCRAM round trip must not tell which user names exist: an unknown name gets a
    salt as long as a real user's, the same iteration count (what `scram add` writes by
    default), a nonce alike; its salt is the same every time and after a restart, and
    differs between mechanisms."""
    credentials = tmp_path / "scram.json"
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        await asyncio.to_thread(scram_add, credentials, "alice", mechanism, "pw", None)
    salts: dict[tuple[str, str], set[str]] = {}
    for start in range(2):
        daemon = await spawn(
            tmp_path / "data", "--kafka-listener", "127.0.0.1:0",
            "--scram-credentials-file", str(credentials),
        )  # fmt: skip
        address = kafka_address(daemon.stdout_lines)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            known = await server_first(address, mechanism, "alice")
            assert int(known["i"]) == 8192  # `scram add`'s default
            for user in ("mallory", "mallory", "alicf"):
                unknown = await server_first(address, mechanism, user)
                assert shape(unknown) == shape(known), (mechanism, user)
                salts.setdefault((mechanism, user), set()).add(unknown["s"])
        if start == 0:
            assert await asyncio.to_thread(daemon.terminate) == 0
    # One salt per name and mechanism, over two connections and a restart.
    assert all(len(found) == 1 for found in salts.values()), salts
    by_mechanism = {
        mechanism: salts[mechanism, "mallory"] for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
    }
    assert by_mechanism["SCRAM-SHA-256"] != by_mechanism["SCRAM-SHA-512"]
    assert salts["SCRAM-SHA-256", "mallory"] != salts["SCRAM-SHA-256", "alicf"]


# --- TLS ------------------------------------------------------------------------------------


async def refused_summary(host: str, port: int, context: ssl.SSLContext) -> None:
    refused = await KafkaClient.connect(host, port, ssl_context=context)
    try:
        await summary(refused)
    finally:
        await refused.close()


async def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_ca(spawn, tmp_path, pki):
    daemon = await spawn(
        tmp_path / "data", "--kafka-listener", "127.0.0.1:0", *pki.mtls_flags(), ready=False
    )
    host, port = kafka_address(daemon.stdout_lines)
    good = ssl.create_default_context(cafile=pki.ca)
    good.load_cert_chain(pki.client_cert, pki.client_key)
    client = await KafkaClient.connect(host, port, ssl_context=good)
    try:
        assert (await summary(client))["results"]
    finally:
        await client.close()
    for cert in (None, (pki.rogue_client_cert, pki.rogue_client_key)):
        context = ssl.create_default_context(cafile=pki.ca)
        if cert is not None:
            context.load_cert_chain(*cert)
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await refused_summary(host, port, context)
    assert "Traceback" not in await asyncio.to_thread(daemon.stderr_text)
