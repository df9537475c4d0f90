"""The file system calls the log makes, behind one object so tests can make them fail.

Every open, read, write, fsync, fdatasync, truncate, rename, unlink, mkdir and fsync of a
directory in persistence/ goes through a FileOps. The default is the real os call.
FaultInjectingFileOps fails chosen calls with a chosen errno: armed in-process with
`fail(...)`, or from outside a running process through a JSON control file named by the
environment variable SHARECOORD_FAILPOINTS:

    {"faults": [{"op": "fsync", "errno": "EIO", "path_contains": "partitions/3/",
                 "times": 1, "after": 0, "short_write": false}]}

The file is re-read whenever its mtime or size changes (which replaces the rules and
their counters); a missing file means no faults.

Ops: open, read, write, fsync, fdatasync, fsync_dir, truncate, rename, unlink, mkdir
("write" covers pwrite too).
A rule for "fsync" matches every flush (fsync, fdatasync and fsync_dir); the others
match only themselves. `path_contains` is tested against the path given to the call (for
calls on a descriptor, the path it was opened with); directory paths end with "/" for
the test, so "partitions/3/" matches partition 3's directory and every file in it.
`after` lets that many matching calls through first; `times` is how many calls fail
(None: until cleared). A write fault with `short_write` writes half the bytes, then fails.
A rule with `"crash": true` (its errno may then be left out) is a crash point instead: the
matching call SIGKILLs the process before doing anything, so a test can stop a daemon
between two exact steps of a multi-step operation.

A write that fails leaves no file of its own behind: `write_file_atomically` removes its
temporary file and `create_file_durably` the file it created, so a full disk that refuses
them leaves no empty or partial file (and a retry does not pile them up).
"""

from __future__ import annotations

import errno as errno_module
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

OPS = frozenset(
    {
        "open",
        "read",
        "write",
        "fsync",
        "fdatasync",
        "fsync_dir",
        "truncate",
        "rename",
        "unlink",
        "mkdir",
    }
)
FAILPOINTS_ENV = "SHARECOORD_FAILPOINTS"
# The errors of a disk (or a quota) with no room left: what a retry once space returns
# cures, unlike an I/O error.
DISK_FULL_ERRNOS = frozenset({errno_module.ENOSPC, errno_module.EDQUOT})

