"""One runtime per state partition: it owns that partition's shard and log.

An operation runs to completion synchronously on the event loop: the shard validates it
(``handle``), the records are appended to the log's buffer and replayed into the shard,
and the caller gets the response together with the offset it must wait for. Nothing
awaits in between, so operations on a partition run one at a time, in arrival order.

But for a long write: one whose batches and the key's stored batches number more than
``OFFLOAD_BATCHES`` would hold the event loop for milliseconds, so its rule, record and
merge are worked out on the offload thread (``execute_offloaded``), and only the append
and the state change happen on the loop. Meanwhile the partition is taken: every other
operation on it, and every job, waits its turn (``turn``/``release``), in arrival order;
the other partitions go on.
The caller answers only once the group commit says that offset is durable; a read waits
for everything it observed.

Loading replays the log from the start through the same ``replay`` (14 until done). An
fsync failure stops the partition (15): its parked answers fail, the log is cut back to
the last durable offset, and the partition reloads from disk, retrying with backoff. A
load that fails on an I/O error retries the same way; a damaged log stays failed.

A full disk (ENOSPC, EDQUOT) stops writes, never reads. A failed partition whose shard
holds exactly what is durable is ``readable``: reads are answered from it (the service
refuses what would append a record). That is so when the failure left nothing appended
past the durable end, and otherwise once the shard is rebuilt from what the recovery
that the disk refused will leave (``PartitionLog.read_recovered``, which writes
nothing). The recovery is then tried again each time the disk's free space grows. A
partition can also be refused by the journal: loaded and sound, but the journal has no
room for records (the committer says so, ``journal_full``); it reports itself failed and
serves reads until the committer has room again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from persistence import FileOps, LogRecord, PartitionFailedError
from persistence.fileops import is_disk_full
from persistence.frame import HEADER_SIZE, VALUE_LENGTH
from persistence.partition import PartitionLog
from persistence.room import RoomWatch
from persistence.store import PartitionStore, open_in_runs
from protocol.key_state import KeyState
from protocol.loading import (
    LazyKeyState,
    LoadDecodeError,
    RawRecord,
    StateLoader,
    fold,
    fold_is_long,
)
from protocol.messages import AnyPartitionResult, Rpc
from protocol.records import (
    SNAPSHOT_RECORD_TYPE,
    UPDATE_RECORD_TYPE,
    Record,
    RecordDecodeError,
    RecordDecoder,
    ShareKey,
    ShareSnapshot,
    ShareUpdate,
    encode_key,
    encode_value,
)
from protocol.shard import ShardConfig, ShareCoordinatorShard, TopicMetadata
from protocol.state_batch import StateBatch
from protocol.update_value import encode_update_value
from server.folds import BackgroundFolds
from server.metrics import ShareCoordinatorMetrics

_log = logging.getLogger("sharecoord.runtime")

# Bytes a frame adds around its key and value.
FRAME_OVERHEAD: Final = HEADER_SIZE + VALUE_LENGTH.size

RELOAD_BACKOFF_INITIAL_S = 0.05
RELOAD_BACKOFF_MAX_S = 5.0
SLOW_LOAD_S = 1.0
# Said of a failed partition that serves reads (its `error`, /readyz, the log).
READS_SERVED = "the disk is full: reads are served, writes answer 15 until it has room"
READS_SERVED_UNTIL_THE_DISK_WORKS = "reads are served, writes answer 15 until the disk works"

# A write entry whose new batches and its key's stored ones number more than this leaves
# the event loop (the module docstring). Merging is a few microseconds per batch, more on
# adversarial shapes: at this size the loop is held at most a few milliseconds.
OFFLOAD_BATCHES: Final = 256

UNSYNCED_SWEEP_MIN: Final = 1024
# The background fold of a lazily loaded partition holds the loop this long at a time.
FOLD_SLICE_S = 0.002
# The entry every write brings, as a C static (an enum member is otherwise two lookups).
_WRITE: Final = Rpc.WRITE

T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]


class Status(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"


class LoadError(Exception):
    """A partition's log could not be replayed (damage, or a record that is no record)."""


class LoadStopped(Exception):
    """A replay gave up because the runtime is closing (the daemon is stopping)."""


def wall_clock_ms() -> int:
    return _TIME_NS() // 1_000_000


