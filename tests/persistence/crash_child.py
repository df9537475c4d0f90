"""The process test_crash_sigkill.py kills: appends random records with group commit as
fast as it can and reports each one once it is durable.

    python crash_child.py DATA_DIR NUM_PARTITIONS SEGMENT_BYTES SEED

Prints `ready` once the log is open (recovery done), then one line per acknowledged
record: `<partition> <offset> <digest>`, written only after wait_durable resolved.
After every successful fsync or fdatasync of a segment it prints `synced <path> <size>`:
what a power loss could not take, which the parent uses to emulate one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
import threading

from persistence import FileOps, GroupCommitter, StateLog

PRODUCERS = 16


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
        super().fsync(fd)
        self._report(fd)

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
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
            await asyncio.sleep(rng.random() / 1000)
        partition = rng.randrange(log.num_partitions)
        record_type = rng.randrange(2)
        timestamp = rng.randrange(2**41)
        key = rng.randbytes(rng.randint(1, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 300))
        offset = log.partition(partition).append(record_type, key, value, timestamp)
        await committer.wait_durable(partition, offset)
        say(f"{partition} {offset} {record_digest(record_type, timestamp, key, value)}")


async def main(data_dir: str, num_partitions: int, segment_bytes: int, seed: int) -> None:
    fs = ReportingFileOps()
    log = StateLog.open(data_dir, num_partitions, segment_bytes=segment_bytes, fs=fs)
    for part in log.partitions:
        part.open()
    say("ready")
    committer = GroupCommitter(log)
    committer.start()
    await asyncio.gather(
        *(produce(log, committer, random.Random(seed * 1000 + i)) for i in range(PRODUCERS))
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
