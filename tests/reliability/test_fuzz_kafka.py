"""The fuzzer of test_fuzz_requests.py, extended to the Kafka listener (issue #13).

Hypothesis builds frames of four kinds, each sent on a fresh connection of one daemon:

* random bytes, behind a size prefix that is right, too small, too large or negative;
* a well-formed header of any apiKey and version (in range or not) over a random body;
* well-formed requests of the five RPCs at every version, encoded by kio (independent
  of our codec), with random field values: widths' edges, negative partitions and
  epochs, inverted and out-of-range batches, odd group ids and topic ids;
* those requests with a few bytes flipped, cut or inserted;
* strings made at the byte level (``tests.hostile_strings``): bytes that are not UTF-8
  (random, overlong forms, encoded surrogates) at every string a request carries, in
  every version (the group id of the five RPCs, FindCoordinator's keys, SaslHandshake's
  mechanism, ApiVersions' client software name and version): each closes its connection
  unanswered; in the header's client id, which the daemon never reads, they are answered.

Every frame gets a well-formed answer with its correlation id, or the connection closed
(what Kafka does with what it cannot read). The well-formed requests must be answered.
The daemon must still run when it is over, serve a valid request, and have logged no
trace.
"""

from __future__ import annotations

import base64
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import TOPIC, Daemon, DaemonConfig
from tests.hostile_strings import not_utf8
from tests.kafka_client import (
    LATEST,
    RPC_MODULES,
    STRING_POSITIONS,
    encode,
    kafka_address,
    message_class,
    schema,
)

SHORT = 400
LONG = 20000
MAX_BODY = 65536
CODES = {0, 3, 14, 15, 16, 42, 74, 124}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str, int]]:
    root: Path = tmp_path_factory.mktemp("kafka-fuzz")
    flags = (
        "--request-timeout-s", "5",
        "--max-body-bytes", str(MAX_BODY),
        "--max-entries-per-request", "64",
        "--max-state-batches-per-entry", "16",
    )  # fmt: skip
    config = DaemonConfig(
        root / "data", flags, partitions=4, kafka_listener="127.0.0.1:0", log_dir=root
    )
    daemon = Daemon(config).start()
    host, port = kafka_address(daemon.stdout_lines)
    yield daemon, host, port
    assert daemon.process.poll() is None, "the daemon died"
    # It still serves a valid request after everything it was sent.
    answer = exchange(host, port, _valid_summary(4242))
    assert answer is not None and answer[:4] == struct.pack(">i", 4242)
    assert daemon.terminate() == 0
    stderr = daemon.stderr_text()
    assert "Traceback" not in stderr, stderr


