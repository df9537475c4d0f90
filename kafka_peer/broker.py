"""Apache Kafka's own broker on this machine, as the share coordinator sharecoord is
compared with (tests/kafka_peer) and measured against (bench/kafka_peer.py).

``fetch`` copies the broker's jars, pinned by ``kafka_peer/pom.xml``, from Maven Central
into a cache directory outside git (``kafka_peer/cache`` unless ``KAFKA_PEER_CACHE`` names
another), once: a later call finds them there. ``Broker`` then runs one single-node KRaft
broker (broker and controller in one process) from those jars:

1. format a log directory with the ``share.version`` feature on, so the broker runs its
   share coordinator and serves apiKeys 83-87 (Initialize/Read/Write/Delete/ReadSummary
   ShareGroupState) to any caller, as there is no authorizer;
2. start it on loopback with a bounded heap, its internal topics at replication factor 1
   and min ISR 1 (``__share_group_state`` among them, created on the first
   FindCoordinator of key type 2);
3. wait until ApiVersions lists apiKeys 83-87;
4. stop it with SIGTERM and wait for it to exit (a controlled shutdown).

Whatever is missing (Java 17, Maven, a repository that answers) is one line in a
``PeerUnavailable``, never a skip.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

KAFKA_VERSION = "4.4.0"
HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG_CONFIG = HERE / "log4j2.yaml"
SHARE_STATE_APIS = (83, 84, 85, 86, 87)
MIN_JAVA = 17
DEPENDENCY_PLUGIN = "3.8.1"  # as pom.xml pins it

START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0


class PeerUnavailable(Exception):
    """The broker cannot be had here; the message is one line saying why."""


def cache_dir() -> Path:
    return Path(os.environ.get("KAFKA_PEER_CACHE") or HERE / "cache")


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise PeerUnavailable(
            f"kafka peer: no `java` on PATH; Kafka {KAFKA_VERSION} needs Java {MIN_JAVA} or later"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(found[1]) if found else 0
    if major == 1 and found and found[2]:  # "1.8.0_x" is Java 8
        major = int(found[2])
    if major < MIN_JAVA:
        raise PeerUnavailable(
            f"kafka peer: {java} is Java {major or 'of unknown version'}; "
            f"Kafka {KAFKA_VERSION} needs Java {MIN_JAVA} or later"
        )
    return java


def fetch(cache: Path | None = None) -> Path:
    """The directory of the broker's jars, copied there by Maven on the first call.

    Raises ``PeerUnavailable`` when Java or Maven is missing or Maven cannot resolve
    the jars (an unreachable repository, say)."""
    _java()
    jars = (cache or cache_dir()) / f"kafka-{KAFKA_VERSION}"
    if (jars / ".complete").exists():
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerUnavailable(
            f"kafka peer: no `mvn` on PATH to fetch Kafka {KAFKA_VERSION}'s jars "
            "(Debian: apt-get install maven)"
        )
    jars.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".kafka-{KAFKA_VERSION}-", dir=jars.parent))
    try:
        goal = f"org.apache.maven.plugins:maven-dependency-plugin:{DEPENDENCY_PLUGIN}"
        done = _maven(
            [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM), f"{goal}:copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
        )  # fmt: skip
        if done.returncode != 0:
            raise PeerUnavailable(
                f"kafka peer: Maven could not fetch Kafka {KAFKA_VERSION}'s jars: "
                + _first_error(done.stdout + done.stderr)
            )
        if not (staging / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
            raise PeerUnavailable(f"kafka peer: Maven ran, yet no kafka_2.13-{KAFKA_VERSION}.jar")
        (staging / ".complete").write_text(
            "\n".join(sorted(p.name for p in staging.glob("*.jar"))) + "\n"
        )
        shutil.rmtree(jars, ignore_errors=True)
        staging.rename(jars)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return jars


def _maven(argv: list[str], timeout: float = 1800.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(
            f"kafka peer: Maven did not finish fetching Kafka {KAFKA_VERSION}'s jars "
            f"in {timeout:.0f}s (a repository that does not answer?)"
        ) from None


def _first_error(output: str) -> str:
    """The line of a tool's output that says what went wrong (Maven's first [ERROR],
    or a line saying error)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("[ERROR]") or "error" in line.lower()]
    text = (errors or lines or ["(no output)"])[0]
    return text.removeprefix("[ERROR]").strip()[:400]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_uuid() -> str:
    """A random id in Kafka's text form (22 characters of base64url), for the cluster."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class BrokerSettings:
    """What the comparison and the bench choose; everything else is Kafka's default."""

    state_partitions: int = 50  # share.coordinator.state.topic.num.partitions
    records_per_snapshot: int = 500  # share.coordinator.snapshot.update.records.per.snapshot
    heap_mb: int = 512
    cpus: str | None = None  # taskset's CPU list, or the whole machine
    extra: Mapping[str, str] = field(default_factory=dict)


