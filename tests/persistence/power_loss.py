"""A simulated power cut: the directory as the disk would hold it, had the machine
lost power at some moment.

``PowerLossFileOps`` does every call for real, and remembers what each flush made
durable: a file's bytes as of its last fsync or fdatasync (by inode, so a rename does
not lose them), and a directory's entries as of its last fsync. ``materialize`` builds,
from such a record, the tree a power cut at that moment leaves: every entry its
directory's last fsync saw, each file holding what its last flush saw (nothing, if it
was never flushed). Writes that were never flushed, and names created, renamed or
removed since their directory's last fsync, are gone — the worst a filesystem may do.
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass, field

from persistence.fileops import FileOps

DIRECTORY = -1  # an entry that is a directory


@dataclass
class Durable:
    contents: dict[int, bytes] = field(default_factory=dict)  # inode -> bytes
    entries: dict[str, dict[str, int]] = field(default_factory=dict)  # dir -> name -> inode


class PowerLossFileOps(FileOps):
    def __init__(self, root: str) -> None:
        self._root = os.path.abspath(root)
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}
        self._durable = Durable()
        # What exists when the test begins is taken as on disk.
        for directory, _names, files in os.walk(self._root):
            self._remember_entries(directory)
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    self._durable.contents[os.stat(path).st_ino] = f.read()

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        with self._lock:
            self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def dup(self, fd: int) -> int:
        copy_fd = super().dup(fd)
        with self._lock:
            self._paths[copy_fd] = self._paths.get(fd, "")
        return copy_fd

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._remember_content(fd)

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self._remember_content(fd)

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        self._remember_entries(path)

    def _remember_content(self, fd: int) -> None:
        with self._lock:
            path = self._paths[fd]
        # Read through the path: the descriptor may be write-only.
        with open(path, "rb") as f:
            data = f.read()
            inode = os.fstat(f.fileno()).st_ino
        with self._lock:
            self._durable.contents[inode] = data

    def _remember_entries(self, directory: str) -> None:
        entries = {}
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            entries[name] = DIRECTORY if os.path.isdir(path) else stat.st_ino
        with self._lock:
            self._durable.entries[os.path.abspath(directory)] = entries

    def snapshot(self) -> Durable:
        """What a power cut now would leave (taken at once; build it later)."""
        with self._lock:
            return copy.deepcopy(self._durable)

    def materialize(self, durable: Durable, destination: str) -> None:
        """Build the tree of ``durable`` under ``destination`` (which must not exist)."""
        materialize(durable, self._root, destination)


def materialize(durable: Durable, root: str, destination: str) -> None:
    """The tree a power cut leaves, from what ``durable`` records of ``root``."""
    root = os.path.abspath(root)
    os.mkdir(destination)
    for name, inode in durable.entries.get(root, {}).items():
        source = os.path.join(root, name)
        target = os.path.join(destination, name)
        if inode == DIRECTORY:
            materialize(durable, source, target)
        else:
            with open(target, "wb") as f:
                f.write(durable.contents.get(inode, b""))
