"""Kafka 4.4.0's own share coordinator next to sharecoord's Kafka listener: the same load
generator (bench/kafka_load.py), the same pre-encoded frames, the same machine.

Both servers get the same setup: 50 state partitions, 500 updates per snapshot, the
10,000 share-partitions of bench/workload.py (of one topic the broker created, which
sharecoord takes as it is), initialized over the Kafka protocol, then 100,000 records of
batched writes. Both then run side by side, and each step below runs on Kafka and then
on sharecoord, so that the machine's drift falls on both alike:

1. a restart pinned to one core, timed from launching the process to the first write
   it answers with 0 (Kafka: JVM start, then loading ``__share_group_state``;
   sharecoord: Python start, then replaying its log);
2. single writes at c=1/16/64, batched writes (50 share-partitions per request) at
   c=16/64 and read-summaries at c=1/16, the server pinned to one core as every peer is;
3. a restart on both cores, then single writes at c=64, batched writes at c=64 and
   read-summaries at c=16 with the server free to use both (the generator stays on the
   second core, so it then competes with the server).

Before each scenario the first frames of its file are sent once and every answer is
decoded (with kio) and checked: a benchmark of errors measures nothing.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.kafka_load import read_frames, run_kafka_load, write_frames
from bench.loadgen import LoadResult
from bench.system import free_port, pinned, python_env, running, wait_for_port
from bench.workload import GROUPS, PARTITIONS_PER_GROUP, group_name, write_bodies
from kafka_peer import KAFKA_VERSION, Broker, BrokerSettings, fetch
from kafka_peer.admin import Connection, create_topic, wait_until_loaded
from protocol import kafka_messages as km
from protocol.messages import InitializePartition, ReadSummaryPartition, Rpc, TopicRequest
from protocol.messages import ShareGroupStateRequest as Request

STATE_PARTITIONS = 50
FILL_RECORDS = 100_000
ONE_CORE, TWO_CORES = "0", "0,1"
KAFKA = f"kafka {KAFKA_VERSION}"
SHARECOORD = "sharecoord kafka listener"
API_KEYS = {"write": 85, "read-summary": 87, "initialize": 83}
RESPONSES = {
    85: "kio.schema.write_share_group_state.v1.response.WriteShareGroupStateResponse",
    87: "kio.schema.read_share_group_state_summary.v1.response.ReadShareGroupStateSummaryResponse",
    83: "kio.schema.initialize_share_group_state.v0.response.InitializeShareGroupStateResponse",
}


def _say(text: str) -> None:
    print(text, flush=True)


# --- frames ---------------------------------------------------------------------------------


def _with_topic(bodies: list[dict[str, Any]], topic_id: str) -> list[dict[str, Any]]:
    for body in bodies:
        for topic in body["topics"]:
            topic["topic_id"] = topic_id
    return bodies


def _frames(api_key: int, version: int, rpc: Rpc, bodies: list[Request[Any]], path: Path) -> Path:
    with open(path, "wb") as out:
        for i, request in enumerate(bodies):
            payload = km.encode_state_request(rpc, version, request)
            out.write(km.encode_request_frame(api_key, version, i, payload, "bench"))
    return path


def build_frames(directory: Path, topic_id: str) -> dict[str, Path]:
    rng = random.Random(4400)
    directory.mkdir(parents=True, exist_ok=True)
    init = [
        Request(group_name(g), [_topic(topic_id, [InitializePartition(p, 0, 0)
                                                  for p in range(PARTITIONS_PER_GROUP)])])
        for g in range(GROUPS)
    ]  # fmt: skip
    summaries = [
        Request(
            group_name(rng.randrange(GROUPS)),
            [_topic(topic_id, [ReadSummaryPartition(rng.randrange(PARTITIONS_PER_GROUP), -1)])],
        )
        for _ in range(20_000)
    ]
    return {
        "initialize": _frames(83, 0, Rpc.INITIALIZE, init, directory / "initialize.kafka"),
        "write": write_frames(
            _with_topic(write_bodies(rng, 20_000, 1), topic_id), directory / "write-1.kafka"
        ),
        "write_batch": write_frames(
            _with_topic(write_bodies(rng, 4_000, 50), topic_id), directory / "write-50.kafka"
        ),
        "read_summary": _frames(87, 1, Rpc.READ_SUMMARY, summaries, directory / "summary.kafka"),
    }


def _topic(topic_id: str, partitions: list[Any]) -> Any:
    return TopicRequest(topic_id, partitions)


# --- checked requests -------------------------------------------------------------------------


def _error_codes(data: bytes, api_key: int) -> list[int]:
    """Every partition's error code in an answer (decoded by kio, not by sharecoord)."""
    import importlib  # noqa: PLC0415

    from kio.serial import entity_reader  # noqa: PLC0415

    module, _, name = RESPONSES[api_key].rpartition(".")
    response = getattr(importlib.import_module(module), name)
    _, offset = entity_reader(response.__header_schema__)(data, 0)
    answer, _ = entity_reader(response)(data, offset)
    return [int(p.error_code) for t in answer.results for p in t.partitions]


