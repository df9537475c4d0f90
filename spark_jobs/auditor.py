"""The audit's replay of one state partition: every record's effect on the state,
compared with the state before it (docs/design.md#the-audit), and the window of the log
it saw. Pure Python, run inside a Spark task; no Spark here.

An auditor can stop and go on: ``dump`` is everything it needs to carry on from the last
record it saw (the replayed state of every key and the running tallies), and
``Auditor.resume`` starts from it. That is what ``sharecoord audit --since-last`` keeps
in its checkpoint: replaying records 0..n in one auditor and replaying 0..k, dumping,
resuming and replaying k+1..n find the same violations.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pyarrow as pa

from persistence import LogError
from protocol.batches import ACQUIRED, AVAILABLE
from protocol.key_state import KeyState, ShareGroupOffset
from protocol.records import (
    FIELDS,
    KEY_FIELDS,
    LOG_OFFSET,
    RECORD_CLASSES,
    RECORD_TYPE,
    SNAPSHOT,
    STATE_BATCHES,
    TIMESTAMP,
    TOMBSTONE,
    UPDATE,
    VALUE_FIELDS,
    FieldType,
    Part,
    Record,
    RecordDecodeError,
    ShareKey,
    ShareTombstone,
)
from protocol.replay import DEFAULT_RECORDS_PER_SNAPSHOT, ShareStateMap
from protocol.state_batch import StateBatch
from spark_jobs.logsource import Source, read_whole_partition
from spark_jobs.storeref import StoreRef

MOST_REDELIVERED = 20
GAPS_KEPT = 20  # gap ranges listed per partition; all are counted

DELIVERY_LIMIT_AVAILABLE = "delivery_limit_available"
DELIVERY_COUNT_BACKWARDS = "delivery_count_backwards"
START_OFFSET_BACKWARDS = "start_offset_backwards"

Piece = tuple[int, int, int, int]  # first, last, delivery_state, delivery_count


@dataclass
class Window:
    """What part of a state partition's log an audit saw: offsets and record times of
    its first and last records, and the offsets missing between (records the history
    never got: folded or pruned before it existed, or expired from it)."""

    first_offset: int | None = None
    last_offset: int | None = None
    first_timestamp: int | None = None
    last_timestamp: int | None = None
    records: int = 0
    missing: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)
    # The offset the first record should have: every log starts at 0, and a run that
    # goes on from a checkpoint starts right after the offset it ended at.
    expected: int = 0

    def see(self, offset: int, timestamp: int) -> None:
        due = self.expected if self.last_offset is None else self.last_offset + 1
        if self.last_offset is None:
            self.first_offset, self.first_timestamp = offset, timestamp
        if offset > due:
            self.missing += offset - due
            if len(self.gaps) < GAPS_KEPT:
                self.gaps.append((due, offset - 1))
        self.last_offset, self.last_timestamp = offset, timestamp
        self.records += 1


@dataclass
class PartitionAudit:
    """One state partition's replay, as rows of the schemas above."""

    partition: int
    records: int = 0
    error: str = ""
    findings: list[tuple[Any, ...]] = field(default_factory=list)
    histogram: list[tuple[str, int, int]] = field(default_factory=list)
    ranges: list[tuple[Any, ...]] = field(default_factory=list)  # the most redelivered
    share_partitions: list[tuple[Any, ...]] = field(default_factory=list)
    window: Window = field(default_factory=Window)  # this run's
    since: Window = field(default_factory=Window)  # every run's since the checkpoint began
    violations_before: dict[str, int] = field(default_factory=dict)  # earlier runs'
    state: bytes = b""  # the auditor's dump, for the next --since-last run
    # What the driver needs of the findings without collecting them all: filled by
    # ``summarized`` in the task, where the findings themselves are dropped.
    finding_counts: dict[str, int] = field(default_factory=dict)
    first_findings: list[tuple[Any, ...]] = field(default_factory=list)

    def summarized(self, sample_rows: int) -> PartitionAudit:
        """This result without its findings, but with their count per kind and the
        first `sample_rows` of them in report order."""
        counts: dict[str, int] = {}
        for finding in self.findings:
            counts[finding[0]] = counts.get(finding[0], 0) + 1
        first = sorted(self.findings, key=finding_order)[:sample_rows]
        return replace(self, findings=[], finding_counts=counts, first_findings=first)


