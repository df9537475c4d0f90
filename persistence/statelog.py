"""The data directory: DATA/meta, DATA/LOCK and one PartitionLog per state partition.

DATA/meta                       {"format": 1, "num_partitions": 50}, fixed at creation
DATA/LOCK                       flock()ed by the one process that may write DATA
DATA/partitions/<p>/            one state partition's segments (partition.py)
DATA/partitions/<p>/compaction/ staging of the compaction job (swap.py)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from typing import Any

from persistence.errors import LogLockedError, MetaMismatchError
from persistence.fileops import FileOps, read_file, write_file_atomically
from persistence.partition import DEFAULT_SEGMENT_BYTES, PartitionLog

META_FORMAT = 1
META_FILE = "meta"
LOCK_FILE = "LOCK"
PARTITIONS_DIR = "partitions"


def partition_dir(data_dir: str | os.PathLike[str], partition: int) -> str:
    return os.path.join(os.fspath(data_dir), PARTITIONS_DIR, str(partition))


def read_meta(data_dir: str | os.PathLike[str], fs: FileOps | None = None) -> dict[str, Any]:
    """DATA/meta, checked: raises MetaMismatchError if it is not a meta file we wrote."""
    path = os.path.join(os.fspath(data_dir), META_FILE)
    try:
        meta: Any = json.loads(read_file(fs or FileOps(), path))
    except FileNotFoundError:
        raise MetaMismatchError(
            f"{data_dir} is not a sharecoord data directory: {path} is missing"
        ) from None
    except ValueError as exc:
        raise MetaMismatchError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise MetaMismatchError(f"{path}: unknown format {meta!r}; expected format {META_FORMAT}")
    if not isinstance(meta.get("num_partitions"), int) or meta["num_partitions"] < 1:
        raise MetaMismatchError(f"{path}: num_partitions must be an int >= 1, got {meta!r}")
    return meta


class StateLog:
    """The log of every state partition in one data directory."""

    def __init__(
        self,
        data_dir: str,
        num_partitions: int,
        partitions: list[PartitionLog],
        fs: FileOps,
        lock_fd: int | None,
    ) -> None:
        self.data_dir = data_dir
        self.num_partitions = num_partitions
        self.fs = fs
        self._partitions = partitions
        self._lock_fd = lock_fd

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        num_partitions: int | None,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fs: FileOps | None = None,
        lock: bool = True,
    ) -> StateLog:
        """Open (creating if need be) a data directory for `num_partitions` partitions.

        With lock=True, takes DATA/LOCK (LogLockedError if another holder has it) and may
        write. With lock=False (read-only tools), writes nothing, and num_partitions may
        be None to take it from DATA/meta. Partitions are not recovered here: call
        partition(p).open() for each, so one damaged partition does not stop the rest."""
        data_dir = os.fspath(data_dir)
        fs = fs or FileOps()
        if num_partitions is not None and num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        lock_fd = None
        if lock:
            if not fs.exists(data_dir):
                fs.mkdir(data_dir)
                fs.fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
            lock_fd = _take_lock(fs, data_dir)
        try:
            num_partitions = _check_meta(fs, data_dir, num_partitions, create=lock)
        except BaseException:
            if lock_fd is not None:
                fs.close(lock_fd)
            raise
        partitions = [
            PartitionLog(
                p, partition_dir(data_dir, p), fs=fs, segment_bytes=segment_bytes, writable=lock
            )
            for p in range(num_partitions)
        ]
        return cls(data_dir, num_partitions, partitions, fs, lock_fd)

    def partition(self, partition: int) -> PartitionLog:
        if not 0 <= partition < self.num_partitions:
            raise IndexError(f"state partition {partition} not in [0, {self.num_partitions})")
        return self._partitions[partition]

    @property
    def partitions(self) -> list[PartitionLog]:
        return list(self._partitions)

    def close(self) -> None:
        """Close every partition and release DATA/LOCK."""
        for partition in self._partitions:
            partition.close()
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            self.fs.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> StateLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _take_lock(fs: FileOps, data_dir: str) -> int:
    fd = fs.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        fs.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LogLockedError(data_dir) from None
        raise
    # Who holds it, for a human looking; the flock is what counts.
    fs.truncate(fd, 0)
    fs.write_all(fd, f"{os.getpid()}\n".encode())
    return fd


def _check_meta(fs: FileOps, data_dir: str, num_partitions: int | None, *, create: bool) -> int:
    path = os.path.join(data_dir, META_FILE)
    if not fs.exists(path) and create:
        if num_partitions is None:
            raise ValueError(f"{data_dir} is new: num_partitions is required to create it")
        # Meta goes last: once it exists, every partition directory does, and a missing
        # one is damage (PartitionLog.open refuses it), never a fresh start.
        _make_partition_dirs(fs, data_dir, num_partitions)
        meta = {"format": META_FORMAT, "num_partitions": num_partitions}
        write_file_atomically(fs, path, json.dumps(meta).encode() + b"\n")
        return num_partitions
    found: int = read_meta(data_dir, fs)["num_partitions"]
    if num_partitions is not None and found != num_partitions:
        raise MetaMismatchError(
            f"{data_dir} was created with num_partitions={found} (recorded in {path}); "
            f"refusing to open it with num_partitions={num_partitions}: the number of state "
            "partitions is fixed for a data directory"
        )
    return found


def _make_partition_dirs(fs: FileOps, data_dir: str, num_partitions: int) -> None:
    root = os.path.join(data_dir, PARTITIONS_DIR)
    created = []
    if not fs.exists(root):
        fs.mkdir(root)
        created.append(data_dir)
    for p in range(num_partitions):
        path = partition_dir(data_dir, p)
        if not fs.exists(path):
            fs.mkdir(path)
            created.append(root)
    for directory in dict.fromkeys(created):
        fs.fsync_dir(directory)