def send_checked(port: int, frames: list[bytes], api_key: int) -> None:
    """Send ``frames`` one at a time; every partition of every answer must be 0."""
    with socket.create_connection(("127.0.0.1", port), 60) as sock:
        for frame in frames:
            sock.sendall(frame)
            data = _read(sock, struct.unpack(">i", _read(sock, 4))[0])
            codes = set(_error_codes(data, api_key))
            if codes != {0}:
                raise RuntimeError(f"apiKey {api_key} on port {port} answered {sorted(codes)}")


def _read(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)


def first_write_answered(port: int, frame: bytes, deadline_s: float = 600.0) -> float:
    """Poll with one write until it is answered 0; the monotonic time it was."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), 5) as sock:
                sock.sendall(frame)
                data = _read(sock, struct.unpack(">i", _read(sock, 4))[0])
            if set(_error_codes(data, 85)) == {0}:
                return time.monotonic()
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"no write answered on port {port} in {deadline_s}s")


# --- the two servers --------------------------------------------------------------------------


class KafkaSide:
    name = KAFKA

    def __init__(self, work: Path) -> None:
        settings = BrokerSettings(state_partitions=STATE_PARTITIONS, cpus=ONE_CORE)
        self.broker = Broker(fetch(), work / "kafka", settings)

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def pid(self) -> int:
        return self.broker.pid

    def start(self, cpus: str) -> float:
        self.broker.settings.cpus = cpus
        self.broker.start()
        return time.monotonic()

    def stop(self) -> None:
        if not self.broker.stop():
            _say("  the broker did not stop by itself: killed")

    def errors(self) -> dict[str, float]:
        """Kafka's answers are checked by ``send_checked`` before each run instead."""
        return {}

    def ready(self, topic_id: str) -> None:
        """Every state partition loaded, not only the probe's."""
        with Connection("127.0.0.1", self.port) as admin:
            wait_until_loaded(admin, topic_id, STATE_PARTITIONS)


class SharecoordSide:
    name = SHARECOORD

    def __init__(self, work: Path) -> None:
        self.data = work / "sharecoord-data"
        self.log = work / "sharecoord.log"
        self.port = free_port()
        self.http_port = free_port()
        self._stack: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.pid = 0

    def start(self, cpus: str) -> float:
        argv = pinned(cpus, [
            sys.executable, "-m", "server.commands.cli", "serve", "--data-dir", str(self.data),
            "--listen", f"127.0.0.1:{self.http_port}", "--log-level", "warning",
            "--partitions", str(STATE_PARTITIONS), "--kafka-listener", f"127.0.0.1:{self.port}",
        ])  # fmt: skip
        self._stack = running(argv, env=python_env(), log=str(self.log))
        self._proc = self._stack.__enter__()
        self.pid = self._proc.pid
        wait_for_port(self.port, 300)
        return time.monotonic()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.__exit__(None, None, None)
            self._stack = None

    def ready(self, topic_id: str) -> None:
        deadline = time.monotonic() + 300
        last: object = None
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.http_port}/readyz", timeout=5
                ) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"/readyz {exc.code}: {exc.read()[:500]!r}"
            except OSError as exc:
                last = exc
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"sharecoord exited {self._proc.returncode} before it was ready; "
                    f"its log ends:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sharecoord not ready after 300s (last: {last}); its log ends:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError as exc:
            return f"(unreadable: {exc})"

    def errors(self) -> dict[str, float]:
        """Partition results other than 0 so far, by metric line (the restart probes'
        14s among them)."""
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        found = {}
        for line in text.splitlines():
            if (
                line.startswith("sharecoord_partition_results_total")
                and 'error_code="0"' not in line
            ):
                sample, _, value = line.rpartition(" ")
                found[sample] = float(value)
        return found


Side = KafkaSide | SharecoordSide


@contextmanager
def _stopped_after(side: Side) -> Iterator[None]:
    try:
        yield
    finally:
        side.stop()


def _restart(side: Side, cpus: str, probe: bytes, topic_id: str) -> dict[str, Any]:
    side.stop()
    launched = time.monotonic()
    listening = side.start(cpus) - launched
    answered = first_write_answered(side.port, probe) - launched
    side.ready(topic_id)
    cores = "1 core" if cpus == ONE_CORE else "2 cores"
    _say(f"  {side.name}, restart on {cores}: {answered:.1f}s to the first write answered")
    records = GROUPS * PARTITIONS_PER_GROUP + FILL_RECORDS
    return {
        "name": f"{side.name}: restart to the first answered write, {cores}",
        "records": records,
        "seconds": answered,
        "records_per_s": records / answered,
        "note": f"listening after {listening:.1f}s (process start included)",
    }