_log = logging.getLogger("sharecoord.log")
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class FileOps:
    """Real file system calls. Methods raise OSError exactly as os does."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = self.write(fd, view)
            view = view[written:]

    def write_on_loop(self, fd: int, data: bytes | memoryview) -> None:
        """``write_all`` by the event loop: the one write it makes by design, a batch's
        frames into the page cache of a segment after the journal made them durable
        (PartitionLog.try_apply). A method of its own, in a module Python runs, so that
        the suite's blocking-call detector can allow this write and no other on the loop
        (it looks for a Python frame, which a compiled partition.py does not have)."""
        self.write_all(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = self.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def seek(self, fd: int, position: int) -> None:
        os.lseek(fd, position, os.SEEK_SET)

    def dup(self, fd: int) -> int:
        """A second descriptor of the same open file (to fsync it without holding the
        lock its writer takes)."""
        return os.dup(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        _fdatasync(fd)

    def allows_kernel_flush(self) -> bool:
        """Whether the journal's fdatasync may go to the kernel (kernel_flush.py)
        rather than through fdatasync() here. Plain files only: a subclass that
        fails or holds fdatasync (the tests') keeps it; one that only watches says
        yes, and hears of each such flush through flushed()."""
        return type(self) is FileOps

    def flushed(self, fd: int) -> None:
        """The kernel finished an fdatasync of ``fd`` (a journal segment) for the
        committer (allows_kernel_flush)."""

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def free_bytes(self, path: str) -> int:
        """Bytes free on the file system holding `path` (those reserved for root
        included: any growth means something was freed)."""
        stat = os.statvfs(path)
        return stat.f_bfree * stat.f_frsize


# Disk work beside the commit cycles (a checkpoint's partition syncs, the journal's next
# segment) goes in steps, each followed by a pause `spread` times as long as the step
# took, at most PACE_MAX_S: the disk serves the cycles' flushes between the steps instead
# of queueing them behind the whole of it.
PACE_MAX_S = 0.02
_pause = time.sleep  # the tests count the pauses here


def pace(began: float, spread: float) -> None:
    """The pause after a step of background disk work that began at ``began``
    (time.monotonic()); none with ``spread`` 0."""
    if spread > 0:
        _pause(min(spread * (time.monotonic() - began), PACE_MAX_S))


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or the quota) has no room left."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def read_file(fs: FileOps, path: str) -> bytes:
    fd = fs.open(path, os.O_RDONLY)
    try:
        parts = []
        while chunk := fs.read(fd, 1 << 20):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        fs.close(fd)


def write_file_atomically(fs: FileOps, path: str, content: bytes) -> None:
    """Write temp, fsync it, rename over `path`, fsync the directory."""
    temp = path + ".tmp"
    try:
        _write_and_fsync(fs, temp, os.O_TRUNC, content)  # a crash may have left one
        fs.rename(temp, path)
    except BaseException:
        _remove_quietly(fs, temp)
        raise
    fs.fsync_dir(os.path.dirname(path) or ".")


def keep_cut_bytes(fs: FileOps, path: str, position: int, data: bytes) -> str:
    """Keep bytes about to be cut from ``path`` at ``position`` in a file of their own,
    ``<path>.<position>.broken`` (``.<n>`` added before ``.broken`` if that exists),
    written and fsynced with its directory before the cut; returns its path."""
    stem, suffix = f"{path}.{position}", ".broken"
    kept, n = stem + suffix, 0
    while fs.exists(kept):
        n += 1
        kept = f"{stem}.{n}{suffix}"
    create_file_durably(fs, kept, data)
    return kept


def create_file_durably(fs: FileOps, path: str, content: bytes) -> None:
    """Create `path` (it must not exist) holding `content`, fsynced with its directory."""
    _write_and_fsync(fs, path, os.O_EXCL, content, remove_on_failure=True)
    fs.fsync_dir(os.path.dirname(path))


def _write_and_fsync(
    fs: FileOps, path: str, flags: int, content: bytes, *, remove_on_failure: bool = False
) -> None:
    """Open `path` for writing (created if missing; `flags` say what if it exists),
    write all of `content` and fsync it; with `remove_on_failure`, a failed write or
    fsync removes the file it opened (it created it: O_EXCL)."""
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | flags)
    try:
        fs.write_all(fd, content)
        fs.fsync(fd)
    except BaseException:
        fs.close(fd)
        if remove_on_failure:
            _remove_quietly(fs, path)
        raise
    fs.close(fd)


def _remove_quietly(fs: FileOps, path: str) -> None:
    """Remove a file a failed write left; the write's own error is the one to report."""
    try:
        fs.unlink(path)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            _log.warning("%s: left behind after a failed write (%s)", path, exc)


def unlink_if_exists(fs: FileOps, path: str) -> bool:
    try:
        fs.unlink(path)
    except FileNotFoundError:
        return False
    return True


@dataclass
class FaultRule:
    op: str
    errno: int
    path_contains: str | None = None
    times: int | None = 1
    after: int = 0
    short_write: bool = False
    crash: bool = False  # SIGKILL the process instead of failing the call

    def matches(self, op: str, path: str) -> bool:
        if self.op != op and not (self.op == "fsync" and op in ("fdatasync", "fsync_dir")):
            return False
        return self.path_contains is None or self.path_contains in path


class FaultInjectingFileOps(FileOps):
    """FileOps whose calls fail on demand (see the module docstring)."""

    def __init__(self, control_file: str | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._fd_paths: dict[int, str] = {}
        self._control_file = control_file
        self._control_stamp: tuple[int, int, int] | None = None

    @classmethod
    def from_env(cls) -> FaultInjectingFileOps:
        """Driven by the control file named in $SHARECOORD_FAILPOINTS."""
        return cls(control_file=os.environ[FAILPOINTS_ENV])

    def fail(
        self,
        op: str,
        error: int,
        *,
        path_contains: str | None = None,
        times: int | None = 1,
        after: int = 0,
        short_write: bool = False,
    ) -> None:
        """Arm a fault: the matching calls raise OSError(error)."""
        rule = FaultRule(op, error, path_contains, times, after, short_write)
        _check_rule(rule)
        with self._lock:
            self._rules.append(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    # -- the faulted calls -------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        self._maybe_fail("open", path)
        fd = super().open(path, flags, mode)
        with self._lock:
            self._fd_paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._fd_paths.pop(fd, None)
        super().close(fd)

    def dup(self, fd: int) -> int:
        copy = super().dup(fd)
        with self._lock:
            self._fd_paths[copy] = self._fd_paths.get(fd, f"<fd {fd}>")
        return copy

    def read(self, fd: int, size: int) -> bytes:
        self._maybe_fail("read", self.path_of(fd))
        return super().read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._maybe_fail("read", self.path_of(fd))
        return super().pread(fd, size, offset)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        rule = self._match("write", self.path_of(fd))
        if rule is not None:
            if rule.short_write and len(data) > 1:
                super().write(fd, data[: len(data) // 2])
            raise _oserror(rule.errno, self.path_of(fd))
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        rule = self._match("write", self.path_of(fd))
        if rule is not None:
            if rule.short_write and len(data) > 1:
                super().pwrite(fd, data[: len(data) // 2], offset)
            raise _oserror(rule.errno, self.path_of(fd))
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync", self.path_of(fd))
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync", self.path_of(fd))
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        self._maybe_fail("fsync_dir", path.rstrip("/") + "/")
        super().fsync_dir(path)

    def truncate(self, fd: int, length: int) -> None:
        self._maybe_fail("truncate", self.path_of(fd))
        super().truncate(fd, length)

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename", src)
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        self._maybe_fail("unlink", path)
        super().unlink(path)

    def mkdir(self, path: str) -> None:
        self._maybe_fail("mkdir", path.rstrip("/") + "/")
        super().mkdir(path)

    # -- matching ----------------------------------------------------------------------

    def path_of(self, fd: int) -> str:
        """The path `fd` was opened with (through this object)."""
        with self._lock:
            return self._fd_paths.get(fd, f"<fd {fd}>")

    def _maybe_fail(self, op: str, path: str) -> None:
        rule = self._match(op, path)
        if rule is not None:
            raise _oserror(rule.errno, path)

    def _match(self, op: str, path: str) -> FaultRule | None:
        rule = self._take(op, path)
        if rule is not None and rule.crash:
            _log.warning("crash point: %s %s", op, path)
            os.kill(os.getpid(), signal.SIGKILL)
        return rule

    def _take(self, op: str, path: str) -> FaultRule | None:
        self._reload_control_file()
        with self._lock:
            for rule in self._rules:
                if not rule.matches(op, path):
                    continue
                if rule.after > 0:
                    rule.after -= 1
                    continue
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                return rule
        return None

    def _reload_control_file(self) -> None:
        if self._control_file is None:
            return
        try:
            stat = os.stat(self._control_file)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp == self._control_stamp:
                return
            try:
                rules = [] if stamp is None else _read_control_file(self._control_file)
            except (OSError, ValueError, KeyError) as exc:
                # Caught mid-write, or a typo: keep the old rules, look again next call.
                _log.warning("ignoring unreadable failpoints file %s: %r", self._control_file, exc)
                return
            self._control_stamp = stamp
            self._rules = rules


def _read_control_file(path: str) -> list[FaultRule]:
    with open(path, encoding="utf-8") as control:
        document: Any = json.load(control)
    rules = []
    for entry in document.get("faults", []):
        crash = entry.get("crash", False)
        error = entry.get("errno", "EIO") if crash else entry["errno"]
        rule = FaultRule(
            op=entry["op"],
            errno=getattr(errno_module, error) if isinstance(error, str) else int(error),
            path_contains=entry.get("path_contains"),
            times=entry.get("times", 1),
            after=entry.get("after", 0),
            short_write=entry.get("short_write", False),
            crash=crash,
        )
        _check_rule(rule)
        rules.append(rule)
    return rules


def _check_rule(rule: FaultRule) -> None:
    if rule.op not in OPS:
        raise ValueError(f"unknown op {rule.op!r}; expected one of {sorted(OPS)}")


def _oserror(error: int, path: str) -> OSError:
    return OSError(error, f"{os.strerror(error)} (injected)", path)
