"""Real daemons for the end-to-end tests, and a small HTTP client speaking docs/api.md.

``start_daemon`` runs ``python -m server.commands.cli serve`` in a child process (with the
repository root on ``PYTHONPATH``, so it works in a plain checkout and in an editable
install alike) and returns once the child printed ``sharecoord listening on URL``.
Everything here that waits on a process or a pipe is blocking: async tests call it
through ``asyncio.to_thread``.

``Api`` sends the API's requests in either format (``"json"`` or ``"msgpack"``) and
decodes whatever comes back by its Content-Type, so a test sees what a caller sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

from protocol.routing import partition_for

REPO_ROOT = Path(__file__).resolve().parents[2]

# Safety nets against a hung test, never timing assertions.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 120.0

_LISTENING = re.compile(r"^sharecoord listening on (https?)://(\S+):(\d+)$")

# Two topic ids for tests: Kafka's 22-char form and the same id in RFC 4122 form.
TOPIC = "WwwvDo06T2ueIXxNGis8TQ"
TOPIC_RFC4122 = "5b0c2f0e-8d3a-4f6b-9e21-7c4d1a2b3c4d"
OTHER_TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"

MEDIA = {"json": "application/json", "msgpack": "application/msgpack"}
FORMATS = ("json", "msgpack")


# --- child processes ----------------------------------------------------------------------


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon or CLI child: ours, minus any SHARECOORD_ setting that
    would leak into it, plus the repository root on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARECOORD_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env.update(extra or {})
    return env


def run_cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0) -> Any:
    """``sharecoord ARGS`` in a child process (blocking); the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "server.commands.cli", *args],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO_ROOT,
    )