# Statics of the compiled module, for names an entry uses: from compiled code, a class or
# a constant imported from a module Python runs is a lookup in this module's dict at each
# use (a Final name of its own is not).
_LAZY_KEY_STATE: Final = LazyKeyState
_PARTITION_LOG: Final = PartitionLog
_SHARE_UPDATE: Final = ShareUpdate
_UPDATE_RECORD_TYPE: Final = UPDATE_RECORD_TYPE

# A static of the compiled module: ``time.time_ns`` would be a dict lookup and an
# attribute lookup per record.
_TIME_NS: Final[Callable[[], int]] = time.time_ns


class PartitionRuntime:
    def __init__(
        self,
        partition: int,
        log: PartitionStore[object],
        shard_config: ShardConfig,
        *,
        metadata: TopicMetadata | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        metrics: ShareCoordinatorMetrics | None = None,
        exclusive: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
        room: RoomWatch | None = None,
        before_serving: Callable[[], Awaitable[None]] | None = None,
        offload: Offload[Any] | None = None,
        folds: BackgroundFolds | None = None,
    ) -> None:
        self.partition = partition
        # Where long operations run (the node's one offload thread).
        self._offload: Offload[Any] = offload or asyncio.to_thread
        # Taken while an offloaded operation runs, and handed from waiter to waiter.
        self._held = False
        self._turns: collections.deque[asyncio.Future[None]] = collections.deque()
        # The offset of each key's last record, while it may not be durable yet; swept
        # of durable ones whenever it doubled, so it holds about what awaits a commit.
        self._unsynced: dict[ShareKey, int] = {}
        self._unsynced_sweep_at = UNSYNCED_SWEEP_MIN
        # Where a reset runs: the commit thread (GroupCommitter.run_exclusive), so it
        # never overlaps a cycle carrying one of this partition's batches.
        self._exclusive = exclusive or asyncio.to_thread
        self.log = log
        self._shard_config = shard_config
        self._metadata = metadata
        self._now_ms = now_ms
        self._metrics = metrics or ShareCoordinatorMetrics()
        # Plain counts on the hot path; the metrics read them when scraped.
        self.records_appended = 0
        self.bytes_appended = 0
        self.shard_writes = 0
        self._metrics.records_appended.labels(partition).set_function(lambda: self.records_appended)
        self._metrics.bytes_appended.labels(partition).set_function(lambda: self.bytes_appended)
        self.shard = self._new_shard()
        # A store without files never reports a full disk: its watch is never asked.
        self._room = room or RoomWatch(FileOps(), log.partition_dir or ".")
        # Awaited once loaded, before serving: the journal's first try to get ready
        # (GroupCommitter.prepared), so a full disk stops its writes before any
        # write can reach its shard.
        self._before_serving = before_serving
        # The partition's own state; `status`, `error` and `readable` are what it shows,
        # a full journal included (_show).
        self._own_status = Status.LOADING
        self._own_error: str | None = None
        self._shard_durable = False  # while failed: the shard holds exactly what is durable
        self._journal_full: str | None = None  # why the journal takes no records, or None
        self.status = Status.LOADING
        self.error: str | None = None
        # Reads may be answered from the shard: always when active, and when failed
        # with a shard that holds exactly what is durable.
        self.readable = False
        self.load_seconds: float | None = None
        self._recovery: asyncio.Task[None] | None = None
        self._closing = False
        # The lazily loaded keys the background fold has not reached yet
        # (protocol/loading.py), and the fold itself; set when there is none.
        self._to_fold: list[KeyState] = []
        self.keys_unfolded = 0
        self._folding: asyncio.Task[None] | None = None
        self._folded = asyncio.Event()
        self._folded.set()
        # One background fold holds the loop (or the offload thread) at a time, node-wide,
        # and none while a partition loads.
        self._folds = folds or BackgroundFolds()

    def _new_shard(self) -> ShareCoordinatorShard:
        return ShareCoordinatorShard(
            self._shard_config, metadata=self._metadata, now_ms=self._now_ms
        )

    def _set_status(self, status: Status, error: str | None = None) -> None:
        self._own_status = status
        self._own_error = error
        if status is not Status.FAILED:
            self._shard_durable = False
        self._show()

    def _show(self) -> None:
        """What the partition shows: its own status, but failed (and readable) while
        the journal takes no records."""
        if self._own_status is Status.ACTIVE and self._journal_full is not None:
            self.status, self.error, self.readable = Status.FAILED, self._journal_full, True
            return
        self.status, self.error = self._own_status, self._own_error
        self.readable = self._own_status is Status.ACTIVE or (
            self._own_status is Status.FAILED and self._shard_durable
        )

    def journal_full(self, cause: BaseException | None) -> None:
        """The journal has no room for records (`cause`), or has again (None): meanwhile
        an active partition shows itself failed, serves reads, and the service refuses
        its writes before they reach the shard."""
        if cause is None:
            self._journal_full = None
        else:
            served = READS_SERVED if is_disk_full(cause) else READS_SERVED_UNTIL_THE_DISK_WORKS
            self._journal_full = f"write or fsync failed: {cause}; {served}"
        self._show()

    # --- loading ----------------------------------------------------------------------

    async def load(self) -> None:
        """Open the log (recovering it) and replay it into the shard, off the loop."""
        started = time.perf_counter()
        try:
            with self._folds.loading():
                await asyncio.to_thread(self._open_and_replay)
        except LoadStopped:
            return
        except OSError as exc:
            # The disk failed, not the log: retry as after a failed fsync, until a
            # reload works (damage, by contrast, raises LogError and stays failed).
            error = _describe_failure(exc)
            _log.error("state partition %d failed to load: %s; retrying", self.partition, error)
            if is_disk_full(exc):
                # Still loading (14) while what is on disk is read for the reads.
                await self._serve_reads_meanwhile(error)
            else:
                self._set_status(Status.FAILED, error)
            self._start_recovery()
            return
        except Exception as exc:
            self._set_status(Status.FAILED, _describe_failure(exc))
            _log.error("state partition %d failed to load: %s", self.partition, self.error)
            return
        self.load_seconds = time.perf_counter() - started
        self._metrics.load_duration.labels(self.partition).set(self.load_seconds)
        if self._before_serving is not None:
            await self._before_serving()
        self._set_status(Status.ACTIVE)
        if self._to_fold:
            self._folded.clear()
            self._folding = asyncio.get_running_loop().create_task(
                self._fold_loaded(self.shard), name=f"fold-partition-{self.partition}"
            )
        # One line per partition only when loading it took a noticeable while.
        _log.log(
            logging.INFO if self.load_seconds >= SLOW_LOAD_S else logging.DEBUG,
            "state partition %d loaded: %d keys, offsets %d..%d, %.3fs",
            self.partition,
            len(self.shard),
            self.log.log_start_offset,
            self.log.log_end_offset,
            self.load_seconds,
        )

    def _open_and_replay(self) -> None:
        # Each key from its last snapshot (protocol/loading.py): the state a replay of
        # every record gives, without folding what a later snapshot replaces.
        shard = self._new_shard()
        loader = StateLoader(shard.config.records_per_snapshot)

        def load(records: list[RawRecord]) -> None:
            if self._closing:
                _log.info(
                    "state partition %d: loading stopped at offset %d: the daemon is stopping",
                    self.partition,
                    records[0][0],
                )
                raise LoadStopped(self.partition)
            loader.add(records)

        try:
            open_in_runs(self.log, load)
            # Lazily: the partition serves once the records are read and checked; the
            # merges follow in the background (_fold_loaded), or at a key's first use.
            shard.loaded(*loader.finish(lazy=True))
        except LoadDecodeError as exc:
            raise LoadError(f"state partition {self.partition}, {exc}; {_CHECK_THE_LOG}") from exc
        self._to_fold = shard.unfolded()
        self.keys_unfolded = len(self._to_fold)
        self.shard = shard
        self._unsynced = {}  # all of a freshly opened log is durable

    async def _fold_loaded(self, shard: ShareCoordinatorShard) -> None:
        """Fold every key the load left unfolded, a slice of the loop at a time (a key
        with a long tail on the offload thread), behind whatever else asks for the loop,
        until done or the shard is replaced (a reload replays in full)."""
        pending, self._to_fold = self._to_fold, []
        clock = time.perf_counter
        started: float | None = None  # the first turn: the loads come before it
        at = 0
        try:
            while at < len(pending):
                async with self._folds.turn():
                    if self.shard is not shard or self._closing:
                        return
                    if started is None:
                        started = clock()
                    if fold_is_long(pending[at]):
                        await self._offload(functools.partial(fold, pending[at]))
                        at += 1
                    else:
                        # At least one key a turn (this one is short), however short
                        # the slice; then on to the first long tail, which goes off the loop.
                        until = clock() + FOLD_SLICE_S
                        while True:
                            fold(pending[at])
                            at += 1
                            if at == len(pending) or clock() >= until or fold_is_long(pending[at]):
                                break
                    self.keys_unfolded = len(pending) - at
                    # A turn of the loop for everyone else, before the next fold's slice:
                    # a slice runs without a pause, so the lock would not keep two from
                    # following each other in one turn of the loop if it were let go
                    # first (50 partitions folding held an HTTP request ~0.4 s).
                    await asyncio.sleep(0)
            seconds = 0.0 if started is None else clock() - started
            _log.log(
                logging.INFO if seconds >= SLOW_LOAD_S else logging.DEBUG,
                "state partition %d: %d keys folded in the background in %.3fs",
                self.partition,
                len(pending),
                seconds,
            )
        finally:
            self.keys_unfolded = 0
            self._folding = None
            self._folded.set()

    async def fold_key(self, key: ShareKey) -> None:
        """Fold ``key`` now if a load left it with a long tail, on the offload thread:
        for a reader that takes the shard's state as it is, outside the turns."""
        state = self.shard.key_state(key)
        if state is not None and fold_is_long(state):
            await self._offload(functools.partial(fold, state))

    async def wait_folded(self) -> None:
        """Until no key of the shard waits for the background fold (at once if none):
        what a job over every key awaits, so that it does not fold them on the loop."""
        await self._folded.wait()

    def _unless_closing(self, replay: Callable[[LogRecord], None]) -> Callable[[LogRecord], None]:
        """``replay`` that gives up at the next record once ``close`` (or ``stop``) was
        called: a replay runs in a thread that cancelling its task does not stop, and a
        large log would otherwise hold the shutdown (and the log's lock) until it ends."""

        def replay_unless_closing(frame: LogRecord) -> None:
            if self._closing:
                _log.info(
                    "state partition %d: loading stopped at offset %d: the daemon is stopping",
                    self.partition,
                    frame.offset,
                )
                raise LoadStopped(self.partition)
            replay(frame)

        return replay_unless_closing

    # --- operations -------------------------------------------------------------------

    def execute(self, rpc: Rpc, key: ShareKey, entry: Any) -> AnyPartitionResult:
        """Run one decoded request entry: the shard's rule, then append and replay the
        record it asks for. Only while ACTIVE (the service checks).

        The result may reveal state that is not durable yet: answer it only once the
        group commit covered ``pending_offset()`` as it is after this call.

        Raises PartitionFailedError once the log's last commit failed: the shard may
        still hold what that commit lost (the runtime reloads when it hears), and even
        an error answer must not rest on it.
        """
        self._refuse_after_a_failed_commit()
        return self._execute(rpc, key, entry, self.shard.key_state(key))[0]

    def execute_now(
        self, rpc: Rpc, key: ShareKey, entry: Any
    ) -> tuple[AnyPartitionResult, int | None] | None:
        """``execute`` for an entry that may run now, with the offset its answer must
        see durable (``pending_offset_of`` after it); None, having done nothing, when
        the partition is taken (``held``) or the entry is long (``is_long``): it then
        runs in its turn (``server.turns.execute_in_turn``). The service's one call per
        entry: the key's state is looked up once, for the check, the shard's rule, the
        frame and the replay, and the offset comes from the append."""
        if self._held:
            return None
        self._refuse_after_a_failed_commit()
        state = self.shard.key_state(key)
        if _is_long(state, rpc, entry):
            return None
        return self._execute(rpc, key, entry, state)

    def _refuse_after_a_failed_commit(self) -> None:
        """Raise PartitionFailedError once the log's last commit failed."""
        log = self.log
        # The same read in both branches, typed by the check (as in _append): compiled,
        # the local log's property is a direct call, the protocol's a generic lookup.
        failure = log.failure if type(log) is _PARTITION_LOG else log.failure  # noqa: RUF034
        if failure is not None:
            raise PartitionFailedError(self.partition, failure)

    def _execute(
        self, rpc: Rpc, key: ShareKey, entry: Any, state: KeyState | None
    ) -> tuple[AnyPartitionResult, int | None]:
        """``state``: the key's, as the shard holds it now (None for a key without)."""
        shard = self.shard
        if rpc is _WRITE:
            record, result = shard.write(key, entry, state)
            # Kafka's write-total: every write a shard handles, and leader-epoch reads.
            self.shard_writes += 1
        else:
            record, result = _OPERATIONS[rpc](shard, key, entry)
            if record is not None and rpc is Rpc.READ:
                self.shard_writes += 1
        if record is not None:
            return result, self._append(record, state=state, key=key)
        return result, self.pending_offset_of(key)

    def answer_read(self, rpc: Rpc, key: ShareKey, entry: Any) -> AnyPartitionResult | None:
        """A read (Read, ReadSummary) answered from the shard as it is, appending
        nothing; None when answering it needs a record (a Read that moves the leader
        epoch). For a failed but ``readable`` partition, or one the commit refuses
        writes for."""
        record, result = _OPERATIONS[rpc](self.shard, key, entry)
        return None if record is not None else result

    # --- long operations: off the loop, the partition taken ---------------------------

    @property
    def held(self) -> bool:
        """Whether the partition is taken: an operation must wait its ``turn``."""
        return self._held

    async def turn(self) -> None:
        """Take the partition, after everyone who asked before; ``release`` gives it on."""
        if not self._held:
            self._held = True
            return
        waiter = asyncio.get_running_loop().create_future()
        self._turns.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as the caller was cancelled: pass it on
            elif waiter in self._turns:  # (release drops cancelled waiters it meets)
                self._turns.remove(waiter)
            raise

    def release(self) -> None:
        turns = self._turns
        while turns:
            waiter = turns.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._held = False

    def is_long(self, rpc: Rpc, key: ShareKey, entry: Any) -> bool:
        """Whether ``execute`` would hold the loop too long for this entry: a long write,
        or any entry that would fold a long tail first (protocol/loading.py)."""
        return _is_long(self.shard.key_state(key), rpc, entry)

    async def execute_offloaded(self, rpc: Rpc, key: ShareKey, entry: Any) -> AnyPartitionResult:
        """``execute`` with its work (the rule, the record's encoding, the merge) done on
        the offload thread. The caller holds the partition (``turn``), so the shard does
        not change meanwhile, but for a reload after a failed commit: then this raises
        PartitionFailedError, as ``execute`` does after one."""
        self._refuse_after_a_failed_commit()
        shard = self.shard

        def work() -> _Worked:
            record, result = _OPERATIONS[rpc](shard, key, entry)
            if record is None:
                return None, result, None, None
            merged = shard.merged_update(record) if isinstance(record, ShareUpdate) else None
            return record, result, _frame(record, shard.key_state(key)), merged

        worked: _Worked = await self._offload(work)
        record, result, framed, merged = worked
        failure = self.log.failure
        if self.shard is not shard or self.status is not Status.ACTIVE or failure is not None:
            raise PartitionFailedError(self.partition, failure)
        if rpc is Rpc.WRITE or (rpc is Rpc.READ and record is not None):
            self.shard_writes += 1  # as execute counts them
        if record is not None:
            self._append(record, framed, merged)
        return result

    def run_job(self, job: Callable[[ShareCoordinatorShard], list[Record]]) -> int:
        """Run a maintenance job (topic deletion, retention, cold snapshots) over the
        shard and append what it asks for; returns how many records that was."""
        records = job(self.shard)
        for record in records:
            self._append(record)
        return len(records)

    def _append(
        self,
        record: Record,
        framed: _Framed | None = None,
        merged: _Merged | None = None,
        state: KeyState | None = None,
        key: ShareKey | None = None,
    ) -> int:
        """Frame one record into the log's buffer and replay it; ``framed`` and
        ``merged`` are that work done beforehand (``execute_offloaded``), ``state`` the
        record's key's state and ``key`` its key when the caller has them (looked up
        when None; a record's key is a generic attribute read from compiled code).
        Returns the record's offset."""
        shard = self.shard
        if key is None:
            key = record.key
        if state is None:
            state = shard.key_state(key)
        record_type, key_bytes, value = framed or _frame(record, state)
        log = self.log
        if type(log) is _PARTITION_LOG:
            # The same call as below, typed by the check: compiled, a direct call of the
            # local log's append. Through the PartitionStore protocol (the PostgreSQL
            # store is another class) it is Python's call, its arguments and its result
            # boxed and parsed again.
            offset = log.append(record_type, key_bytes, value, self._now_ms())
        else:
            offset = log.append(record_type, key_bytes, value, self._now_ms())
        shard.replay(offset, record, key_bytes, merged, state)
        unsynced = self._unsynced
        if len(unsynced) >= self._unsynced_sweep_at:
            durable = self.log.durable_end_offset
            unsynced = self._unsynced = {k: o for k, o in unsynced.items() if o >= durable}
            self._unsynced_sweep_at = max(UNSYNCED_SWEEP_MIN, 2 * len(unsynced))
        unsynced[key] = offset
        self.records_appended += 1
        self.bytes_appended += FRAME_OVERHEAD + len(key_bytes) + (len(value) if value else 0)
        return offset

    def pending_offset(self) -> int | None:
        """The offset an answer given now must wait for, or None if all is durable."""
        if self._shard_durable:
            return None  # failed, with a shard that holds only what is durable
        end = self.log.log_end_offset
        return end - 1 if end > self.log.durable_end_offset else None

    def pending_offset_of(self, key: ShareKey) -> int | None:
        """The offset an answer about ``key`` given now must wait for: its last record,
        unless that is durable already (None). What a key's answer shows rests on its
        own records alone, so a read of a quiet key does not wait behind the commit of
        another key's long write."""
        offset = self._unsynced.get(key)
        if offset is None or offset < self.log.durable_end_offset:
            return None
        return offset

    # --- failure and recovery ---------------------------------------------------------

    def on_durability_failure(self, cause: BaseException) -> None:
        """The group commit could not write or fsync this partition: stop serving it,
        and reload it from what is durable on disk. If nothing was appended past the
        durable end (its files failed after the journal made the batch durable), the
        shard holds exactly what is durable: a full disk leaves its reads served."""
        if self._own_status is Status.FAILED and self._recovery is not None:
            return
        message = f"{self.log.failed_cycle}: {cause}"
        _log.error("state partition %d stopped: %s", self.partition, message)
        self._shard_durable = False
        self._set_status(Status.FAILED, message)
        if is_disk_full(cause) and self.log.log_end_offset == self.log.durable_end_offset:
            self._serving_reads(message)
        self._start_recovery()

    def _serving_reads(self, message: str) -> None:
        self._shard_durable = True
        self._own_error = f"{message}; {READS_SERVED}"
        self._show()

    async def _serve_reads_meanwhile(self, error: str) -> None:
        """The disk refused what a (re)load writes (`error`): the partition fails, and
        its shard is rebuilt from what that recovery will leave, without writing
        (PartitionLog.read_recovered), so that it answers reads until it can run."""
        shard = self._new_shard()
        replay = self._unless_closing(_replayer(shard, self.partition))
        try:
            await asyncio.to_thread(self.log.read_recovered, replay)
        except LoadStopped:
            self._set_status(Status.FAILED, error)
            return
        except Exception as exc:
            self._set_status(Status.FAILED, error)
            _log.warning(
                "state partition %d: its reads wait for the disk too: %s",
                self.partition,
                _describe_failure(exc),
            )
            return
        self.shard = shard
        # Rebuilt from what is durable: no key's answer waits for a record past the
        # durable end any more (it is not in this shard, and its commit will not come).
        self._unsynced = {}
        self._set_status(Status.FAILED, error)
        self._serving_reads(error)
        _log.warning(
            "state partition %d: %s (%d keys from what is on disk)",
            self.partition,
            READS_SERVED,
            len(shard),
        )

    def _start_recovery(self) -> None:
        if not self._closing:
            self._recovery = asyncio.get_running_loop().create_task(
                self._recover(), name=f"recover-partition-{self.partition}"
            )

    async def _recover(self) -> None:
        delay = RELOAD_BACKOFF_INITIAL_S
        said_full = False
        attempt = 0
        while not self._closing:
            attempt += 1
            try:
                await self._exclusive(self._reset_and_replay)
            except LoadStopped:
                return
            except Exception as exc:
                self._own_error = f"reload attempt {attempt} failed: {_describe_failure(exc)}"
                self._show()
                if not is_disk_full(exc):
                    _log.warning("state partition %d: %s", self.partition, self._own_error)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RELOAD_BACKOFF_MAX_S)
                    continue
                # A full disk: the same backoff, cut short as soon as there is more room
                # (its error and /readyz count the attempts; the log says it once).
                _log.log(
                    logging.DEBUG if said_full else logging.WARNING,
                    "state partition %d: %s",
                    self.partition,
                    self._own_error,
                )
                said_full = True
                if self._shard_durable:
                    self._serving_reads(self._own_error)
                else:
                    await self._serve_reads_meanwhile(self._own_error)
                free = await asyncio.to_thread(self._room.free_bytes)
                await self._room.wait_for_more(free, delay)
                delay = min(delay * 2, RELOAD_BACKOFF_MAX_S)
                continue
            self._recovery = None
            self._set_status(Status.ACTIVE)
            _log.info(
                "state partition %d reloaded from %s (attempt %d)",
                self.partition,
                self.log.reload_source,
                attempt,
            )
            return

    def _reset_and_replay(self) -> None:
        # Cut the log back to what the last successful fsync covered; nothing that was
        # never acknowledged can come back as state.
        self.log.reset_to_durable()
        shard = self._new_shard()
        self.log.replay(self._unless_closing(_replayer(shard, self.partition)))
        self.shard = shard
        self._unsynced = {}  # cut back to what is durable

    def stop(self) -> None:
        """Stop loading and recovering: a replay running in a thread ends at its next
        record. Synchronous, so a shutdown can say it before cancelling anything."""
        self._closing = True

    async def close(self) -> None:
        self._closing = True
        for task in (self._recovery, self._folding):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