class Broker:
    """One single-node KRaft broker in ``workdir``: ``start``, ``stop``, ``start`` again on
    the same log directory (a restart), or ``with Broker(...) as broker``."""

    def __init__(self, jars: Path, workdir: Path, settings: BrokerSettings | None = None) -> None:
        self.jars = jars
        self.workdir = workdir
        self.settings = settings or BrokerSettings()
        self.host = "127.0.0.1"
        self.port = free_port()
        self.controller_port = free_port()
        self.log_path = workdir / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.formatted = False
        self.api_versions: dict[int, tuple[int, int]] = {}

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def properties(self) -> dict[str, str]:
        s = self.settings
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},"
            f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.workdir / "logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": str(s.state_partitions),
            "share.coordinator.snapshot.update.records.per.snapshot": str(s.records_per_snapshot),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        props.update(s.extra)
        return props

    def _java_argv(self, main: str, *args: str) -> list[str]:
        argv = [
            _java(),
            f"-Xms{self.settings.heap_mb}m",
            f"-Xmx{self.settings.heap_mb}m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG_CONFIG}",
            "-cp",
            str(self.jars / "*"),
            main,
            *args,
        ]
        if self.settings.cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", self.settings.cpus, *argv]
        return argv

    def _format(self, config: Path) -> None:
        done = subprocess.run(
            self._java_argv("kafka.tools.StorageTool", "format", f"--cluster-id={kafka_uuid()}",
                            "--config", str(config), "--feature", "share.version=1"),
            capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            raise PeerUnavailable(
                "kafka peer: formatting the broker's log directory failed: "
                + _first_error(done.stderr or done.stdout)
            )
        self.formatted = True

    def start(self, timeout: float = START_TIMEOUT_S) -> float:
        """Format (the first time), start, and wait until ApiVersions lists apiKeys
        83-87; the seconds from launching the JVM to that answer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if not self.formatted:
            self._format(config)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java_argv("kafka.Kafka", str(config)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        started = time.monotonic()
        self.api_versions = self._wait_for_share_apis(started + timeout)
        return time.monotonic() - started

    def _wait_for_share_apis(self, deadline: float) -> dict[int, tuple[int, int]]:
        """Poll ApiVersions: the broker answers it before its metadata says that share
        groups are on, and lists apiKeys 83-87 only from then."""
        assert self.process is not None
        versions: dict[int, tuple[int, int]] = {}
        while True:
            if self.process.poll() is not None:
                raise PeerUnavailable(
                    f"kafka peer: the broker exited with {self.process.returncode} while "
                    f"starting: {self.last_log_line()}"
                )
            with contextlib.suppress(OSError):
                versions = api_versions(self.host, self.port)
                if all(key in versions for key in SHARE_STATE_APIS):
                    return versions
            if time.monotonic() > deadline:
                self.stop()
                missing = [key for key in SHARE_STATE_APIS if key not in versions]
                what = (
                    f"answers ApiVersions without apiKeys {missing}"
                    if versions
                    else "gave no ApiVersions answer"
                )
                raise PeerUnavailable(
                    f"kafka peer: the broker on {self.host}:{self.port} {what} in time; "
                    f"its log: {self.log_path}"
                )
            time.sleep(0.1)

    def last_log_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").splitlines()
            for line in reversed(lines):
                if " ERROR " in line or "Exception" in line:
                    return line.strip()[:400]
            if lines:
                return lines[-1].strip()[:400]
        return "(no log)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """SIGTERM and wait; True if it exited by itself within ``timeout``, False if it
        had to be killed."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return True
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return False

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_broker(
    settings: BrokerSettings | None = None, workdir: Path | None = None
) -> Iterator[Broker]:
    """A broker in a temporary directory (or ``workdir``), stopped and removed after."""
    jars = fetch()
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kafka-peer-")))
        with Broker(jars, workdir, settings) as broker:
            yield broker


# --- ApiVersions v0, by hand: the one request the launcher itself needs -------------------

_HEADER = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_CLIENT_ID = b"kafka-peer"


def api_versions(host: str, port: int, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """apiKey -> (min, max version) from ApiVersions v0; {} if the answer is an error."""
    request = _HEADER.pack(18, 0, 1, len(_CLIENT_ID)) + _CLIENT_ID
    with socket.create_connection((host, port), timeout) as sock:
        sock.sendall(len(request).to_bytes(4, "big") + request)
        size = int.from_bytes(_read_exactly(sock, 4), "big")
        data = _read_exactly(sock, size)
    # correlation_id int32, error_code int16, api_keys: int32 count of (int16 x3)
    _, error_code, count = struct.unpack_from(">ihi", data, 0)
    if error_code != 0:
        return {}
    entries = struct.iter_unpack(">hhh", data[10 : 10 + 6 * count])
    return {key: (low, high) for key, low, high in entries}


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)
