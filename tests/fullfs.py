"""A really full file system for tests: a small tmpfs, filled to ENOSPC by a filler file.

``full_filesystem(directory, size)`` mounts a tmpfs of ``size`` bytes for the test and
yields a ``FullFilesystem``: put a data directory under ``.path``, ``fill()`` it until
the kernel says ENOSPC, ``free()`` the filler to give the space back. Nothing here is
injected: every write of the daemon meets the real file system's refusal. The fixture
``full_disk`` is one of FULL_DISK_BYTES for the test (its mount and unmount happen
outside the test's event loop; an async test calls ``fill`` and ``free`` in a thread).

As root the tmpfs is mounted at ``directory`` and unmounted afterwards. Otherwise it is
mounted inside a user and mount namespace of its own (``unshare -rm``) held open by a
child process, and reached through ``/proc/<child>/root``: daemons and tests in this
namespace use that path like any other. If neither works the test fails with one line
saying why (never a skip: the feature would go untested).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FILLER = "filler"
FULL_DISK_BYTES = 8 * 1024 * 1024
_CHUNK = b"\0" * (1 << 16)
_HOLD = "mount -t tmpfs -o size={size} tmpfs {directory} && echo mounted && exec sleep 1000000"


@dataclass
class FullFilesystem:
    path: Path  # the tmpfs's root, as this process (and its children) reach it
    size: int

    @property
    def filler(self) -> Path:
        return self.path / FILLER

    def fill(self) -> int:
        """Write the filler until the file system refuses (ENOSPC); returns the bytes it
        took. Call it again to take what was freed since."""
        taken = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = _CHUNK
            while True:
                try:
                    taken += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return taken
                    chunk = chunk[: len(chunk) // 16 or 1]  # the last pages, to the byte
        finally:
            os.close(fd)

    def free(self) -> None:
        """Give the filler's space back."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.filler)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bfree * stat.f_frsize


@contextlib.contextmanager
def full_filesystem(directory: Path, size: int) -> Iterator[FullFilesystem]:
    """A tmpfs of `size` bytes for this test (module docstring). `directory` must exist
    and be empty; it is the mount point."""
    tried = []
    if os.geteuid() == 0:
        mount = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory))
        if mount is None:
            try:
                yield FullFilesystem(directory, size)
            finally:
                # Lazily if a daemon still holds it: the test's own cleanup kills those.
                if _run("umount", str(directory)) is not None:
                    _run("umount", "-l", str(directory))
            return
        tried.append(f"mount -t tmpfs as root: {mount}")
    holder, why = _in_a_namespace(directory, size)
    if holder is None:
        tried.append(f"unshare -rm: {why}")
        pytest.fail(
            "cannot make a full file system for this test (" + "; ".join(tried) + ")",
            pytrace=False,
        )
    try:
        yield FullFilesystem(Path(f"/proc/{holder.pid}/root{directory.resolve()}"), size)
    finally:
        holder.kill()
        holder.communicate()  # waits, and closes its pipes


def _run(*command: str) -> str | None:
    """None if `command` succeeded, else why not (one line)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    return (done.stderr.strip() or f"exit code {done.returncode}").splitlines()[-1]


def _in_a_namespace(directory: Path, size: int) -> tuple[subprocess.Popen[str] | None, str]:
    """A child holding a tmpfs mounted at `directory` in a user and mount namespace of
    its own, or None and why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "the unshare command is not installed"
    script = _HOLD.format(size=size, directory=directory.resolve())
    holder = subprocess.Popen(
        [unshare, "-rm", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() == "mounted":
        return holder, ""
    holder.kill()
    _, stderr = holder.communicate()
    return None, (stderr.strip() or f"exit code {holder.returncode}").splitlines()[-1]


def listing(data_dir: Path) -> dict[str, int]:
    """Every file under a data directory, with its size."""
    found = {}
    for directory, _, files in os.walk(data_dir):
        for name in files:
            path = Path(directory, name)
            found[str(path.relative_to(data_dir))] = path.stat().st_size
    return found


def no_temporary_files(files: dict[str, int]) -> None:
    """What a full disk must not leave: a temporary file, or an empty .broken one."""
    assert not [f for f in files if f.endswith(".tmp")], files
    assert not [f for f, size in files.items() if size == 0 and f.endswith(".broken")], files


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[FullFilesystem]:
    """A tmpfs of FULL_DISK_BYTES for this test, empty (not filled yet)."""
    mount = tmp_path / "full-disk"
    mount.mkdir()
    with full_filesystem(mount, FULL_DISK_BYTES) as disk:
        yield disk