_Framed = tuple[int, bytes, bytes | None]  # record type, key, value
_Merged = tuple[list[StateBatch], bool]
_Worked = tuple[Record | None, AnyPartitionResult, _Framed | None, _Merged | None]


def _is_long(state: KeyState | None, rpc: Rpc, entry: Any) -> bool:
    """``PartitionRuntime.is_long`` given the key's state."""
    if state is not None and type(state) is _LAZY_KEY_STATE and fold_is_long(state):
        return True
    if rpc is not _WRITE:
        return False
    batches = len(entry.state_batches)
    if batches > OFFLOAD_BATCHES:
        return True
    return state is not None and batches + len(state.state.state_batches) > OFFLOAD_BATCHES


def _frame(record: Record, state: KeyState | None) -> _Framed:
    """A record as the log stores it. The key's bytes come from the key's ``state``
    when it has one (every write after the first)."""
    key_bytes = state.key_bytes if state is not None else None
    if key_bytes is None:
        key_bytes = encode_key(record.key)
    if isinstance(record, _SHARE_UPDATE):
        return _UPDATE_RECORD_TYPE, key_bytes, encode_update_value(record)
    value = encode_value(record) if isinstance(record, ShareSnapshot) else None
    return SNAPSHOT_RECORD_TYPE, key_bytes, value


_CHECK_THE_LOG = "run `sharecoord log verify` and `sharecoord log dump` on the data directory"


def _replayer(shard: ShareCoordinatorShard, partition: int) -> Callable[[LogRecord], None]:
    decoder = RecordDecoder()
    decode = decoder.decode
    replay = shard.replay

    def replay_frame(frame: LogRecord) -> None:
        try:
            record = decode(frame.record_type, frame.key, frame.value)
        except RecordDecodeError as exc:
            raise LoadError(
                f"state partition {partition}, offset {frame.offset}: {exc}; {_CHECK_THE_LOG}"
            ) from exc
        replay(frame.offset, record, frame.key)

    return replay_frame


_OPERATIONS: dict[
    Rpc, Callable[[ShareCoordinatorShard, ShareKey, Any], tuple[Record | None, AnyPartitionResult]]
] = {
    Rpc.INITIALIZE: ShareCoordinatorShard.initialize,
    Rpc.READ: ShareCoordinatorShard.read,
    Rpc.WRITE: ShareCoordinatorShard.write,
    Rpc.DELETE: ShareCoordinatorShard.delete,
    Rpc.READ_SUMMARY: ShareCoordinatorShard.read_summary,
}


def _describe_failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
