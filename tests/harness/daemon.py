"""Real ``sharecoord`` processes: the daemon (``serve``) and the other commands.

A ``DaemonConfig`` says how to start one daemon: its data directory, where it listens
(HTTP and the Kafka listener), how many state partitions, a bearer token, any other
setting as ``serve`` flags, and its environment. ``Daemon(config).start()`` runs
``sharecoord serve`` (``SHARECOORD``: this interpreter and the module of the script) in
a child process (the repository root on ``PYTHONPATH``, so it works in a plain checkout
and in an editable install alike), reads its "listening" line (text or JSON), and waits
with ``wait_until_blocking`` until /readyz answers 200. ``terminate`` (SIGTERM), ``kill``
(SIGKILL) and ``wait`` give its exit code; its stderr goes to a file (``stderr_text``:
every run of it), every stdout line of its current run to ``stdout_lines``. A daemon
started again after it stopped listens on the same port, so its clients find it where
they left it.

Everything here blocks (fork, pipe reads, waits): async tests call it through
``asyncio.to_thread``, or use the ``spawn`` fixture (tests/harness/fixtures.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.wait import WAIT_TIMEOUT_S, wait_until_blocking

REPO_ROOT = Path(__file__).resolve().parents[2]
# How every test runs a sharecoord command: this interpreter and the module the
# `sharecoord` script of pyproject.toml runs (the one place that names it).
SHARECOORD = (sys.executable, "-m", "server.commands.cli")

# A safety net against a hung test, never a timing assertion.
STOP_TIMEOUT_S = 120.0

CLASS_CACHE_ENV = "SHARECOORD_SPARK_CLASS_CACHE"
_TEXT_LISTENING = re.compile(r"^sharecoord listening on (https?)://(\S+):(\d+)$")


# --- commands -----------------------------------------------------------------------------


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon or CLI child: ours, minus any SHARECOORD_ setting that
    would leak into it, plus the repository root on PYTHONPATH. Its Spark jobs keep no
    class archive (as tests/conftest.py says for the suite): none in the user's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARECOORD_")}
    env[CLASS_CACHE_ENV] = "off"
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env.update(extra or {})
    return env


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``sharecoord ARGS`` in a child process, to its end (blocking)."""
    return subprocess.run(
        [*SHARECOORD, *args],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO_ROOT,
    )


# --- ports and cluster files ----------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1 (held together so they differ), for cluster
    files and listeners that must name a port before the daemon starts."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def cluster_file(path: Path, ports: Sequence[int], ranges: Sequence[str], partitions: int) -> Path:
    """A cluster file (docs/api.md): node i at 127.0.0.1:ports[i] owning ranges[i]."""
    text = f"num_partitions = {partitions}\n"
    for node_id, (port, owned) in enumerate(zip(ports, ranges, strict=True)):
        text += (
            f'[[node]]\nid = {node_id}\nhost = "127.0.0.1"\nport = {port}\n'
            f'partitions = ["{owned}"]\n'
        )
    path.write_text(text)
    return path


# --- the daemon ---------------------------------------------------------------------------


@dataclass
class DaemonConfig:
    """One ``sharecoord serve``: each field is a flag or the environment."""

    data_dir: Path
    flags: Sequence[str] = ()  # any other setting, as serve flags
    listen: str = "127.0.0.1:0"  # port 0: one is picked, and kept for restarts
    # 8 state partitions load fast; None leaves the daemon's default (50).
    partitions: int | None = 8
    kafka_listener: str | None = None  # "HOST:PORT" for the Kafka listener
    token: str | None = None  # the bearer token, put in a file of its own
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path | None = None  # stderr and the token file; the data dir's parent unless told
    # How the harness reaches /readyz of a TLS daemon (a context trusting its CA, with a
    # client certificate for mutual TLS).
    probe_ssl: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.log_dir = Path(self.log_dir) if self.log_dir is not None else self.data_dir.parent

    def args(self, listen: str, token_file: Path | None) -> list[str]:
        args = [*SHARECOORD, "serve", "--data-dir", str(self.data_dir), "--listen", listen]
        if self.partitions is not None:
            args += ["--partitions", str(self.partitions)]
        if self.kafka_listener is not None:
            args += ["--kafka-listener", self.kafka_listener]
        if token_file is not None:
            args += ["--auth-token-file", str(token_file)]
        return [*args, *self.flags]


class DaemonExited(Exception):
    """The daemon ended (or never said it listens) before it was ready."""

    def __init__(self, code: int | None, stderr: str, stdout: list[str]) -> None:
        self.code = code
        self.stderr = stderr
        self.stdout = stdout
        what = "did not start in time" if code is None else f"exited with {code}"
        super().__init__(f"sharecoord serve {what}; stderr:\n{stderr}")


