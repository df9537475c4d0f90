"""A scratch view of the files: reads see what is on disk, writes stay in memory.

Recovery run on a ScratchFileOps does everything it does for real (it cuts a torn tail,
lays the journal's frames into a partition's files, finishes a compaction swap, creates
the first segment) and touches nothing on disk. So the records it then reads are those
the real recovery will leave: what a daemon whose disk is full serves reads from while
the real recovery waits for room (PartitionLog.read_recovered, docs/design.md#a-full-disk).
The same code decides both, so the reads never show a state the real recovery would
contradict.

Only what the log's recovery uses is modelled: regular files (open with O_CREAT,
O_EXCL, O_TRUNC, O_APPEND; read, write, pread, pwrite, truncate, dup, rename, unlink)
and the directories holding them (mkdir, listdir, exists). Flushes succeed and do
nothing. A file keeps the file on disk it started from and the ranges written since,
so cutting or extending a 100 MiB segment copies only what was written. Nothing here
is ever written back: the view is dropped once read.

Log lines of a run on scratch are dropped (``on_scratch``): "torn tail cut" or "caught
up with the journal" would be untrue, and the real recovery says them when it runs.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from persistence.fileops import FileOps

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


@dataclass
class _File:
    """A file of the view: the first ``source_size`` bytes of the file on disk at
    ``source`` (None: made here), then zeros up to ``size``, with ``patches`` (offset,
    bytes) written over them in order."""

    source: str | None
    source_size: int
    size: int
    patches: list[tuple[int, bytearray]] = field(default_factory=list)

    def read(self, below: FileOps, position: int, count: int) -> bytes:
        end = min(position + count, self.size)
        if position >= end:
            return b""
        out = bytearray(end - position)
        from_source = min(end, self.source_size) - position
        if from_source > 0 and self.source is not None:
            read = _pread_file(below, self.source, from_source, position)
            out[: len(read)] = read
        for at, data in self.patches:
            start, stop = max(at, position), min(at + len(data), end)
            if start < stop:
                out[start - position : stop - position] = data[start - at : stop - at]
        return bytes(out)

    def write(self, data: bytes | memoryview, position: int) -> None:
        if self.patches:
            at, last = self.patches[-1]
            if at + len(last) == position:  # an append after the last write: one patch
                last += data
                self.size = max(self.size, position + len(data))
                return
        self.patches.append((position, bytearray(data)))
        self.size = max(self.size, position + len(data))

    def truncate(self, length: int) -> None:
        self.source_size = min(self.source_size, length)
        kept = []
        for at, data in self.patches:
            if at < length:
                kept.append((at, data[: length - at]))
        self.patches = kept
        self.size = length


@dataclass
class _Handle:
    file: _File
    position: int = 0
    append: bool = False


class ScratchFileOps(FileOps):
    """FileOps over `below` whose changes stay in memory (module docstring)."""

    def __init__(self, below: FileOps) -> None:
        self._below = below
        self._files: dict[str, _File] = {}  # opened, made, written or renamed here
        self._removed: set[str] = set()  # unlinked (or renamed away) here
        self._dirs: set[str] = set()  # made here
        self._handles: dict[int, _Handle] = {}
        # Descriptors no real file has (negative), so a mix-up fails loudly.
        self._next_fd = itertools.count(-2, -1)

    # -- names ---------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        if path in self._files or path in self._dirs:
            return True
        if path in self._removed:
            return False
        return self._below.exists(path)

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(path)
        if not self.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        names = set() if path in self._dirs else set(self._below.listdir(path))
        names = {n for n in names if os.path.join(path, n) not in self._removed}
        for made in itertools.chain(self._files, self._dirs):
            parent, name = os.path.split(made)
            if parent == path:
                names.add(name)
        return sorted(names)

    def mkdir(self, path: str) -> None:
        path = os.path.normpath(path)
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        self._require_parent(path)
        self._dirs.add(path)
        self._removed.discard(path)

    def unlink(self, path: str) -> None:
        path = os.path.normpath(path)
        if not self.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        self._files.pop(path, None)
        self._removed.add(path)

    def rename(self, src: str, dst: str) -> None:
        src, dst = os.path.normpath(src), os.path.normpath(dst)
        moved = self._file(src)
        self._files.pop(src, None)
        self._removed.add(src)
        self._files[dst] = moved
        self._removed.discard(dst)

    def fsync_dir(self, path: str) -> None:
        if not self.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)

    def free_bytes(self, path: str) -> int:
        return self._below.free_bytes(path)

    # -- descriptors -----------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        path = os.path.normpath(path)
        if self.exists(path):
            if flags & os.O_CREAT and flags & os.O_EXCL:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            opened = self._file(path)
            if flags & os.O_TRUNC and flags & _WRITE_FLAGS:
                opened.truncate(0)
        elif flags & os.O_CREAT:
            self._require_parent(path)
            opened = self._files[path] = _File(None, 0, 0)
            self._removed.discard(path)
        else:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        fd = next(self._next_fd)
        self._handles[fd] = _Handle(opened, append=bool(flags & os.O_APPEND))
        return fd

    def close(self, fd: int) -> None:
        self._handle(fd)
        del self._handles[fd]

    def dup(self, fd: int) -> int:
        copy = next(self._next_fd)
        self._handles[copy] = self._handle(fd)  # as dup(2): one position for both
        return copy

    def read(self, fd: int, size: int) -> bytes:
        handle = self._handle(fd)
        data = handle.file.read(self._below, handle.position, size)
        handle.position += len(data)
        return data

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self._handle(fd).file.read(self._below, offset, size)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        handle = self._handle(fd)
        if handle.append:
            handle.position = handle.file.size
        handle.file.write(data, handle.position)
        handle.position += len(data)
        return len(data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self._handle(fd).file.write(data, offset)
        return len(data)

    def seek(self, fd: int, position: int) -> None:
        self._handle(fd).position = position

    def truncate(self, fd: int, length: int) -> None:
        self._handle(fd).file.truncate(length)

    def size(self, fd: int) -> int:
        return self._handle(fd).file.size

    def fsync(self, fd: int) -> None:
        self._handle(fd)

    def fdatasync(self, fd: int) -> None:
        self._handle(fd)

    # -- inside ----------------------------------------------------------------------------

    def _handle(self, fd: int) -> _Handle:
        try:
            return self._handles[fd]
        except KeyError:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF)) from None

    def _file(self, path: str) -> _File:
        """The view's file at `path` (which exists), taken from the disk the first time."""
        found = self._files.get(path)
        if found is None:
            fd = self._below.open(path, os.O_RDONLY)
            try:
                size = self._below.size(fd)
            finally:
                self._below.close(fd)
            found = self._files[path] = _File(path, size, size)
        return found

    def _require_parent(self, path: str) -> None:
        parent = os.path.dirname(path) or "."
        if not self.exists(parent):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def _pread_file(below: FileOps, path: str, count: int, position: int) -> bytes:
    fd = below.open(path, os.O_RDONLY)
    try:
        parts = []
        while count > 0:
            chunk = below.pread(fd, count, position)
            if not chunk:
                break  # shorter on disk than when the view took it: zeros, as a hole
            parts.append(chunk)
            count -= len(chunk)
            position += len(chunk)
        return b"".join(parts)
    finally:
        below.close(fd)


# --- quiet while on scratch -----------------------------------------------------------

_scratch_run = threading.local()


class _DropOnScratch(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_scratch_run, "active", False)


logging.getLogger("sharecoord.log").addFilter(_DropOnScratch())


@contextlib.contextmanager
def on_scratch() -> Iterator[None]:
    """Drop the log's lines (logger ``sharecoord.log``) this thread emits meanwhile:
    a recovery on scratch would report cuts and catch-ups that did not happen."""
    before = getattr(_scratch_run, "active", False)
    _scratch_run.active = True
    try:
        yield
    finally:
        _scratch_run.active = before
