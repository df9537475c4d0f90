"""Real PostgreSQL servers for the tests: initdb and pg_ctl in a temporary directory.

``find_bin_dir`` looks for initdb on PATH, then in Debian's versioned directories
(/usr/lib/postgresql/<version>/bin, the newest first). With none found, the tests that
need a server fail with one line saying how to install it (``.ci/run`` installs Debian's
``postgresql`` package when initdb is absent): they never skip.

Run as root, every server command runs as the ``postgres`` user (``runuser -u postgres
--``; initdb refuses root), and the server's directory is made theirs. A server listens
on a free loopback port only (no Unix socket), trusts every local connection, and keeps
its log in its directory (``log_text`` shows it when a start fails).

``PostgresServer.standby`` makes a streaming standby of a primary with pg_basebackup -R;
``synchronous=True`` names it in the primary's ``synchronous_standby_names``, so a
commit on the primary returns only once the standby has its WAL; ``multi_host_uri``
names several servers, so that a client follows the one that accepts writes. ``kill`` sends a signal
to the postmaster (SIGKILL: a crash), ``freeze``/``thaw`` SIGSTOP/SIGCONT the postmaster
and every backend, ``promote`` ends a standby's recovery.

Everything here blocks: async tests call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.harness.wait import wait_until_blocking

# Safety nets against a hung test, never timing assertions.
START_TIMEOUT_S = 120
QUERY_TIMEOUT_S = 60
SERVER_USER = "postgres"


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bin_dir() -> str:
    """The directory of initdb, pg_ctl and pg_basebackup; PostgresMissing if none."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        return os.path.dirname(os.path.realpath(initdb))
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if found:
        newest = max(found, key=lambda path: int(path.split("/")[-3].split(".")[0]))
        return os.path.dirname(newest)
    raise PostgresMissing(
        "PostgreSQL is not installed (no initdb on PATH nor in /usr/lib/postgresql/*/bin): "
        "install Debian's `postgresql` package (apt-get install postgresql), as .ci/run does"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresMissing(
            f"running as root, the tests run PostgreSQL as the `{SERVER_USER}` user, and there "
            "is none: install Debian's `postgresql` package, which creates it"
        ) from None
    return ["runuser", "-u", SERVER_USER, "--"]


def _make_theirs(path: str) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


class PostgresServer:
    """One PostgreSQL server in a directory of its own (see the module docstring)."""

    def __init__(self, bin_dir: str, root: str, name: str, port: int) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.name = name
        self.port = port
        self.data_dir = os.path.join(root, name)
        self.log_path = os.path.join(root, f"{name}.log")

    def __repr__(self) -> str:
        return f"PostgresServer({self.name}, port {self.port})"

    # -- making and starting ---------------------------------------------------------

    @classmethod
    def primary(cls, root: str, name: str = "primary") -> PostgresServer:
        server = cls(find_bin_dir(), root, name, free_port())
        server._run(
            "initdb",
            "-D",
            server.data_dir,
            "-U",
            SERVER_USER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        server._configure()
        server.start()
        return server

    def standby(
        self, name: str = "standby", *, synchronous: bool = False, port: int | None = None
    ) -> PostgresServer:
        """A streaming standby of this (running) primary, started; with `synchronous`,
        the primary waits for it at every commit from now on. ``port``: where it listens
        (a dead primary's, so that a multi-host URI naming it reaches the new standby)."""
        standby = PostgresServer(self.bin_dir, self.root, name, port or free_port())
        standby._run(
            "pg_basebackup",
            "-D",
            standby.data_dir,
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            SERVER_USER,
            "-X",
            "stream",
            "-R",
            "--checkpoint=fast",
            "--no-sync",
        )
        standby._configure()
        standby.start()
        if synchronous:
            self.execute(f"ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'")
            self.execute("SELECT pg_reload_conf()")
            self.wait_for(
                f"SELECT 1 FROM pg_stat_replication WHERE application_name = '{name}' "
                "AND sync_state = 'sync'"
            )
        return standby

    def _configure(self) -> None:
        """Loopback only, no Unix socket; the cluster name is what a standby calls itself
        to its primary (synchronous_standby_names names it)."""
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": "''",
            "cluster_name": f"'{self.name}'",
            "max_connections": "60",
            "shared_buffers": "'32MB'",
            "logging_collector": "off",
        }
        with open(os.path.join(self.data_dir, "postgresql.auto.conf"), "a") as conf:
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self) -> None:
        try:
            self._run(
                "pg_ctl",
                "start",
                "-D",
                self.data_dir,
                "-l",
                self.log_path,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"{self!r} did not start:\n{self.log_text()}") from exc

    def stop(self, mode: str = "fast") -> None:
        self._run(
            "pg_ctl", "stop", "-D", self.data_dir, "-m", mode, "-w", "-t", str(START_TIMEOUT_S)
        )

    def promote(self) -> float:
        """End a standby's recovery; returns how long pg_ctl promote -w took."""
        started = time.monotonic()
        self._run("pg_ctl", "promote", "-D", self.data_dir, "-w", "-t", str(START_TIMEOUT_S))
        return time.monotonic() - started

    # -- signals ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The postmaster's PID while it runs (postmaster.pid), else None."""
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as pidfile:
                pid = int(pidfile.readline())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        pid = self.pid
        assert pid is not None, f"{self!r} is not running"
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            # Its backends notice the postmaster's death and exit; wait for them so the
            # port is free and nothing of it answers any more.
            wait_until_blocking(
                lambda: not _children(pid),
                f"the backends of {self!r} to exit",
                timeout=START_TIMEOUT_S,
            )

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every backend: a server that hangs."""
        pid = self.pid
        assert pid is not None, f"{self!r} is not running"
        for each in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)

    def thaw(self) -> None:
        pid = self.pid
        assert pid is not None, f"{self!r} is not running"
        for each in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGCONT)

    # -- talking to it ---------------------------------------------------------------

    def uri(self, dbname: str = "postgres", password: str | None = None) -> str:
        auth = SERVER_USER if password is None else f"{SERVER_USER}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def remove(self) -> None:
        """Destroy it and delete its data directory (a dead primary a standby replaced)."""
        self.destroy()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def execute(self, sql: str, dbname: str = "postgres") -> str:
        """Run one statement with psql (in ``dbname``); its output, unaligned, without
        headers."""
        result = subprocess.run(
            [
                os.path.join(self.bin_dir, "psql"),
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.uri(dbname),
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{self!r}: {sql!r} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def wait_for(self, sql: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll until `sql` returns a row (a safety net, not a timing assertion)."""
        wait_until_blocking(
            lambda: self.execute(sql), f"{self!r} to answer {sql}", timeout=timeout_s
        )

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return "(no server log)"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*_as_server_user(), os.path.join(self.bin_dir, program), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S * 2,
            cwd=self.root,
        )

    def destroy(self) -> None:
        """Stop it if it runs (immediately: nothing of it is kept), thawed first."""
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            for each in [pid, *_children(pid)]:
                os.kill(each, signal.SIGCONT)
        try:
            self.stop("immediate")
        except subprocess.SubprocessError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def multi_host_uri(*servers: PostgresServer, dbname: str = "postgres") -> str:
    """libpq's multi-host URI of ``servers``, in order, that connects to whichever of them
    accepts writes (a promoted standby once the primary died)."""
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return f"postgresql://{SERVER_USER}@{hosts}/{dbname}?target_session_attrs=read-write"


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is `pid` (a postmaster's backends and helpers)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


@contextlib.contextmanager
def server_root() -> Iterator[str]:
    """A directory the server user can own and enter (pytest's tmp_path is root's alone,
    mode 0700), removed afterwards."""
    root = tempfile.mkdtemp(prefix="sharecoord-pg-")
    try:
        _make_theirs(root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def running_servers() -> Iterator[list[PostgresServer]]:
    """A list to put servers in, each destroyed and its directory removed at the end."""
    servers: list[PostgresServer] = []
    try:
        yield servers
    finally:
        for server in servers:
            server.destroy()