class Daemon:
    """One ``sharecoord serve`` child process, started and restarted from its config."""

    def __init__(self, config: DaemonConfig) -> None:
        # No file is touched here (a daemon may be made on an event loop): at start.
        self.config = config
        self._stderr_path: Path | None = None
        self.token_file: Path | None = None
        self._listen = config.listen
        self.scheme, self.host, self.port = "http", "", 0
        self.stdout_lines: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._listening = threading.Event()  # the line was read, or stdout ended
        self._heard = False  # the line was read

    @property
    def stderr_path(self) -> Path:
        assert self._stderr_path is not None, "the daemon was never started"
        return self._stderr_path

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    @property
    def process(self) -> subprocess.Popen[str]:
        assert self._process is not None, "the daemon was never started"
        return self._process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # --- starting ---------------------------------------------------------------------

    def start(self, *, ready: bool = True, signal_when_listening: int | None = None) -> Daemon:
        """Start the process and return once it says it listens and (``ready``) /readyz
        answers 200. Raises ``DaemonExited`` (with its stderr) if it ends first.
        ``signal_when_listening`` is sent the moment the "listening" line is read, by
        the thread reading it, with nothing in between."""
        assert not self.running(), "the daemon runs already"
        if self._process is not None:
            self.wait()  # the last run, ended by a signal or by itself: reaped, pipe closed
        if self._stderr_path is None:
            self._first_start()
        self._listening.clear()
        self._heard = False
        self.stdout_lines = []
        with open(self.stderr_path, "a") as stderr:
            self._process = subprocess.Popen(
                self.config.args(self._listen, self.token_file),
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=child_env(self.config.env),
                text=True,
                cwd=REPO_ROOT,
            )
        self._reader = threading.Thread(
            target=self._read_stdout, args=(self._process, signal_when_listening), daemon=True
        )
        self._reader.start()
        if not self._listening.wait(WAIT_TIMEOUT_S):
            self._process.kill()
            self.wait()
            raise DaemonExited(None, self.stderr_text(), list(self.stdout_lines))
        if not self._heard:
            raise DaemonExited(self.wait(), self.stderr_text(), list(self.stdout_lines))
        # Started again, it listens where it did (a wildcard host stays a wildcard).
        self._listen = f"{self.config.listen.rpartition(':')[0]}:{self.port}"
        if ready:
            self.wait_ready()
        return self

    def _first_start(self) -> None:
        """Its log directory, stderr file and token file."""
        log_dir = self.config.log_dir
        assert log_dir is not None
        log_dir.mkdir(parents=True, exist_ok=True)
        self._stderr_path = _free_path(log_dir, "daemon", ".stderr")
        if self.config.token is not None:
            self.token_file = _free_path(log_dir, "token", "")
            self.token_file.write_text(self.config.token + "\n")
            self.token_file.chmod(0o600)

    def _read_stdout(self, process: subprocess.Popen[str], signum: int | None) -> None:
        assert process.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed under us by wait()
            for raw in process.stdout:
                line = raw.rstrip("\n")
                self.stdout_lines.append(line)
                if not self._heard and self._take_listening(line):
                    if signum is not None:
                        process.send_signal(signum)
                    self._heard = True
                    self._listening.set()
        self._listening.set()  # the process ended without the line

    def _take_listening(self, line: str) -> bool:
        """Whether ``line`` is the "listening" line; if so, where."""
        match = _TEXT_LISTENING.match(line)
        if match:
            self.scheme, self.host, self.port = match[1], match[2], int(match[3])
            return True
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("msg") == "listening":
                    self.scheme = str(record["url"]).partition(":")[0]
                    self.host, self.port = str(record["host"]), int(record["port"])
                    return True
        return False

    def readyz(self) -> int | None:
        """/readyz's status, or None if nothing answers (yet). Raises ``DaemonExited``
        once the process is gone."""
        if self.process.poll() is not None:
            raise DaemonExited(self.wait(), self.stderr_text(), list(self.stdout_lines))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=self.config.probe_ssl),
        )
        try:
            with opener.open(f"{self.url}/readyz", timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self) -> None:
        """Until /readyz answers 200: every state partition this node owns is loaded."""
        wait_until_blocking(
            self.readyz, f"the daemon at {self.url} to be ready", until=lambda s: s == 200
        )

    # --- stopping -----------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """The exit code; raises TimeoutExpired if the process still runs after
        ``timeout`` (the ``daemons`` fixture kills it then)."""
        code = self.process.wait(timeout)
        # Only now: the reader holds the pipe until the process exits.
        if self._reader is not None:
            self._reader.join(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def terminate(self) -> int:
        """SIGTERM, then the exit code."""
        if self.running():
            self.signal(signal.SIGTERM)
        return self.wait()

    def kill(self) -> int:
        """SIGKILL: no chance to flush or close anything; then the exit code."""
        if self.running():
            self.process.kill()
        return self.wait()

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it does not end in time (fixtures' teardown)."""
        if self._process is None:
            return
        try:
            self.terminate()
        except subprocess.TimeoutExpired:
            self.kill()

    # --- what it said -------------------------------------------------------------------

    def stderr_text(self) -> str:
        """Everything it wrote on stderr (every start of this daemon)."""
        return self.stderr_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])


def _free_path(directory: Path, stem: str, suffix: str) -> Path:
    n = 0
    while (path := directory / f"{stem}-{n}{suffix}").exists():
        n += 1
    path.touch()
    return path
