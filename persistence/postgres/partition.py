"""One state partition in the PostgreSQL store: the seam's PartitionStore
(persistence/store.py) over the tables of schema.py. Appends are rows in memory until a
commit cycle (store.py) takes them; open and reset ask the server where the partition
ends and replay each key from its last snapshot on; prune deletes rows."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from persistence.errors import LogError, PartitionFailedError
from persistence.frame import LogRecord
from persistence.postgres.copyin import ROW_OVERHEAD, Row
from persistence.segments import SegmentInfo, SegmentState
from persistence.swap import CommitOutcome
from protocol.records import SNAPSHOT_RECORD_TYPE

if TYPE_CHECKING:
    from persistence.postgres.store import PostgresStore

_log = logging.getLogger("sharecoord.log")


@dataclass(frozen=True)
class RowBatch:
    """Appends taken for one commit: the rows of offsets [first_offset, end_offset)."""

    generation: int
    first_offset: int
    rows: list[Row]

    @property
    def end_offset(self) -> int:
        return self.first_offset + len(self.rows)


class PostgresPartition:
    """One state partition in the PostgreSQL store (persistence/store.py's
    PartitionStore)."""

    failed_cycle = "commit to PostgreSQL failed"
    reload_source = "PostgreSQL after a failed commit"

    def __init__(self, store: PostgresStore, partition: int) -> None:
        self._store = store
        self.partition = partition
        self._lock = threading.Lock()
        self._opened = False
        self._failure: BaseException | None = None
        self._generation = 0
        self._pending: list[Row] = []
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._durable_end_offset = 0
        self._size_bytes = 0
        # Keys whose sharecoord_keys row is surely there: a cycle upserts only the others
        # and those it gives a snapshot.
        self._known_keys: set[bytes] = set()

    def __repr__(self) -> str:
        return f"PostgresPartition({self.partition}, {self._store!r})"

    # -- state -----------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def durable_end_offset(self) -> int:
        return self._durable_end_offset

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def is_open(self) -> bool:
        return self._opened

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def partition_dir(self) -> str | None:
        return None

    @property
    def segments(self) -> list[SegmentInfo]:
        return []

    @property
    def size_bytes(self) -> int:
        """The keys and values of the records replayed at open and appended since,
        less what pruning deleted: a lower bound of what the partition takes."""
        return self._size_bytes

    # -- opening and replay ------------------------------------------------------------

    def open(self, on_record: Callable[[LogRecord], None] | None = None) -> None:
        with self._lock:
            if self._opened:
                raise LogError(f"{self!r} is already open")
            self._load(on_record)

    def reset_to_durable(self) -> None:
        """Drop what is not durable, and take appends again from what the server has."""
        with self._lock:
            self._generation += 1
            self._pending = []
            self._opened = False
            if self._failure is None:
                self._failure = LogError("reset in progress")
            self._load(None)

    def _load(self, on_record: Callable[[LogRecord], None] | None) -> None:
        store = self._store
        epoch = store.held_epoch(self.partition)
        doing = f"loading state partition {self.partition}"
        with store.snapshot(doing) as conn:
            with store.guarded(conn, doing):
                store.check_leader(conn, self.partition, epoch)
                start, end = store.offsets(conn, self.partition)
            known: set[bytes] = set()
            size = 0
            for record in store.replay_rows(conn, self.partition):
                known.add(record.key)
                size += ROW_OVERHEAD + len(record.key) + len(record.value or b"")
                if on_record is not None:
                    on_record(record)
        self._log_start_offset, self._log_end_offset = start, end
        self._durable_end_offset = end
        self._known_keys = known
        self._size_bytes = size
        self._failure = None
        self._opened = True

    def replay(self, on_record: Callable[[LogRecord], None]) -> None:
        with self._store.snapshot(f"replaying state partition {self.partition}") as conn:
            for record in self._store.replay_rows(conn, self.partition):
                if record.offset < self._durable_end_offset:
                    on_record(record)

    def read_recovered(self, on_record: Callable[[LogRecord], None]) -> None:
        """What the next open or reset will leave: what the server has (nothing here
        is repaired by a reset)."""
        with self._store.snapshot(f"reading state partition {self.partition}") as conn:
            for record in self._store.replay_rows(conn, self.partition):
                on_record(record)

    def read(self, from_offset: int = 0) -> Iterator[LogRecord]:
        end = self._durable_end_offset if self._opened else None
        yield from self._store.read_rows(self.partition, from_offset, end)

    # -- appending ---------------------------------------------------------------------

    def append(self, record_type: int, key: bytes, value: bytes | None, timestamp: int) -> int:
        if self._failure is not None:
            raise PartitionFailedError(self.partition, self._failure)
        if not self._opened:
            raise LogError(f"{self!r} is not open for appends")
        offset = self._log_end_offset
        self._pending.append((self.partition, offset, record_type, key, value, timestamp))
        self._log_end_offset = offset + 1
        return offset

    def take_pending(self) -> RowBatch | None:
        if self._failure is not None:
            raise PartitionFailedError(self.partition, self._failure)
        rows = self._pending
        if not rows:
            return None
        self._pending = []
        return RowBatch(self._generation, self._log_end_offset - len(rows), rows)

    def fail(self, cause: BaseException) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = cause

    def abandon(self, cause: BaseException) -> None:
        """This node stopped leading the partition (``cause`` says why): what was
        appended and not committed is dropped, a batch taken before is refused by the
        commit (a new generation), and no append is taken until it is opened again."""
        with self._lock:
            self._generation += 1
            self._pending = []
            self._opened = False
            self._failure = cause
            self._log_end_offset = self._durable_end_offset

    def key_starts(self, batch: RowBatch) -> dict[bytes, tuple[int, bool]]:
        """The sharecoord_keys rows this batch changes: each key's last snapshot in it,
        or its first record when the key is new."""
        starts: dict[bytes, tuple[int, bool]] = {}
        known = self._known_keys
        for _, offset, record_type, key, _, _ in batch.rows:
            if record_type == SNAPSHOT_RECORD_TYPE:
                starts[key] = (offset, True)
            elif key not in known and key not in starts:
                starts[key] = (offset, False)
        return starts

    def committed(self, batch: RowBatch, size: int, keyed: Iterable[bytes]) -> None:
        """The commit thread, once the batch's transaction committed: its rows took
        `size` bytes (copyin.encode's), and the keys of `keyed` have their keys row."""
        self._known_keys.update(keyed)
        self._size_bytes += size
        self._durable_end_offset = batch.end_offset

    # -- pruning and compaction --------------------------------------------------------

    def prune(
        self, below_offset: int, may_delete: Callable[[SegmentState], bool] | None = None
    ) -> list[str]:
        """Delete every record below `below_offset` (and the keys rows none of whose
        records remain). When the store keeps a history (sharecoord_schema says so),
        the same transaction moves them into it first (history.py): nothing waits to be
        exported, so `may_delete`, the local history's question, is not asked."""
        if not self._opened:
            raise LogError(f"{self!r} is not open")
        below = min(below_offset, self._durable_end_offset)
        deleted, size, moved = self._store.delete_below(self.partition, below)
        if deleted:
            self._log_start_offset = max(self._log_start_offset, below)
            self._size_bytes = max(0, self._size_bytes - size)
            kept = f" ({moved} moved into the history)" if moved else ""
            _log.info(
                "state partition %d: pruned %d records below offset %d%s",
                self.partition,
                deleted,
                below,
                kept,
            )
            return [f"{deleted} records below offset {below}{kept}"]
        return []

    def pending_compactions(self) -> list[int]:
        # Compaction on this store swaps its output in with its own transaction
        # (spark_jobs/pgcompact.py): nothing is staged for the daemon to commit.
        return []

    def commit_staged(self, base: int) -> CommitOutcome:
        raise LogError("a PostgreSQL store stages no compaction output: the job swaps it in itself")

    def close(self) -> None:
        with self._lock:
            self._opened = False
            self._pending = []
