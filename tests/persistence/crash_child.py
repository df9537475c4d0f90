"""The process the crash tests kill: appends random records with group commit as fast
as it can and reports each one once it is durable.

    python crash_child.py DATA_DIR NUM_PARTITIONS SEGMENT_BYTES SEED

Prints `ready` once the log is open (recovery done), then one line per acknowledged
record: `<partition> <offset> <digest>`, written only after wait_durable resolved,
after `appended <partition> <offset> <digest>` when it is appended. After every
successful fsync or fdatasync of a segment it prints `synced <path> <size>`: what a
power loss could not take, which the parent uses to emulate one.

Environment (test_crash_steps.py): SHARECOORD_KILL_AT="<call>:<path part>:<nth>:<when>"
makes the process SIGKILL itself at the nth call of that FileOps method on a path
containing the part, before or after the call happens (it says so on stderr first);
SHARECOORD_RECOVER_ONLY=1 stops after recovery; SHARECOORD_JOURNAL_SEGMENT_BYTES and
SHARECOORD_CHECKPOINT_BYTES shrink the journal's segments and checkpoint cadence;
SHARECOORD_THREAD_FLUSH=1 keeps the journal's flushes in the commit thread (else the
kernel's, persistence/kernel_flush.py, go through flushed(): killed at and reported as
fdatasync).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from persistence import FileOps, GroupCommitter, StateLog

PRODUCERS = 16
T = TypeVar("T")


def record_digest(record_type: int, timestamp: int, key: bytes, value: bytes | None) -> str:
    """Identifies a record's content byte for byte."""
    h = hashlib.sha256()
    h.update(bytes([record_type]) + timestamp.to_bytes(8, "big", signed=True))
    h.update(len(key).to_bytes(4, "big") + key)
    h.update(b"\xff" * 4 if value is None else len(value).to_bytes(4, "big") + value)
    return h.hexdigest()


def say(line: str) -> None:
    """One write(2) per line: atomic on the pipe, whichever thread says it."""
    os.write(sys.stdout.fileno(), line.encode() + b"\n")


class ReportingFileOps(FileOps):
    def __init__(self) -> None:
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()
        self._kill_at: tuple[str, str, int, str] | None = None
        spec = os.environ.get("SHARECOORD_KILL_AT")
        if spec:
            call, part, nth, when = spec.split(":")
            self._kill_at = (call, part, int(nth), when)
        self._seen = 0

    def _maybe_die(self, call: str, path: str, when: str) -> None:
        kill = self._kill_at
        if kill is None or kill[0] != call or kill[1] not in path or kill[3] != when:
            return
        with self._lock:
            self._seen += 1
            due = self._seen == kill[2]
        if due:
            os.write(sys.stderr.fileno(), f"killed at {call} {path} {when}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)

    def _hooked(self, call: str, path: str, run: Callable[[], T]) -> T:
        self._maybe_die(call, path, "before")
        result = run()
        self._maybe_die(call, path, "after")
        return result

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return self._hooked("write", self._path(fd), lambda: FileOps.write(self, fd, data))

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return self._hooked(
            "pwrite", self._path(fd), lambda: FileOps.pwrite(self, fd, data, offset)
        )

    def truncate(self, fd: int, length: int) -> None:
        self._hooked("truncate", self._path(fd), lambda: FileOps.truncate(self, fd, length))

    def fsync_dir(self, path: str) -> None:
        self._hooked("fsync_dir", path.rstrip("/") + "/", lambda: FileOps.fsync_dir(self, path))

    def rename(self, src: str, dst: str) -> None:
        self._hooked("rename", src, lambda: FileOps.rename(self, src, dst))

    def unlink(self, path: str) -> None:
        self._hooked("unlink", path, lambda: FileOps.unlink(self, path))

    def dup(self, fd: int) -> int:
        copy = super().dup(fd)
        with self._lock:
            self._paths[copy] = self._paths.get(fd, "")
        return copy

    def _path(self, fd: int) -> str:
        with self._lock:
            return self._paths.get(fd, "")

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        with self._lock:
            self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def fsync(self, fd: int) -> None:
        self._hooked("fsync", self._path(fd), lambda: FileOps.fsync(self, fd))
        self._report(fd)

    def fdatasync(self, fd: int) -> None:
        self._hooked("fdatasync", self._path(fd), lambda: FileOps.fdatasync(self, fd))
        self._report(fd)

    def allows_kernel_flush(self) -> bool:
        # The journal's flushes by the kernel come through flushed(): killed at, and
        # reported, as fdatasync is.
        return os.environ.get("SHARECOORD_THREAD_FLUSH") != "1"

    def flushed(self, fd: int) -> None:
        self._hooked("fdatasync", self._path(fd), lambda: None)
        self._report(fd)

    def _report(self, fd: int) -> None:
        with self._lock:
            path = self._paths.get(fd, "")
        if path.endswith(".log"):
            say(f"synced {path} {os.fstat(fd).st_size}")


async def produce(log: StateLog, committer: GroupCommitter, rng: random.Random) -> None:
    while True:
        if rng.random() < 0.5:
            # Wake at odd moments, so appends also arrive while a cycle is in flight.
            await asyncio.sleep(rng.random() / 1000)  # a pace, not a wait
        partition = rng.randrange(log.num_partitions)
        record_type = rng.randrange(2)
        timestamp = rng.randrange(2**41)
        key = rng.randbytes(rng.randint(1, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 300))
        offset = log.partition(partition).append(record_type, key, value, timestamp)
        digest = record_digest(record_type, timestamp, key, value)
        say(f"appended {partition} {offset} {digest}")
        await committer.wait_durable(partition, offset)
        say(f"{partition} {offset} {digest}")


async def main(data_dir: str, num_partitions: int, segment_bytes: int, seed: int) -> None:
    fs = ReportingFileOps()
    journal_segment_bytes = os.environ.get("SHARECOORD_JOURNAL_SEGMENT_BYTES")
    log = StateLog.open(
        data_dir,
        num_partitions,
        segment_bytes=segment_bytes,
        fs=fs,
        **({"journal_segment_bytes": int(journal_segment_bytes)} if journal_segment_bytes else {}),
    )
    for part in log.partitions:
        part.open()
    if os.environ.get("SHARECOORD_RECOVER_ONLY"):
        return  # recovery was the point (and no checkpoint at close: no close at all)
    say("ready")
    checkpoint_bytes = os.environ.get("SHARECOORD_CHECKPOINT_BYTES")
    committer = GroupCommitter(
        log, **({"checkpoint_bytes": int(checkpoint_bytes)} if checkpoint_bytes else {})
    )
    committer.start()
    await asyncio.gather(
        *(produce(log, committer, random.Random(seed * 1000 + i)) for i in range(PRODUCERS))
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