def finding_order(finding: tuple[Any, ...]) -> tuple[Any, ...]:
    """The report's order of findings (FINDINGS_SCHEMA rows): state partition, log offset,
    kind, first offset."""
    return (finding[1], finding[2], finding[0], finding[7])


# -- one partition (runs in an executor) -----------------------------------------------


class Auditor:
    def __init__(self, partition: int, delivery_limit: int) -> None:
        self.partition = partition
        self.delivery_limit = delivery_limit
        self.records = 0
        self.state = ShareStateMap(DEFAULT_RECORDS_PER_SNAPSHOT)
        self.result = PartitionAudit(partition)
        self.histogram: dict[tuple[str, int], int] = {}
        self.log_records: dict[ShareKey, int] = {}
        self.open_range: dict[ShareKey, Piece] = {}  # retired pieces merge while contiguous
        self.redelivered: list[tuple[Any, ...]] = []
        self.window = Window()
        self.since = Window()
        self.violations_before: dict[str, int] = {}
        self._keys: dict[tuple[Any, ...], ShareKey] = {}

    # -- records as the data source gives them ---------------------------------------------

    def replay_batch(self, batch: pa.RecordBatch) -> None:
        """Replay a batch of data source rows (spark_jobs/columns.py), in offset order."""
        columns = {
            f.name: batch.column(f.name).to_pylist()
            for f in FIELDS
            if f.part is not Part.FRAME and f.type is not FieldType.STATE_BATCHES
        }
        for f in (LOG_OFFSET, RECORD_TYPE):
            columns[f.name] = batch.column(f.name).to_pylist()
        stamps = batch.column(TIMESTAMP.name).cast(pa.int64()).to_pylist()
        for index, (offset, record) in enumerate(self._records(batch, columns)):
            self.window.see(offset, stamps[index] // 1000)
            self.since.see(offset, stamps[index] // 1000)
            self.replay(offset, record.key, record)

    def _records(
        self, batch: pa.RecordBatch, c: dict[str, list[Any]]
    ) -> Iterator[tuple[int, Record]]:
        lists = batch.column(STATE_BATCHES.name)
        starts = lists.offsets.to_numpy()
        starts = starts - starts[0]
        flat = lists.flatten()
        fields = [flat.field(i).to_pylist() for i in range(4)]
        firsts, lasts, states, counts = fields
        keys = self._keys
        key_columns = [c[f.name] for f in KEY_FIELDS]
        # Each kind's value fields in its record's order; None stands for the batches.
        value_columns = {
            kind: [None if f is STATE_BATCHES else c[f.name] for f in VALUE_FIELDS[kind]]
            for kind in (SNAPSHOT, UPDATE)
        }
        kinds = c[RECORD_TYPE.name]
        for i, offset in enumerate(c[LOG_OFFSET.name]):
            name = tuple(column[i] for column in key_columns)
            key = keys.get(name)
            if key is None:
                key = keys[name] = ShareKey(*name)
            kind = kinds[i]
            if kind == TOMBSTONE:
                yield offset, ShareTombstone(key)
                continue
            batches = [
                StateBatch(firsts[j], lasts[j], states[j], counts[j])
                for j in range(starts[i], starts[i + 1])
            ]
            values: list[Any] = [
                batches if column is None else column[i] for column in value_columns[kind]
            ]
            yield offset, RECORD_CLASSES[kind](key, *values)

    # -- stopping and going on -------------------------------------------------------------

    def dump(self) -> bytes:
        """Everything the next run needs to go on after the last record seen."""
        counts = dict(self.violations_before)
        for finding in self.result.findings:
            counts[finding[0]] = counts.get(finding[0], 0) + 1
        return _ENCODE(
            _Dump(
                keys=[
                    _KeyDump(
                        key,
                        entry.state,
                        entry.leader_fence,
                        entry.state_fence,
                        entry.update_count,
                        entry.snapshot_offset,
                    )
                    for key, entry in self.state.keys.items()
                ],
                histogram=[(g, c, n) for (g, c), n in self.histogram.items()],
                log_records=list(self.log_records.items()),
                open_range=list(self.open_range.items()),
                redelivered=[tuple(r) for r in self.redelivered],
                since=self.since,
                violations=counts,
            )
        )

    @classmethod
    def resume(cls, partition: int, delivery_limit: int, dumped: bytes | None) -> Auditor:
        auditor = cls(partition, delivery_limit)
        if not dumped:
            return auditor
        try:
            state = _DECODE(dumped)
        except msgspec.MsgspecError as exc:
            raise ValueError(f"the audit checkpoint of partition {partition}: {exc}") from None
        for k in state.keys:
            entry = KeyState(k.state, k.leader_fence, k.state_fence)
            entry.update_count, entry.snapshot_offset = k.update_count, k.snapshot_offset
            auditor.state.keys[k.key] = entry
        auditor.histogram = {(g, c): n for g, c, n in state.histogram}
        auditor.log_records = dict(state.log_records)
        auditor.open_range = dict(state.open_range)
        auditor.redelivered = [tuple(r) for r in state.redelivered]
        auditor.since = state.since
        if state.since.last_offset is not None:
            auditor.window.expected = state.since.last_offset + 1
        auditor.violations_before = dict(state.violations)
        return auditor

    def replay(self, offset: int, key: ShareKey, record: Any) -> None:
        self.records += 1
        self.log_records[key] = self.log_records.get(key, 0) + 1
        before = self.state.get(key)
        previous = before.state if before is not None else None
        clean_before = before is not None and before.batches_clean is True
        self.state.replay(offset, record)
        after = self.state.get(key)
        current = after.state if after is not None else None
        if current is None:  # a tombstone: everything leaves
            if previous is not None:
                self._retire(key, previous.state_batches, [])
            self._close_range(key)
            self.log_records.pop(key, None)
            return
        limit = self.delivery_limit
        if previous is None:
            over_limit = _over_limit(current.state_batches, limit)
        else:
            old: Sequence[StateBatch] = previous.state_batches
            new: Sequence[StateBatch] = current.state_batches
            if clean_before and after is not None and after.batches_clean is True:
                old, new = _differing(old, new)
            self._retire(key, old, new)
            if previous.state_epoch == current.state_epoch:
                self._check_backwards(offset, key, previous, current, old, new)
                over_limit = _minus(_over_limit(new, limit), _over_limit(old, limit))
            else:
                over_limit = _over_limit(current.state_batches, limit)
        for first, last, _, count in over_limit:
            self._finding(DELIVERY_LIMIT_AVAILABLE, offset, key, current, first, last, None, count)

    def _check_backwards(
        self,
        offset: int,
        key: ShareKey,
        previous: ShareGroupOffset,
        current: ShareGroupOffset,
        befores: Sequence[StateBatch],
        afters: Sequence[StateBatch],
    ) -> None:
        """Findings where `current` counts fewer deliveries than `previous` did, or
        starts lower; `befores` and `afters` are their batches (or what differs of
        them: ``_differing``)."""
        # Batches are sorted by first offset: those ending before this `before` starts
        # end before every later one starts too, so the scan resumes past them.
        start = 0
        for before in befores:
            while start < len(afters) and afters[start].last_offset < before.first_offset:
                start += 1
            for after in afters[start:]:
                if after.first_offset > before.last_offset:
                    break
                first = max(before.first_offset, after.first_offset)
                last = min(before.last_offset, after.last_offset)
                if first <= last and after.delivery_count < before.delivery_count:
                    self._finding(
                        DELIVERY_COUNT_BACKWARDS,
                        offset,
                        key,
                        current,
                        first,
                        last,
                        before.delivery_count,
                        after.delivery_count,
                    )
        start_before, start_after = previous.start_offset, current.start_offset
        if 0 <= start_after < start_before:
            self._finding(
                START_OFFSET_BACKWARDS,
                offset,
                key,
                current,
                start_after,
                start_before - 1,
                start_before,
                start_after,
            )

    def _finding(
        self,
        kind: str,
        offset: int,
        key: ShareKey,
        state: ShareGroupOffset,
        first: int,
        last: int,
        previous_value: int | None,
        value: int,
    ) -> None:
        self.result.findings.append(
            (
                kind,
                self.partition,
                offset,
                key.group_id,
                key.topic_id,
                key.partition,
                state.state_epoch,
                first,
                last,
                previous_value,
                value,
            )
        )

    def _retire(
        self, key: ShareKey, before: Sequence[StateBatch], after: Sequence[StateBatch]
    ) -> None:
        """Offsets covered before and not after leave the state with the count they had:
        into the histogram, and into the candidates for the most redelivered."""
        for piece in _minus(_pieces(before), _pieces(after)):
            first, last, state, count = piece
            bucket = (key.group_id, count)
            self.histogram[bucket] = self.histogram.get(bucket, 0) + last - first + 1
            open_piece = self.open_range.get(key)
            if (
                open_piece is not None
                and open_piece[1] + 1 == first
                and open_piece[2:]
                == (
                    state,
                    count,
                )
            ):
                self.open_range[key] = (open_piece[0], last, state, count)
                continue
            self._close_range(key)
            self.open_range[key] = piece

    def _close_range(self, key: ShareKey) -> None:
        piece = self.open_range.pop(key, None)
        if piece is None or piece[3] < 2:  # redelivered: delivered more than once
            return
        first, last, state, count = piece
        self.redelivered.append(
            (key.group_id, key.topic_id, key.partition, first, last, count, state)
        )
        if len(self.redelivered) > 50 * MOST_REDELIVERED:
            self.redelivered = _most_redelivered(self.redelivered)

    def finish(self) -> PartitionAudit:
        """The report: every offset still in the state counted as it stands. Call
        ``dump`` first to go on later: this retires the state into the tallies."""
        result = self.result
        result.records = self.records
        result.window, result.since = self.window, self.since
        result.violations_before = dict(self.violations_before)
        for key, entry in self.state.keys.items():
            state = entry.state
            self._retire(key, state.state_batches, [])
            self._close_range(key)
            in_flight = sum(
                b.last_offset - max(b.first_offset, state.start_offset, 0) + 1
                for b in state.state_batches
                if b.delivery_state in (AVAILABLE, ACQUIRED)
                and b.last_offset >= max(state.start_offset, 0)
            )
            result.share_partitions.append(
                (
                    self.partition,
                    key.group_id,
                    key.topic_id,
                    key.partition,
                    state.state_epoch,
                    state.leader_epoch,
                    state.start_offset,
                    len(state.state_batches),
                    in_flight,
                    state.delivery_complete_count,
                    self.log_records.get(key, 0),
                )
            )
        result.histogram = [(g, c, n) for (g, c), n in sorted(self.histogram.items())]
        result.ranges = _most_redelivered(self.redelivered)
        return result


def _pieces(batches: Sequence[StateBatch]) -> list[Piece]:
    """The batches as ``(first, last, state, count)`` tuples, sorted."""
    return sorted(
        (b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in batches
    )


def _over_limit(batches: Sequence[StateBatch], limit: int) -> list[Piece]:
    return [p for p in _pieces(batches) if p[2] == AVAILABLE and p[3] >= limit]


def _differing(
    old: Sequence[StateBatch], new: Sequence[StateBatch]
) -> tuple[Sequence[StateBatch], Sequence[StateBatch]]:
    """Two clean batch lists (``protocol.batches.is_clean``: valid, sorted, disjoint)
    less the batches both hold at their start and at their end: the same objects, as
    a merge leaves the stored batches it does not reach. Each audit step gives the
    same answer on these as on the whole lists, at the cost of what the update
    changed rather than of the key's every batch: a shared batch covers the same
    offsets before and after, so nothing of it retires, goes backwards or newly
    passes the limit, and, the lists being disjoint, it overlaps no other batch of
    either (tests/spark/test_audit.py holds the two ways equal)."""
    most = min(len(old), len(new))
    head = 0
    while head < most and old[head] is new[head]:
        head += 1
    tail = 0
    while tail < most - head and old[-1 - tail] is new[-1 - tail]:
        tail += 1
    return old[head : len(old) - tail], new[head : len(new) - tail]


def _minus(pieces: list[Piece], remove: list[Piece]) -> list[Piece]:
    """The parts of `pieces` (sorted) not covered by any of `remove`."""
    out: list[Piece] = []
    start = 0  # removals ending before a piece starts end before every later piece too
    for first, last, state, count in pieces:
        cursor = first
        while start < len(remove) and remove[start][1] < first:
            start += 1
        for index in range(start, len(remove)):
            r_first, r_last, _, _ = remove[index]
            if r_first > last:
                break
            if r_last < cursor:
                continue
            if r_first > cursor:
                out.append((cursor, r_first - 1, state, count))
            cursor = max(cursor, r_last + 1)
            if cursor > last:
                break
        if cursor <= last:
            out.append((cursor, last, state, count))
    return out


def _most_redelivered(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=_redelivered_order)[:MOST_REDELIVERED]


def _redelivered_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    group_id, topic_id, partition, first, _, count, _ = row
    return (-count, group_id, topic_id, partition, first)


class _KeyDump(msgspec.Struct, array_like=True):
    key: ShareKey
    state: ShareGroupOffset
    leader_fence: int
    state_fence: int | None
    update_count: int | None
    snapshot_offset: int | None


class _Dump(msgspec.Struct):
    keys: list[_KeyDump]
    histogram: list[tuple[str, int, int]]
    log_records: list[tuple[ShareKey, int]]
    open_range: list[tuple[ShareKey, tuple[int, int, int, int]]]
    redelivered: list[tuple[str, str, int, int, int, int, int]]
    since: Window
    violations: dict[str, int]


_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.Decoder(_Dump).decode


# -- one partition (runs in an executor) -----------------------------------------------


def audit_partition(
    data_dir: str | StoreRef,
    partition: int,
    delivery_limit: int,
    prior: bytes | None = None,
    *,
    history: bool = True,
    keep_state: bool = False,
) -> PartitionAudit:
    """Replay one state partition of a data directory or a PostgreSQL store (its
    records after `prior`'s, if given, going on from its state) and audit every
    record's effect. The log's own problems come back as the result's error, never
    raised."""
    auditor = Auditor.resume(partition, delivery_limit, prior)
    after = -1 if auditor.since.last_offset is None else auditor.since.last_offset
    try:
        for batch in _partition_batches(data_dir, partition, after, history):
            auditor.replay_batch(batch)
    except (LogError, RecordDecodeError, OSError, TypeError, ValueError) as exc:
        return PartitionAudit(partition, auditor.records, f"{type(exc).__name__}: {exc}")
    state = auditor.dump() if keep_state else b""
    result = auditor.finish()
    result.state = state
    return result


def _partition_batches(
    data_dir: str | StoreRef, partition: int, after: int, history: bool
) -> Iterator[pa.RecordBatch]:
    if isinstance(data_dir, StoreRef):
        # Only here: the driver (psycopg) is needed on the PostgreSQL store alone.
        from spark_jobs.pgsource import read_partition_batches  # noqa: PLC0415

        yield from read_partition_batches(data_dir, partition, after, with_history=history)
    else:
        yield from read_whole_partition(Source.open(data_dir, history=history), partition, after)


def replay_records(auditor: Auditor, records: Iterable[tuple[int, int, Record]]) -> None:
    """(offset, timestamp, record) into an auditor: for tests."""
    for offset, timestamp, record in records:
        auditor.window.see(offset, timestamp)
        auditor.since.see(offset, timestamp)
        auditor.replay(offset, record.key, record)
