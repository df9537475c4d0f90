"""The state store seam: what the runtime and the group commit need from a state log.

Two stores implement it: the local log (``StateLog`` over ``PartitionLog``: segments and
the shared journal in a data directory, the embedded default) and the PostgreSQL store
(``persistence.postgres``). The runtime, the service and the group commit are written
against these two protocols and never ask which store they run on.

They are ``typing.Protocol`` classes, not an ABC: a store satisfies them by what it has
(mypy checks it where a store is handed to the committer or a runtime), so the local
classes implement the seam as they were, without a base class, and the PostgreSQL store,
whose driver is an optional extra, shares no code with them beyond the batch type its
own partitions hand out.

Threads (as ``PartitionLog``'s docstring has it): ``append``, ``take_pending`` and the
offsets belong to the event loop's thread, and touch memory only; ``open``,
``replay``, ``read``, ``reset_to_durable``, ``prune`` and ``commit_staged`` block, and
run in threads; ``StateStore.commit_cycle`` runs in the committer's one commit thread,
where resets run too (``GroupCommitter.run_exclusive``), so a reset never overlaps a
cycle carrying one of its partition's batches.

What each member promises is written on it below; in short, for one partition:

    log_start_offset <= durable_end_offset <= log_end_offset
    [log_start, durable_end)   durable: survives a crash of this process (and, for the
                               PostgreSQL store, of this node and of the primary when a
                               synchronous standby is promoted)
    [durable_end, log_end)     appended, taken or not by a commit cycle, not durable yet
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from persistence.frame import LogRecord
from persistence.segments import SegmentInfo, SegmentState
from persistence.swap import CommitOutcome
from protocol.loading import RawRecord

BatchT = TypeVar("BatchT")
BatchT_co = TypeVar("BatchT_co", covariant=True)


@dataclass(frozen=True)
class CycleResult:
    """What one commit cycle made durable. ``errors[i]`` is None when the i-th batch
    handed to ``commit_cycle`` is durable, else why it is not: the flush every batch
    shared (``shared``, the same object for each), a partition whose epoch moved
    (``NotLeaderError``: this node no longer leads it), or the partition's own failure
    after a durable flush (the local store's files: the batch is durable all the same,
    and ``durable_end_offset`` says so). ``seconds``: how long the flush took.
    ``end_lsn``: where the local store's journal ended after this cycle's record (None
    from another store, or when the record failed): a checkpoint may count every
    record below it as written to the partitions' files."""

    errors: list[BaseException | None]
    shared: BaseException | None
    seconds: float
    end_lsn: int | None = None