def _rows(
    side: Side, frames: dict[str, Path], duration: float, suffix: str, plan: list[tuple[str, int]]
) -> list[LoadResult]:
    rows = []
    for kind, concurrency in plan:
        items = 50 if kind == "write_batch" else 1
        api_key = API_KEYS["read-summary" if kind == "read_summary" else "write"]
        send_checked(side.port, read_frames(str(frames[kind]))[:20], api_key)
        label = {"write": "write", "write_batch": "write x50", "read_summary": "read-summary"}
        name = f"{side.name} {label[kind]}{suffix}"
        rows.append(
            run_kafka_load(
                name,
                side.port,
                frames[kind],
                concurrency=concurrency,
                duration_s=duration,
                server_pid=side.pid,
                items_per_request=items,
            )
        )
        _say(f"  {name} c={concurrency}: {rows[-1].items_per_s:,.0f} share-partitions/s")
    return rows


ONE_CORE_PLAN = [("write", 1), ("write", 16), ("write", 64), ("write_batch", 16),
                 ("write_batch", 64), ("read_summary", 1), ("read_summary", 16)]  # fmt: skip
TWO_CORE_PLAN = [("write", 64), ("write_batch", 64), ("read_summary", 16)]


def _fill(side: Side, frames: dict[str, Path]) -> None:
    _say(f"{side.name}: initialize {GROUPS * PARTITIONS_PER_GROUP:,} share-partitions, "
         f"then {FILL_RECORDS:,} records of batched writes")  # fmt: skip
    send_checked(side.port, read_frames(str(frames["initialize"])), 83)
    send_checked(side.port, read_frames(str(frames["write_batch"]))[: FILL_RECORDS // 50], 85)


def scenarios(work: Path, duration: float) -> tuple[list[LoadResult], list[dict[str, Any]]]:
    """Both servers up at once, each step run on Kafka and then on sharecoord, so that
    the machine's drift falls on both alike: (load rows, restart rows)."""
    kafka, sharecoord = KafkaSide(work), SharecoordSide(work)
    kafka.start(ONE_CORE)
    with _stopped_after(kafka):
        with Connection("127.0.0.1", kafka.port) as admin:
            topic_id = create_topic(admin, "bench", PARTITIONS_PER_GROUP)
            wait_until_loaded(admin, topic_id, STATE_PARTITIONS)
        frames = build_frames(work / "kafka-peer-frames", topic_id)
        sharecoord.start(ONE_CORE)
        with _stopped_after(sharecoord):
            sharecoord.ready(topic_id)
            sides: list[Side] = [kafka, sharecoord]
            for side in sides:
                _fill(side, frames)
            probe = read_frames(str(frames["write"]))[0]
            rows: list[LoadResult] = []
            restarts: list[dict[str, Any]] = []
            for cpus, suffix, plan in (
                (ONE_CORE, "", ONE_CORE_PLAN),
                (TWO_CORES, ", 2 cores", TWO_CORE_PLAN),
            ):
                restarts += [_restart(side, cpus, probe, topic_id) for side in sides]
                before = [side.errors() for side in sides]
                for step in plan:
                    for side in sides:
                        rows += _rows(side, frames, duration, suffix, [step])
                for side, errors in zip(sides, before, strict=True):
                    if side.errors() != errors:
                        raise RuntimeError(f"{side.name} answered errors: {side.errors()}")
    return rows, restarts


def ratios(rows: list[LoadResult]) -> dict[str, float]:
    def at(name: str, concurrency: int) -> float | None:
        found = [r.items_per_s for r in rows if r.name == name and r.concurrency == concurrency]
        return found[0] if found else None

    out: dict[str, float] = {}
    for label, concurrency, suffix in (
        ("write", 1, ""), ("write", 16, ""), ("write", 64, ""), ("write x50", 16, ""),
        ("write x50", 64, ""), ("read-summary", 16, ""), ("write", 64, ", 2 cores"),
        ("write x50", 64, ", 2 cores"), ("read-summary", 16, ", 2 cores"),
    ):  # fmt: skip
        ours = at(f"{SHARECOORD} {label}{suffix}", concurrency)
        theirs = at(f"{KAFKA} {label}{suffix}", concurrency)
        if ours and theirs:
            cores = "2 cores" if suffix else "1 core"
            out[f"{label} c={concurrency} ({cores}), sharecoord / Kafka {KAFKA_VERSION}"] = (
                ours / theirs
            )
    return out


def main() -> None:
    """`python -m bench.kafka_peer [SECONDS]`: these rows alone, printed as JSON."""
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    with tempfile.TemporaryDirectory(prefix="sharecoord-bench-kafka-") as tmp:
        rows, restarts = scenarios(Path(tmp), duration)
    print(json.dumps({"http": [r.as_dict() for r in rows], "restarts": restarts,
                      "ratios": ratios(rows)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
