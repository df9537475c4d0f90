"""Edges of the Kafka codec that an independent encoder never produces (what a hostile or
broken client could send), and the server side of SASL (protocol/sasl.py) against RFC 5802
and RFC 7677's test vectors."""

from __future__ import annotations

import base64

import pytest

from protocol import kafka_messages as km
from protocol import kafka_wire as wire
from protocol.kafka_wire import Reader, WireError
from protocol.messages import Rpc
from protocol.sasl import (
    SCRAM_SHA_256,
    DecoyShape,
    SaslFailed,
    ScramServer,
    check_plain,
    derive_credential,
)


@pytest.mark.parametrize(
    ("data", "read"),
    [
        (b"\xff\xff\xff\xff\xff\x01", Reader.uvarint),  # six bytes
        (b"\xff\xff\xff\xff\x7f", Reader.uvarint),  # past 32 bits
        (b"\x80", Reader.uvarint),  # truncated
        (b"\x00", Reader.compact_string),  # null where a string is required
        (b"\xff\xff", Reader.string),
        (b"\x00\x05ab", Reader.string),  # shorter than it says
        (b"\x03\xff\xfe", Reader.compact_string),  # not UTF-8
        (b"\x00", Reader.compact_array_length),  # null array
        (b"\x64\x00", Reader.compact_array_length),  # 99 elements in 1 byte
        (b"\x7f\xff\xff\xff", Reader.array_length),
        (b"\x02\x01\x05\x00", Reader.skip_tagged_fields),  # a tag longer than the rest
        (b"\x00\x00\x00", Reader.int32),
    ],
)
def test_malformed_primitives_raise_wire_error(data, read):
    with pytest.raises(WireError):
        read(Reader(data))


def test_unknown_tagged_fields_are_skipped_whole():
    r = Reader(b"\x02\x00\x01\xaa\x05\x02\xbb\xcc" + b"\x07")
    r.skip_tagged_fields()
    assert r.int8() == 7


def test_varints_round_trip_at_their_edges():
    for n in (0, 1, 127, 128, 16383, 16384, 2**31 - 1, 2**32 - 1):
        assert Reader(wire.uvarint(n)).uvarint() == n
    for n in (0, -1, 1, -(2**31), 2**31 - 1):
        assert Reader(wire.varint(n)).varint() == n


def test_requests_over_the_entry_or_batch_budget_are_refused_while_decoding():
    entries = b"".join(b"\x00\x00\x00\x01" + b"\x00" for _ in range(3))
    body = b"\x02g" + b"\x02" + bytes(16) + b"\x04" + entries + b"\x00\x00"
    decoded = km.decode_state_request(Rpc.DELETE, 0, Reader(body), km.Budget(3, 1))
    assert len(decoded.topics[0].partitions) == 3
    with pytest.raises(WireError, match="entries"):
        km.decode_state_request(Rpc.DELETE, 0, Reader(body), km.Budget(2, 1))


def test_empty_requests_are_recognised_as_kafka_answers_them():
    def request(group: str, partitions_per_topic: list[int]):
        topics = b"".join(
            bytes(16) + wire.uvarint(n + 1) + b"\x00\x00\x00\x00\x00" * n + b"\x00"
            for n in partitions_per_topic
        )
        body = wire.compact_string(group) + wire.uvarint(len(partitions_per_topic) + 1)
        body += topics + b"\x00"
        return km.decode_state_request(Rpc.DELETE, 0, Reader(body), km.Budget(100, 1))

    assert km.is_empty_request(request("", [1]))
    assert km.is_empty_request(request("g", []))
    assert km.is_empty_request(request("g", [1, 0]))
    assert not km.is_empty_request(request("g", [1, 2]))


# --- SASL ---------------------------------------------------------------------------------


def test_plain_takes_any_user_with_the_secret():
    assert check_plain(b"\x00leader-1\x00s3cret", b"s3cret") == "leader-1"
    assert check_plain(b"leader-1\x00leader-1\x00s3cret", b"s3cret") == "leader-1"
    for token in (b"\x00u\x00wrong", b"\x00\x00s3cret", b"x\x00u\x00s3cret", b"u\x00s3cret"):
        with pytest.raises(SaslFailed):
            check_plain(token, b"s3cret")


def test_rfc7677_test_vector():
    """RFC 7677 §3: user "user", password "pencil", the nonces and salt it gives."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = derive_credential(SCRAM_SHA_256, b"pencil", salt, 4096)
    server = ScramServer(
        SCRAM_SHA_256,
        lambda user, mechanism: credential if user == "user" else None,
        "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        DecoyShape(b"decoy"),
    )
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = server.step(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done and server.user == "user"


@pytest.mark.parametrize(
    "first",
    [b"p=tls-unique,,n=user,r=abc", b"n,,m=ext,n=user,r=abc", b"n,,n=user", b"x,,n=u,r=a",
     b"n,a=other,n=user,r=abc", b"n,,n=us=er,r=abc", b"n,,n=user,r=abc,tokenauth=true"],
)  # fmt: skip
def test_scram_refuses_what_it_does_not_support(first):
    server = ScramServer(SCRAM_SHA_256, lambda u, m: None, "s", DecoyShape(b"k"))
    with pytest.raises(SaslFailed):
        server.step(first)


def test_an_unknown_user_gets_a_stable_decoy_salt_and_fails_at_the_proof():
    def fresh() -> ScramServer:
        return ScramServer(SCRAM_SHA_256, lambda u, m: None, "server", DecoyShape(b"decoy-key"))

    a, b = fresh(), fresh()
    assert a.step(b"n,,n=ghost,r=c1").split(b",")[1] == b.step(b"n,,n=ghost,r=c2").split(b",")[1]
    proof = base64.b64encode(bytes(32)).decode()
    with pytest.raises(SaslFailed, match="Invalid user credentials"):
        a.step(f"c=biws,r=c1server,p={proof}".encode())


def test_skipping_a_request_header_gives_its_correlation_id_and_the_body_after_it():
    for version in (1, 2):
        for client in (None, "", "leader-7"):
            data = wire.request_header(85, 1, 4242, client, version) + b"BODY"
            reader = Reader(data)
            assert wire.skip_request_header(reader, version) == 4242
            assert data[reader.pos :] == b"BODY"
    with pytest.raises(WireError):
        wire.skip_request_header(Reader(b"\x00\x55\x00\x01\x00\x00\x00\x01\xff\xfe"), 1)
