"""``sharecoord log verify --state-store postgresql://...``: check a PostgreSQL store
without changing it, in one REPEATABLE READ snapshot (persistence/postgres/reading.py),
so a running cluster can be verified.

What can be wrong there (a file's bytes cannot: PostgreSQL checks its own pages), and
what is checked:

* the store itself: every table is there; ``sharecoord_schema`` has its row, at a
  version this sharecoord knows; ``sharecoord_leaders`` has exactly one row per state
  partition (a commit locks its partition's row, a claim updates it: a partition
  without one can never be led); no record nor keys row names a state partition the
  store does not have;
* each state partition: every record decodes and replays through the state rules, in
  offset order (``server.tools.ReplayCheck``, as for a data directory); its offsets
  have no hole above the log start (pruning deletes only from the bottom, a commit
  only adds at the top: a hole is rows deleted by something else, and what a key's
  replay needs may be in it) but where compaction folded the log: below the
  partition's compaction watermark (``sharecoord_history_marks``, where the store
  keeps one), and in and right after a run of snapshots of distinct keys at the
  start of the log, which is what compaction leaves (one snapshot per live key, at
  its last record's offset; every key replays from its own snapshot there, so no
  replay needs what lies between them); and its ``sharecoord_keys`` rows are the records' own:
  a row for each key that has records, none for a key without, each ``since`` the
  offset of the key's last snapshot (``snapshot`` true), or of its first record while
  it has none (a load replays each key from ``since`` on: a wrong one replays too
  little, or replays updates without the snapshot under them).

All rows of a partition are read once, streamed; the keys it tracks are held in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from persistence.frame import LogRecord
from persistence.postgres.reading import StoreSnapshot
from persistence.postgres.schema import SCHEMA_VERSION
from protocol.records import SNAPSHOT_RECORD_TYPE, RecordDecodeError, RecordDecoder
from server.tools import EXIT_FAILURE, EXIT_OK, ReplayCheck, summary

# Lines of one kind of damage said per partition; the rest are counted.
SHOWN = 5


@dataclass
class PartitionCheck:
    partition: int
    record_count: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    damage: list[str] = field(default_factory=list)
    unreplayable: str | None = None

    @property
    def ok(self) -> bool:
        return not self.damage and self.unreplayable is None


@dataclass
class StoreReport:
    where: str
    partitions: list[PartitionCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # about the store itself

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.partitions)


def verify_store(store: StoreSnapshot) -> StoreReport:
    """Every check of the module docstring; never writes."""
    report = StoreReport(store.where)
    if store.missing_tables:
        names = ", ".join(store.table(name) for name in store.missing_tables)
        report.problems.append(f"{names}: missing")
    if "schema" in store.missing_tables:
        return report
    schema_table = store.table("schema")
    if store.version is None or store.num_partitions is None:
        report.problems.append(f"{schema_table}: has no row (the version and partition count)")
        return report
    if store.version != SCHEMA_VERSION:
        report.problems.append(
            f"{schema_table}: version {store.version}; this sharecoord knows version "
            f"{SCHEMA_VERSION}"
            + (" (run a newer sharecoord)" if store.version > SCHEMA_VERSION else "")
        )
        return report
    if store.missing_tables:
        return report
    num_partitions = store.num_partitions
    _check_partition_numbers(store, num_partitions, report)
    for partition in range(num_partitions):
        report.partitions.append(verify_partition(store, partition))
    return report


def _check_partition_numbers(
    store: StoreSnapshot, num_partitions: int, report: StoreReport
) -> None:
    led = set(store.partitions_with_rows("leaders"))
    missing = sorted(set(range(num_partitions)) - led)
    if missing:
        report.problems.append(
            f"{store.table('leaders')}: no row for state partition(s) {_listed(missing)}: "
            "nobody can lead them"
        )
    for table in ("leaders", "records", "keys"):
        outside = [p for p in store.partitions_with_rows(table) if not 0 <= p < num_partitions]
        if outside:
            report.problems.append(
                f"{store.table(table)}: rows of state partition(s) {_listed(outside)}, "
                f"outside 0..{num_partitions - 1}"
            )


def verify_partition(store: StoreSnapshot, partition: int) -> PartitionCheck:
    check = PartitionCheck(partition)
    replay = ReplayCheck()
    holes: list[tuple[int, int]] = []
    first_seen: dict[bytes, int] = {}
    last_snapshot: dict[bytes, int] = {}
    watermark = store.compacted_below(partition)
    folded = True  # every record so far a snapshot of a key not seen before
    for record in store.records(partition):
        gap = check.last_offset is not None and record.offset != check.last_offset + 1
        if gap and not folded and (watermark is None or record.offset > watermark):
            assert check.last_offset is not None
            holes.append((check.last_offset + 1, record.offset - 1))
        folded = folded and record.record_type == SNAPSHOT_RECORD_TYPE
        folded = folded and record.key not in first_seen
        if check.first_offset is None:
            check.first_offset = record.offset
        check.last_offset = record.offset
        check.record_count += 1
        replay.add(record)
        first_seen.setdefault(record.key, record.offset)
        if record.record_type == SNAPSHOT_RECORD_TYPE:
            last_snapshot[record.key] = record.offset
    check.unreplayable = replay.problem
    records = store.table("records")
    for low, high in holes[:SHOWN]:
        span = f"offset {low}" if low == high else f"offsets {low}..{high}"
        check.damage.append(
            f"{records}: {span} missing, above the log start {check.first_offset} (a hole)"
        )
    if len(holes) > SHOWN:
        check.damage.append(f"{records}: and {len(holes) - SHOWN} more holes")
    wrong = list(_key_rows_wrong(store, partition, first_seen, last_snapshot))
    check.damage += [f"{store.table('keys')}: {line}" for line in wrong[:SHOWN]]
    if len(wrong) > SHOWN:
        check.damage.append(f"{store.table('keys')}: and {len(wrong) - SHOWN} more keys")
    return check


def _key_rows_wrong(
    store: StoreSnapshot,
    partition: int,
    first_seen: dict[bytes, int],
    last_snapshot: dict[bytes, int],
) -> Iterator[str]:
    """A line for each key whose keys row is not what its records say."""
    decoder = RecordDecoder()
    rowless = set(first_seen)
    for row in store.key_rows(partition):
        rowless.discard(row.key)
        name = _key_name(decoder, row.key)
        if row.key not in first_seen:
            yield f"key {name} has a row (since {row.since}) but no records"
            continue
        snapshot = last_snapshot.get(row.key)
        since = snapshot if snapshot is not None else first_seen[row.key]
        if (row.since, row.snapshot) != (since, snapshot is not None):
            said = "its last snapshot's" if snapshot is not None else "its first record's"
            yield (
                f"key {name} has since {row.since} (snapshot {str(row.snapshot).lower()}); "
                f"its records say {since}, {said} offset"
            )
    for key in sorted(rowless, key=first_seen.__getitem__):
        yield (
            f"key {_key_name(decoder, key)} has records (the first at offset "
            f"{first_seen[key]}) but no row: a load would not replay it"
        )


def _key_name(decoder: RecordDecoder, key: bytes) -> str:
    try:
        share = decoder.decode_key(key)
    except RecordDecodeError:
        return f"0x{key.hex()}"
    return f"{share.group_id}:{share.topic_id}:{share.partition}"


def _listed(partitions: list[int]) -> str:
    shown = ", ".join(map(str, partitions[:10]))
    return shown + (f" and {len(partitions) - 10} more" if len(partitions) > 10 else "")


def print_report(report: StoreReport, out: TextIO, *, uri_flag: str) -> int:
    """The report as ``log verify`` prints it for a data directory: a line per state
    partition, the verdict line, and the advice when anything is damaged."""
    for problem in report.problems:
        out.write(f"DAMAGED {problem}\n")
    damaged: list[int] = []
    records = 0
    for check in report.partitions:
        records += check.record_count
        if check.ok:
            span = (
                "empty"
                if check.first_offset is None
                else f"offsets {check.first_offset}..{check.last_offset}"
            )
            out.write(f"partition {check.partition}: ok, {check.record_count} records, {span}\n")
            continue
        damaged.append(check.partition)
        for damage in check.damage:
            out.write(f"partition {check.partition}: DAMAGED {damage}\n")
        if check.unreplayable is not None:
            out.write(f"partition {check.partition}: DOES NOT REPLAY {check.unreplayable}\n")
    verdict = summary(report.problems, damaged, len(report.partitions), 0, "the store itself")
    out.write(f"{verdict}, {records} records in {report.where}\n")
    if report.ok:
        return EXIT_OK
    which = str(damaged[0]) if len(damaged) == 1 else "P"
    out.write(
        f"`sharecoord log dump {uri_flag} --partition {which}` prints its records; "
        "docs/operations.md#repairing-a-damaged-partition says how to repair it.\n"
    )
    return EXIT_FAILURE


def records_of(store: StoreSnapshot, partitions: list[int]) -> Iterator[tuple[int, LogRecord]]:
    """(partition, record) of each partition in turn, in offset order."""
    for partition in partitions:
        for record in store.records(partition):
            yield partition, record
