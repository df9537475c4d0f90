"""Real sharecoord daemons for the client's tests: subprocesses of ``server.commands.cli serve``.

Starting, killing and restarting block (fork, pipe reads, waits), so the async tests
call them through ``asyncio.to_thread``; session fixtures call them directly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(rb"^sharecoord listening on (https?)://([^:]+):(\d+)\s*$")
# Guards against a hung test, never a timing assertion.
START_TIMEOUT_S = 60.0


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1 (held together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Daemon:
    """One ``sharecoord serve`` process. ``port`` 0 picks one at the first start and
    keeps it for restarts, so a restarted daemon is where its clients left it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        port: int = 0,
        probe_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env or {}
        self.port = port
        self.scheme = "http"
        self.log_path = data_dir.parent / f"{data_dir.name}-{id(self)}.log"
        # How /readyz is probed over TLS (a context trusting the daemon's CA).
        self._probe = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=probe_ssl)
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, *, wait_ready: bool = True) -> Daemon:
        command = [
            sys.executable,
            "-m",
            "server.commands.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            *self.args,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, env=env, cwd=REPO_ROOT
            )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            match = LISTENING.match(line)
            if match:
                self.scheme = match.group(1).decode()
                self.port = int(match.group(3))
                break
        else:
            self.proc.wait()
            raise RuntimeError(f"the daemon exited ({self.proc.returncode}):\n{self.log_tail()}")
        # Nothing more is expected on stdout; drain it so the daemon can never block.
        self._reader = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._reader.start()
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Until /readyz says every owned state partition is loaded."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.readyz() == 200:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon never became ready:\n{self.log_tail()}")
            time.sleep(0.01)

    def readyz(self) -> int:
        try:
            with self._probe.open(f"{self.url}/readyz", timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit; what was acknowledged is on disk."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            if self._reader is not None:
                self._reader.join()
            assert self.proc.stdout is not None
            self.proc.stdout.close()
        self.proc = None
        self._reader = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


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


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