def exchange(host: str, port: int, data: bytes, timeout: float = 10.0) -> bytes | None:
    """Send ``data``; the first answer frame (without its size), or None if the daemon
    closed the connection instead."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            return None  # closed while we were still sending: refused early
        buf = b""
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not chunk:
                assert len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0], buf
                return None
            buf += chunk
            if len(buf) >= 4:
                size = struct.unpack(">i", buf[:4])[0]
                if len(buf) >= 4 + size:
                    return buf[4 : 4 + size]


def header(api_key: int, version: int, correlation: int, flexible: bool) -> bytes:
    out = struct.pack(">hhi", api_key, version, correlation) + b"\xff\xff"
    return out + (b"\x00" if flexible else b"")


def framed(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _valid_summary(correlation: int) -> bytes:
    request = message_class(RPC_MODULES["read-summary"], 1, "request")
    mod = schema(RPC_MODULES["read-summary"], 1, "request")
    topic = mod.ReadStateSummaryData(
        topic_id=uuid.UUID(bytes=bytes(16)),
        partitions=(mod.PartitionData(partition=0, leader_epoch=-1),),
    )
    body = encode(request(group_id="fuzz", topics=(topic,)))
    return framed(header(87, 1, correlation, True) + body)


# --- strategies -------------------------------------------------------------------------------

INT8 = st.one_of(st.integers(-3, 5), st.sampled_from([-(2**7), 2**7 - 1]))
INT16 = st.one_of(st.integers(-3, 5), st.sampled_from([-(2**15), 2**15 - 1]))
INT32 = st.one_of(st.integers(-3, 100), st.sampled_from([-(2**31), 2**31 - 1]))
INT64 = st.one_of(st.integers(-3, 1000), st.sampled_from([-(2**63), 2**63 - 1]))
GROUPS = st.one_of(st.sampled_from(["g", "", "ü" * 30]), st.text(max_size=20).filter(
    lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)
))  # fmt: skip
TOPICS = st.one_of(st.just(TOPIC), st.binary(min_size=16, max_size=16).map(
    lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")
))  # fmt: skip


@st.composite
def share_requests(draw: st.DrawFn) -> tuple[int, int, bytes]:
    """A kio-encoded request of one of the five RPCs, any version, random values."""
    rpc = draw(st.sampled_from(sorted(RPC_MODULES)))
    version = draw(st.integers(0, LATEST[rpc]))
    mod = schema(RPC_MODULES[rpc], version, "request")
    part_cls = mod.PartitionData
    fields_of = part_cls.__dataclass_fields__
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = []
        for _ in range(draw(st.integers(0, 4))):
            fields: dict[str, Any] = {"partition": draw(INT32)}
            for name in ("state_epoch", "leader_epoch", "delivery_complete_count"):
                if name in fields_of:
                    fields[name] = draw(INT32)
            if "start_offset" in fields_of:
                fields["start_offset"] = draw(INT64)
            if "state_batches" in fields_of:
                fields["state_batches"] = tuple(
                    mod.StateBatch(
                        first_offset=draw(INT64),
                        last_offset=draw(INT64),
                        delivery_state=draw(INT8),
                        delivery_count=draw(INT16),
                    )
                    for _ in range(draw(st.integers(0, 3)))
                )
            parts.append(part_cls(**fields))
        raw = base64.urlsafe_b64decode(draw(TOPICS) + "==")
        topic_cls = next(
            getattr(mod, n) for n in dir(mod) if n.endswith(("StateData", "StateSummaryData"))
        )
        topics.append(topic_cls(topic_id=uuid.UUID(bytes=raw), partitions=tuple(parts)))
    request = message_class(RPC_MODULES[rpc], version, "request")
    body = encode(request(group_id=draw(GROUPS), topics=tuple(topics)))
    api_key = request.__api_key__
    return api_key, version, header(api_key, version, 7, True) + body


@st.composite
def hostile_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "header", "mutated", "mutated", "size"]))
    if kind == "bytes":
        return framed(draw(st.binary(max_size=300)))
    if kind == "size":
        size = draw(st.sampled_from([-1, 0, 3, 7, MAX_BODY + 1, 2**31 - 1, -(2**31)]))
        return struct.pack(">i", size) + draw(st.binary(max_size=50))
    if kind == "header":
        api_key = draw(st.one_of(st.sampled_from([10, 17, 18, 36, 83, 84, 85, 86, 87]), INT16))
        version = draw(st.one_of(st.integers(-1, 8), INT16))
        flexible = draw(st.booleans())
        return framed(header(api_key, version, 9, flexible) + draw(st.binary(max_size=200)))
    _, _, data = draw(share_requests())
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if action == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return framed(bytes(data))


FUZZ = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_hostile(fuzzed, figures, frame: bytes) -> None:
    daemon, host, port = fuzzed
    answer = exchange(host, port, frame)
    assert daemon.process.poll() is None, ("the daemon died", frame[:200])
    if answer is not None:
        assert len(answer) >= 4, answer
    figures.add("bad_inputs_tried")


def run_valid(fuzzed, figures, request: tuple[int, int, bytes]) -> None:
    daemon, host, port = fuzzed
    api_key, version, data = request
    answer = exchange(host, port, framed(data))
    assert daemon.process.poll() is None, "the daemon died"
    if answer is None:
        # Only an entry count over --max-entries-per-request may close it; kio's
        # strategies stay under it, so every request must be answered.
        raise AssertionError(("closed instead of answered", data[:200]))
    assert answer[:4] == struct.pack(">i", 7)
    response = message_class(RPC_MODULES[_rpc_name(api_key)], version, "response")
    from kio.serial import entity_reader  # noqa: PLC0415

    decoded, size = entity_reader(response)(answer, 5)
    assert 5 + size == len(answer)
    for topic in decoded.results:
        for p in topic.partitions:
            assert int(p.error_code) in CODES, p
    figures.add("valid_requests_answered")


@st.composite
def hostile_string_frames(draw: st.DrawFn) -> tuple[str, bytes, bool]:
    """A request with one string made of bytes that are not UTF-8: (where, the frame,
    whether the daemon reads that string)."""
    where, frame_with, read = draw(st.sampled_from(STRING_POSITIONS))
    return where, frame_with(draw(not_utf8())), read


def run_hostile_string(fuzzed, figures, case: tuple[str, bytes, bool]) -> None:
    daemon, host, port = fuzzed
    where, frame, read = case
    answer = exchange(host, port, frame)
    assert daemon.process.poll() is None, ("the daemon died", where, frame[:200])
    if read:
        assert answer is None, ("answered instead of closed", where, frame[:200])
        figures.add("closed_unanswered")
    else:
        assert answer is not None and answer[:4] == struct.pack(">i", 7), (where, answer)
        figures.add("answered")
    figures.add("bad_inputs_tried")


def _rpc_name(api_key: int) -> str:
    return {83: "initialize", 84: "read", 85: "write", 86: "delete", 87: "read-summary"}[api_key]


@settings(FUZZ, max_examples=SHORT)
@given(frame=hostile_frames())
def test_hostile_frames(fuzzed, figures, frame):
    run_hostile(fuzzed, figures, frame)


@settings(FUZZ, max_examples=SHORT)
@given(request=share_requests())
def test_random_field_values_at_every_version_are_answered(fuzzed, figures, request):
    run_valid(fuzzed, figures, request)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(FUZZ, max_examples=LONG)
@given(frame=hostile_frames())
def test_hostile_frames_long(fuzzed, figures, frame):
    run_hostile(fuzzed, figures, frame)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(FUZZ, max_examples=LONG)
@given(request=share_requests())
def test_random_field_values_long(fuzzed, figures, request):
    run_valid(fuzzed, figures, request)


@settings(FUZZ, max_examples=SHORT)
@given(case=hostile_string_frames())
def test_strings_that_are_not_utf8_close_the_connection(fuzzed, figures, case):
    run_hostile_string(fuzzed, figures, case)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(FUZZ, max_examples=LONG)
@given(case=hostile_string_frames())
def test_strings_that_are_not_utf8_close_the_connection_long(fuzzed, figures, case):
    run_hostile_string(fuzzed, figures, case)