@dataclass
class Daemon:
    """One ``sharecoord serve`` child process."""

    process: subprocess.Popen[str]
    scheme: str
    host: str
    port: int
    stderr_path: Path
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> int:
        """SIGKILL: no chance to flush or close anything."""
        if self.process.poll() is None:
            self.process.kill()
        return self.wait()

    def terminate(self) -> int:
        """SIGTERM, then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """The exit code; raises TimeoutExpired if the process still runs after
        ``timeout`` (the ``daemons`` fixture kills it then)."""
        code = self.process.wait(timeout)
        # Only now: closing the pipe while the process lives blocks on the reading
        # thread (_pump), which holds the file's lock until the process writes or exits.
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def start_daemon(
    data_dir: str | Path,
    *flags: str,
    listen: str = "127.0.0.1:0",
    partitions: int | None = 8,
    env: Mapping[str, str] | None = None,
    log_dir: str | Path | None = None,
    timeout: float = START_TIMEOUT_S,
    signal_when_listening: int | None = None,
) -> Daemon:
    """Start ``sharecoord serve`` on ``data_dir`` and wait for its "listening" line.

    Blocking. Raises ``DaemonExited`` (with its stderr) if the child ends first.
    ``signal_when_listening`` is sent by the thread reading stdout the moment it reads
    that line, with nothing in between.
    """
    log_dir = Path(log_dir) if log_dir is not None else Path(data_dir).parent
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = _free_path(log_dir, "daemon", ".stderr")
    args = [sys.executable, "-m", "server.commands.cli", "serve", "--data-dir", str(data_dir)]
    args += ["--listen", listen]
    if partitions is not None:
        args += ["--partitions", str(partitions)]
    args += list(flags)
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=child_env(env),
            text=True,
            cwd=REPO_ROOT,
        )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(
        target=_pump, args=(process, lines, signal_when_listening), daemon=True
    ).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            code = None
        else:
            if line is not None:
                seen.append(line)
                match = _LISTENING.match(line)
                if match:
                    return Daemon(process, match[1], match[2], int(match[3]), stderr_path, seen)
                continue
            code = process.wait()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
        raise DaemonExited(code, stderr_path.read_text(errors="replace"), seen)


def _pump(
    process: subprocess.Popen[str], lines: queue.Queue[str | None], signum: int | None
) -> None:
    assert process.stdout is not None
    with contextlib.suppress(ValueError, OSError):  # closed under us by Daemon.wait
        for line in process.stdout:
            if signum is not None and _LISTENING.match(line.rstrip("\n")):
                process.send_signal(signum)
                signum = None
            lines.put(line.rstrip("\n"))
    lines.put(None)


def _free_path(directory: Path, stem: str, suffix: str) -> Path:
    n = 0
    while (path := directory / f"{stem}-{n}{suffix}").exists():
        n += 1
    path.touch()
    return path


class DaemonExited(Exception):
    def __init__(self, code: int | None, stderr: str, stdout: list[str]) -> None:
        self.code = code
        self.stderr = stderr
        self.stdout = stdout
        what = "did not start in time" if code is None else f"exited with {code}"
        super().__init__(f"sharecoord serve {what}; stderr:\n{stderr}")


def free_port() -> int:
    """A port nobody listens on right now (for cluster files that must name ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- keys ---------------------------------------------------------------------------------


def partitions_in(
    state_partition: int,
    num_partitions: int,
    *,
    group_id: str,
    topic_id: str = TOPIC,
    count: int = 1,
    start: int = 0,
) -> list[int]:
    """The first ``count`` partition numbers >= ``start`` of ``group_id``/``topic_id``
    whose keys belong to ``state_partition`` (topic id in its 22-char form)."""
    found = []
    partition = start
    while len(found) < count:
        if partition_for(group_id, topic_id, partition, num_partitions) == state_partition:
            found.append(partition)
        partition += 1
    return found


# --- request bodies -----------------------------------------------------------------------


def batch(first: int, last: int, state: int = 0, count: int = 1) -> dict[str, int]:
    return {
        "first_offset": first,
        "last_offset": last,
        "delivery_state": state,
        "delivery_count": count,
    }


def body(group_id: str, *topics: tuple[str, Iterable[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "topics": [{"topic_id": t, "partitions": list(entries)} for t, entries in topics],
    }


def init_entry(partition: int, state_epoch: int = 0, start_offset: int = 0) -> dict[str, Any]:
    return {"partition": partition, "state_epoch": state_epoch, "start_offset": start_offset}


def write_entry(
    partition: int,
    *batches: dict[str, int],
    state_epoch: int = 0,
    leader_epoch: int = 0,
    start_offset: int = -1,
    delivery_complete_count: int | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "partition": partition,
        "state_epoch": state_epoch,
        "leader_epoch": leader_epoch,
        "start_offset": start_offset,
        "state_batches": list(batches),
    }
    if delivery_complete_count is not None:
        entry["delivery_complete_count"] = delivery_complete_count
    return entry


def read_entry(partition: int, leader_epoch: int = 0) -> dict[str, Any]:
    return {"partition": partition, "leader_epoch": leader_epoch}


def part(partition: int) -> dict[str, Any]:
    return {"partition": partition}


# --- the HTTP client ----------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    content_type: str
    headers: Mapping[str, str]
    body: Any  # decoded JSON / msgpack, or text
    raw: bytes

    @property
    def format(self) -> str | None:
        for name, media in MEDIA.items():
            if self.content_type == media:
                return name
        return None


def encode(obj: Any, fmt: str) -> bytes:
    if fmt == "msgpack":
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj).encode()


def decode(raw: bytes, content_type: str) -> Any:
    if content_type == MEDIA["msgpack"]:
        return msgpack.unpackb(raw, raw=False)
    if content_type == MEDIA["json"]:
        return json.loads(raw)
    return raw.decode("utf-8", "replace")


class Api:
    """docs/api.md over HTTP, in one format; ``token`` adds the bearer header."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        fmt: str = "json",
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.fmt = fmt
        self.token = token
        self.ssl_context = ssl_context

    def with_format(self, fmt: str) -> Api:
        return Api(self.session, self.base_url, fmt, token=self.token, ssl_context=self.ssl_context)

    def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(extra or {})
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | Any = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Reply:
        kwargs: dict[str, Any] = {}
        if self.ssl_context is not None:
            kwargs["ssl"] = self.ssl_context
        async with self.session.request(
            method,
            self.base_url + path,
            data=data,
            headers=self._headers(headers),
            params=params,
            **kwargs,
        ) as response:
            raw = await response.read()
            content_type = response.content_type
            return Reply(
                response.status, content_type, response.headers, decode(raw, content_type), raw
            )

    async def post(self, path: str, obj: Any, *, headers: Mapping[str, str] | None = None) -> Reply:
        """POST ``obj`` encoded in this client's format, with its Content-Type."""
        all_headers = {"Content-Type": MEDIA[self.fmt], **(headers or {})}
        return await self.request("POST", path, data=encode(obj, self.fmt), headers=all_headers)

    async def rpc_reply(self, rpc: str, obj: Any) -> Reply:
        return await self.post(f"/v1/share-group-state/{rpc}", obj)

    async def rpc(self, rpc: str, obj: Any) -> dict[str, Any]:
        """One of the five RPCs; asserts HTTP 200 in this client's format."""
        reply = await self.rpc_reply(rpc, obj)
        assert reply.status == 200, (reply.status, reply.body)
        assert reply.format == self.fmt, reply.content_type
        return reply.body  # type: ignore[no-any-return]

    async def results(self, rpc: str, obj: Any) -> list[dict[str, Any]]:
        """The partition results of a one-topic request, in order."""
        answer = await self.rpc(rpc, obj)
        assert len(answer["results"]) == 1, answer
        return answer["results"][0]["partitions"]  # type: ignore[no-any-return]

    async def codes(self, rpc: str, obj: Any) -> list[int]:
        return [r["error_code"] for r in await self.results(rpc, obj)]

    async def admin_state(
        self, group_id: str, topic_id: str, partition: int, *, accept: str | None = None
    ) -> Reply:
        headers = {"Accept": accept} if accept else {"Accept": MEDIA[self.fmt]}
        return await self.request(
            "GET",
            "/v1/admin/state",
            params={"group_id": group_id, "topic_id": topic_id, "partition": str(partition)},
            headers=headers,
        )

    async def register_topic(self, topic_id: str, partition_count: int) -> Reply:
        """``PUT /v1/admin/topics`` in this client's format."""
        return await self.request(
            "PUT",
            "/v1/admin/topics",
            data=encode({"topic_id": topic_id, "partition_count": partition_count}, self.fmt),
            headers={"Content-Type": MEDIA[self.fmt]},
        )

    async def delete_topic(self, topic_id: str) -> Reply:
        """``DELETE /v1/admin/topics/{topic_id}``, answered in this client's format."""
        return await self.request(
            "DELETE", f"/v1/admin/topics/{topic_id}", headers={"Accept": MEDIA[self.fmt]}
        )

    async def state(self, group_id: str, topic_id: str, partition: int) -> dict[str, Any] | None:
        """The admin state of a key, or None on 404 (code 3)."""
        reply = await self.admin_state(group_id, topic_id, partition)
        if reply.status == 404:
            assert reply.body["error_code"] == 3, reply.body
            return None
        assert reply.status == 200, (reply.status, reply.body)
        return reply.body  # type: ignore[no-any-return]

    async def readyz(self) -> Reply:
        return await self.request("GET", "/readyz")

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            reply = await self.readyz()
            if reply.status == 200:
                return
            assert time.monotonic() < deadline, f"not ready in time: {reply.body}"
            await asyncio.sleep(0.02)

    async def metrics(self) -> str:
        reply = await self.request("GET", "/metrics")
        assert reply.status == 200
        return reply.raw.decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly these labels in Prometheus text (0
    if it is not there). The format does not order a sample's labels: any order matches."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
        if found == labels:
            return float(value)
    return 0.0


async def wait_metric(
    api: Api,
    name: str,
    check: Callable[[float], bool],
    timeout: float = READY_TIMEOUT_S,
    **labels: str,
) -> float:
    """Poll /metrics until the sample ``name{labels}`` (0 while absent) passes
    ``check``; its value then."""
    deadline = time.monotonic() + timeout
    while True:
        value = metric_value(await api.metrics(), name, **labels)
        if check(value):
            return value
        assert time.monotonic() < deadline, f"{name}{labels} stayed at {value}"
        await asyncio.sleep(0.05)


async def wait_for_log(
    daemon: Daemon, check: Callable[[str], bool], timeout: float = READY_TIMEOUT_S
) -> str:
    """Poll the daemon's stderr until ``check`` passes on its text; the text then."""
    deadline = time.monotonic() + timeout
    while True:
        text = await asyncio.to_thread(daemon.stderr_text)
        if check(text):
            return text
        assert time.monotonic() < deadline, f"not in the log in time:\n{text[-3000:]}"
        await asyncio.sleep(0.05)


# --- writes whose outcome is known without the merge rules ----------------------------------

DELIVERY_STATES = (0, 1, 2, 4)


@dataclass(frozen=True)
class Expected:
    """What admin state must show for one key (the parts ``next_write`` changes)."""

    start_offset: int
    state_batches: tuple[tuple[int, int, int, int], ...]
    delivery_complete_count: int

    def matches(self, state: dict[str, Any] | None) -> bool:
        return state is not None and (
            state["start_offset"],
            tuple(tuple(b.values()) for b in state["state_batches"]),
            state["delivery_complete_count"],
        ) == (self.start_offset, self.state_batches, self.delivery_complete_count)


# After initialize with start_offset 0 (docs/semantics.md §A.1 point 7: delivery_complete_count 0).
INITIAL = Expected(0, (), 0)


def next_write(
    rng: random.Random, partition: int, current: Expected
) -> tuple[dict[str, Any], Expected]:
    """A random write entry and the state it leaves. Its start offset is past every
    stored batch, so the state is exactly its one batch (docs/semantics.md §7 step 2), whether the
    write becomes an update or a snapshot."""
    last = current.state_batches[-1][1] if current.state_batches else current.start_offset
    start = last + 1 + rng.randrange(10)
    first, end = start + rng.randrange(3), start + 3 + rng.randrange(40)
    state, count = rng.choice(DELIVERY_STATES), rng.randrange(6)
    complete = rng.randrange(1000)
    entry = {
        "partition": partition,
        "state_epoch": -1,
        "leader_epoch": -1,
        "start_offset": start,
        "delivery_complete_count": complete,
        "state_batches": [batch(first, end, state, count)],
    }
    return entry, Expected(start, ((first, end, state, count),), complete)


class Acknowledged:
    """The acknowledged state of some keys of one group and topic, plus the writes whose
    answer never came (they may or may not have been applied, each whole)."""

    def __init__(self, group_id: str, partitions: Iterable[int], topic_id: str = TOPIC) -> None:
        self.group_id = group_id
        self.topic_id = topic_id
        self.acked = dict.fromkeys(partitions, INITIAL)
        self.unknown: dict[int, Expected] = {}

    def init_body(self) -> dict[str, Any]:
        return body(self.group_id, (self.topic_id, [init_entry(p, 1, 0) for p in self.acked]))

    async def check(self, api: Api) -> None:
        """Admin state equals what was acknowledged, for every key; a write whose answer
        was lost is allowed to be there (and then counts as acknowledged)."""
        for partition, expected in self.acked.items():
            state = await api.state(self.group_id, self.topic_id, partition)
            attempted = self.unknown.pop(partition, None)
            if attempted is not None and attempted.matches(state):
                self.acked[partition] = attempted
                continue
            assert expected.matches(state), (partition, expected, attempted, state)