class PartitionStore(Protocol[BatchT_co]):
    """One state partition's log, as the runtime and the group commit use it."""

    # How the logs name a failed cycle and where a reload reads from, in this store's
    # own words ("write or fsync failed", "disk"): an operator reads them at 3 a.m.
    failed_cycle: str
    reload_source: str

    @property
    def partition(self) -> int: ...

    @property
    def log_start_offset(self) -> int:
        """No record of the partition lies below this offset (pruning raises it)."""
        ...

    @property
    def log_end_offset(self) -> int:
        """The offset the next ``append`` assigns."""
        ...

    @property
    def durable_end_offset(self) -> int:
        """Every record below this offset is durable; it only grows, but for a reset."""
        ...

    @property
    def failure(self) -> BaseException | None:
        """Why the partition takes no appends (a failed commit, a moved epoch), until
        ``reset_to_durable`` succeeds; None while it works."""
        ...

    @property
    def has_pending(self) -> bool:
        """Whether appends wait for ``take_pending``."""
        ...

    @property
    def is_open(self) -> bool: ...

    @property
    def generation(self) -> int:
        """Bumped by every reset: a batch taken before it is refused by the commit."""
        ...

    @property
    def partition_dir(self) -> str | None:
        """The directory of the partition's files; None for a store that has none."""
        ...

    @property
    def segments(self) -> list[SegmentInfo]:
        """The segment files, oldest first; empty for a store without files."""
        ...

    @property
    def size_bytes(self) -> int:
        """About how many bytes the partition's records take in the store."""
        ...

    def open(self, on_record: Callable[[LogRecord], None] | None = None) -> object:
        """Recover the partition and make it take appends. ``on_record`` sees, in offset
        order, what a load needs: every record of each key from the key's last snapshot
        (record type 0, a tombstone included) on; a store may hand older records too
        (the local store hands all it has). Raises ``LogError`` for damage, the store's
        own errors (OSError, ``StoreUnavailableError``) when it cannot be read now, and
        ``NotLeaderError`` when this node does not lead the partition."""
        ...

    def append(self, record_type: int, key: bytes, value: bytes | None, timestamp: int) -> int:
        """Buffer one record (memory only) and return its offset. Raises
        ``PartitionFailedError`` while ``failure`` is set."""
        ...

    def take_pending(self) -> BatchT_co | None:
        """Hand the buffered appends to a commit cycle (None when there are none); the
        batch is opaque to everyone but its store's ``commit_cycle``."""
        ...

    def fail(self, cause: BaseException) -> None:
        """Stop taking appends (its batch's commit failed); ``reset_to_durable``
        restarts the partition."""
        ...

    def replay(self, on_record: Callable[[LogRecord], None]) -> None:
        """Hand ``on_record`` what ``open`` hands it, from an open partition (a reload
        after ``reset_to_durable``)."""
        ...

    def read(self, from_offset: int = 0) -> Iterator[LogRecord]:
        """Every durable record at or above ``from_offset``, in order (dump, audit)."""
        ...

    def reset_to_durable(self) -> object:
        """After a failed commit: drop what is not durable, learn again what is (the
        local store cuts its files back; the PostgreSQL store asks the server) and take
        appends again from there. Raises as ``open`` does; safe to call again."""
        ...

    def read_recovered(self, on_record: Callable[[LogRecord], None]) -> object:
        """Hand ``on_record`` what the next open or reset will leave, writing nothing
        (what a daemon whose disk is full serves reads from)."""
        ...

    def prune(
        self, below_offset: int, may_delete: Callable[[SegmentState], bool] | None = None
    ) -> list[str]:
        """Delete records below ``below_offset`` (every one of them is redundant and
        durable); the local store deletes whole sealed segments only, the PostgreSQL
        store every row below. ``may_delete`` (the history's "is it exported yet?")
        holds back segments. Returns what was deleted, one line each."""
        ...

    def pending_compactions(self) -> list[int]:
        """The base offsets of staged compaction outputs waiting for ``commit_staged``
        (the compaction hand-off, docs/design.md#compaction-and-its-swap)."""
        ...

    def commit_staged(self, base: int) -> CommitOutcome:
        """Swap the compaction output staged at ``base`` in, or say it is stale."""
        ...

    def close(self) -> None: ...


class StateStore(Protocol[BatchT]):
    """Every state partition of one store, and the commit cycle over them."""

    @property
    def num_partitions(self) -> int: ...

    def partition(self, partition: int) -> PartitionStore[BatchT]: ...

    @property
    def partitions(self) -> Sequence[PartitionStore[BatchT]]: ...

    def commit_cycle(self, batches: Sequence[tuple[int, BatchT]]) -> CycleResult:
        """Make every batch durable with one flush (one journal record and fdatasync;
        one PostgreSQL transaction), in the commit thread: (partition, the batch its
        ``take_pending`` returned), one per partition. Each batch's partition has
        ``durable_end_offset`` at the batch's end once it is durable; a partition
        whose batch failed has ``failure`` set. Never raises for the store's own
        failures: they are in the result."""
        ...

    def close(self) -> None: ...


class _OpensInRuns(Protocol):
    """A store that reads a load in runs itself. It says so with ``opens_in_runs = True``
    (a structural check would not do: every store has an ``open``, with other
    parameters)."""

    opens_in_runs: bool

    def open(
        self,
        on_record: Callable[[LogRecord], None] | None = None,
        *,
        on_records: Callable[[list[RawRecord]], None] | None = None,
    ) -> object: ...


# Records a store hands one by one go on in runs of this many.
_RUN = 4096


def open_in_runs(
    store: PartitionStore[Any], on_records: Callable[[list[RawRecord]], None]
) -> object:
    """``store.open``, handing what it hands a load in runs of plain tuples (a loader's
    way, protocol/loading.py). The local log reads them so; another store's records are
    gathered into runs here."""
    if getattr(store, "opens_in_runs", False):
        return cast(_OpensInRuns, store).open(on_records=on_records)
    run: list[RawRecord] = []

    def take(record: LogRecord) -> None:
        nonlocal run
        run.append((record.offset, record.timestamp, record.record_type, record.key, record.value))
        if len(run) >= _RUN:
            on_records(run)
            run = []

    opened = store.open(take)
    if run:
        on_records(run)
    return opened
