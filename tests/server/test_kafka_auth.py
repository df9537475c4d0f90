"""The SCRAM credentials file of the Kafka listener (server/kafka/auth.py): salted keys
only, written atomically with mode 0600, refused whole when it is not what it should be."""

from __future__ import annotations

import json
import stat

import pytest

from protocol.sasl import (
    DEFAULT_ITERATIONS,
    SALT_BYTES,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    DecoyShape,
    derive_credential,
)
from server.kafka.auth import (
    HANDSHAKE_FRAME_BYTES,
    CredentialsError,
    KafkaAuth,
    SaslSession,
    add_user,
    decoy_key,
    load_credentials,
    remove_user,
)


def test_add_writes_salted_keys_only_with_mode_0600_and_remove_takes_them_out(tmp_path):
    path = str(tmp_path / "scram.json")
    add_user(path, "alice", SCRAM_SHA_256, b"wonderland", 4096)
    add_user(path, "alice", SCRAM_SHA_512, b"wonderland", 5000)
    add_user(path, "bob", SCRAM_SHA_256, b"builder", 4096)
    raw = (tmp_path / "scram.json").read_bytes()
    assert b"wonderland" not in raw and b"builder" not in raw
    assert stat.S_IMODE((tmp_path / "scram.json").stat().st_mode) == 0o600
    credentials = load_credentials(path)
    alice = credentials["alice"][SCRAM_SHA_256]
    assert alice == derive_credential(SCRAM_SHA_256, b"wonderland", alice.salt, 4096)
    assert credentials["alice"][SCRAM_SHA_512].iterations == 5000
    assert remove_user(path, "alice", SCRAM_SHA_512)
    assert set(load_credentials(path)["alice"]) == {SCRAM_SHA_256}
    assert remove_user(path, "bob", None)
    assert not remove_user(path, "bob", None)
    assert set(load_credentials(path)) == {"alice"}
    assert [p.name for p in tmp_path.iterdir()] == ["scram.json"]  # no temporary left


def _one(salt: str, iterations: int) -> dict:
    keys = {"salt": salt, "iterations": iterations, "stored_key": "AA==", "server_key": "AA=="}
    return {"version": 1, "users": {"u": {SCRAM_SHA_256: keys}}}


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"version": 2, "users": {}},
        {"version": 1, "users": {"u": {"MD5": {}}}},
        _one("AA==", 100),
        _one("!!", 4096),
    ],
)
def test_a_file_that_is_not_credentials_is_refused_naming_it(tmp_path, document):
    path = tmp_path / "scram.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CredentialsError, match="SCRAM credentials file"):
        load_credentials(str(path))


def test_sessions_are_open_without_sasl_and_closed_with_it():
    assert SaslSession(KafkaAuth()).authenticated
    assert not SaslSession(KafkaAuth(token=b"t")).authenticated
    auth = KafkaAuth(token=b"t", scram_enabled=True)
    assert auth.mechanisms == ["PLAIN", SCRAM_SHA_256, SCRAM_SHA_512]
    session = SaslSession(auth)
    assert not session.handshake("GSSAPI")
    assert session.handshake("PLAIN")
    assert session.authenticate(b"\x00me\x00t") == b"" and session.authenticated


def test_decoys_take_the_shape_most_real_users_of_the_mechanism_have(tmp_path):
    path = str(tmp_path / "scram.json")
    assert {(d.salt_bytes, d.iterations) for d in KafkaAuth().decoys.values()} == {
        (SALT_BYTES, DEFAULT_ITERATIONS)  # what `scram add` writes, with no user to copy
    }
    add_user(path, "a", SCRAM_SHA_256, b"pw", 5000)
    add_user(path, "b", SCRAM_SHA_256, b"pw", 5000)
    add_user(path, "c", SCRAM_SHA_256, b"pw", 9000)
    decoys = KafkaAuth(credentials=load_credentials(path), scram_enabled=True).decoys
    assert (decoys[SCRAM_SHA_256].salt_bytes, decoys[SCRAM_SHA_256].iterations) == (32, 5000)
    # No SHA-512 user: the file's users still give the shape.
    assert decoys[SCRAM_SHA_512].iterations == 5000


def test_decoy_salts_are_keyed_by_the_stored_server_keys(tmp_path):
    path = str(tmp_path / "scram.json")
    add_user(path, "alice", SCRAM_SHA_256, b"pw", 4096)
    first = load_credentials(path)
    again = load_credentials(path)
    assert decoy_key(first) == decoy_key(again)  # the same file: the same salts
    add_user(path, "alice", SCRAM_SHA_256, b"pw", 4096)  # a fresh salt: new keys
    assert decoy_key(load_credentials(path)) != decoy_key(first)
    shape = KafkaAuth(credentials=first, scram_enabled=True).decoys[SCRAM_SHA_256]
    assert shape.salt(SCRAM_SHA_256, "x") != shape.salt(SCRAM_SHA_512, "x")
    assert len(shape.salt(SCRAM_SHA_256, "x")) == 32
    assert len(DecoyShape(b"k", salt_bytes=70).salt(SCRAM_SHA_256, "x")) == 70


def test_the_handshake_frame_limit_fits_the_configured_secrets():
    assert KafkaAuth().handshake_frame_limit == HANDSHAKE_FRAME_BYTES
    assert KafkaAuth(token=b"t" * 10_000).handshake_frame_limit == HANDSHAKE_FRAME_BYTES + 10_000
    long_name = {"u" * 1000: {}}
    assert KafkaAuth(credentials=long_name).handshake_frame_limit == HANDSHAKE_FRAME_BYTES + 6000
