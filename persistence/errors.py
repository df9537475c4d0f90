"""The log's own failures. Each names what it is about: a directory, a file and byte, a
partition."""

from __future__ import annotations

import os


class LogError(Exception):
    """Base class of every error raised by persistence/."""


class LogCorruptionError(LogError):
    """A frame that recovery may not truncate away is damaged: in a sealed segment, or in
    the middle of the newest one (valid frames follow it)."""

    def __init__(self, path: str | os.PathLike[str], position: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.position = position
        self.reason = reason
        data_dir = _data_dir_of(self.path)
        super().__init__(
            f"{self.path}: damaged log at byte {position}: {reason}. The state partition "
            f"refuses to load; run `sharecoord log verify --data-dir {data_dir}` "
            "for a full report (repair: docs/operations.md#repairing-a-damaged-partition)"
        )


def _data_dir_of(segment_path: str) -> str:
    """DATA for DATA/partitions/<p>/<file>, else the file's directory."""
    partition_dir = os.path.dirname(segment_path)
    partitions_dir = os.path.dirname(partition_dir)
    if os.path.basename(partitions_dir) == "partitions":
        return os.path.dirname(partitions_dir) or "."
    return partition_dir or "."


class LogLockedError(LogError):
    """Another process (or another StateLog in this one) holds DATA/LOCK."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        super().__init__(
            f"{data_dir} is in use: another process holds {os.path.join(data_dir, 'LOCK')} "
            "(only one process may write a data directory; stop it first, or use a "
            "read-only tool)"
        )


class MetaMismatchError(LogError, ValueError):
    """DATA/meta disagrees with how the directory is being opened."""


class PartitionFailedError(LogError):
    """The partition stopped after a failed write or fsync; reset_to_durable() restarts it."""

    def __init__(self, partition: int, cause: BaseException | None) -> None:
        self.partition = partition
        self.cause = cause
        super().__init__(
            f"state partition {partition} has failed ({cause!r}); "
            "it takes no appends until reset_to_durable() succeeds"
        )


class DurabilityError(LogError):
    """An append was not made durable: its partition's write or fsync failed.

    ``durable_end_offset`` is the partition's durable end when it failed: the offsets
    below it were fsynced and stay (a reset cuts the log back to exactly there), the
    others are gone."""

    def __init__(self, partition: int, cause: BaseException, durable_end_offset: int) -> None:
        self.partition = partition
        self.cause = cause
        self.durable_end_offset = durable_end_offset
        super().__init__(f"state partition {partition}: write or fsync failed: {cause!r}")
        self.__cause__ = cause  # tracebacks show the OSError


class NotLeaderError(LogError):
    """A store with leases (the PostgreSQL store): this node no longer leads the state
    partition, because its epoch moved (another node claimed it) or it never led it. A
    commit carrying its records wrote none of them."""

    def __init__(self, partition: int, held_epoch: int | None, found: str) -> None:
        self.partition = partition
        self.held_epoch = held_epoch
        held = "no epoch" if held_epoch is None else f"epoch {held_epoch}"
        super().__init__(
            f"state partition {partition}: this node no longer leads it (it held {held}; "
            f"the store says {found})"
        )


class StoreUnavailableError(LogError, OSError):
    """The state store's server cannot be reached or refused a statement, in one line
    (its URI shown with the password masked). An OSError too: like a disk that failed,
    it is retried (a load, a reset), never taken for damage."""
