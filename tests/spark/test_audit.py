"""The audit job: the violations a log holds are reported exactly, a clean log reports
none, and the report files are written."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from protocol.batches import is_clean
from protocol.records import Record, ShareKey, ShareSnapshot, ShareTombstone, ShareUpdate
from protocol.state_batch import StateBatch
from spark_jobs import audit, logsource
from spark_jobs import auditor as auditor_module
from spark_jobs.audit import (
    DELIVERY_COUNT_BACKWARDS,
    DELIVERY_LIMIT_AVAILABLE,
    FINDINGS_SCHEMA,
    RANGES_SCHEMA,
    SHARE_PARTITIONS_SCHEMA,
    START_OFFSET_BACKWARDS,
    audit_partition,
    delivery_histogram,
    most_redelivered,
    share_partition_rows,
)
from spark_jobs.audit_report import CHART_PNG, DETAIL_TABLE, INDEX_HTML, SUMMARY_JSON
from spark_jobs.auditor import Auditor, PartitionAudit, replay_records
from spark_jobs.sealed import RawRecord
from tests.spark.histories import (
    BASE_TIME_MS,
    Appended,
    decoded,
    hand_made_records,
    raw_records,
    rpc_histories,
    run_rpcs,
    state_partition_of,
    write_log,
)

NUM_PARTITIONS = 2
TOPIC = "AAAAAAAAAAAAAAAAAAAAAQ"
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def key(name: str) -> ShareKey:
    return ShareKey(name, TOPIC, 0)


def snap(k: ShareKey, state_epoch: int, start: int, *batches: StateBatch) -> ShareSnapshot:
    return ShareSnapshot(k, 0, state_epoch, 0, start, 1, 1, list(batches), -1, 0, state_epoch)


def upd(k: ShareKey, start: int, *batches: StateBatch) -> ShareUpdate:
    return ShareUpdate(k, 0, 0, start, list(batches), -1)


def b(first: int, last: int, state: int, count: int) -> StateBatch:
    return StateBatch(first, last, state, count)


def build(data_dir: str, records: Sequence[Record], segment_bytes: int = 400) -> list[Appended]:
    """Write `records` in this order, each to its key's state partition."""
    appended = appended_of(records)
    write_log(data_dir, appended, NUM_PARTITIONS, segment_bytes)
    return appended


def appended_of(records: Sequence[Record]) -> list[Appended]:
    """`records` in this order, each at the next offset of its key's state partition."""
    offsets = [0] * NUM_PARTITIONS
    appended = []
    for i, record in enumerate(records):
        p = state_partition_of(record.key, NUM_PARTITIONS)
        appended.append(Appended(p, offsets[p], BASE_TIME_MS + i, record))
        offsets[p] += 1
    return appended


def at(appended: list[Appended], record: Record) -> tuple[int, int]:
    """(state partition, log offset) of a record."""
    (item,) = [a for a in appended if a.record is record]
    return item.state_partition, item.offset


COUNTS, START, LIMIT, EPOCH, GONE = (key(n) for n in ("counts", "start", "limit", "epoch", "gone"))
# Each record that should be reported, by name.
counts_back = snap(COUNTS, 1, 0, b(0, 9, AVAILABLE, 1))
start_back = upd(START, 12)
limit_first = upd(LIMIT, -1, b(20, 24, AVAILABLE, 5))
limit_again = upd(LIMIT, -1, b(30, 30, AVAILABLE, 7))
ANOMALOUS_LOG: list[Record] = [
    snap(COUNTS, 1, 0, b(0, 9, AVAILABLE, 2)),
    upd(COUNTS, -1, b(0, 4, ACQUIRED, 3)),
    counts_back,  # 0..4 from 3 to 1 and 5..9 from 2 to 1, same state epoch
    snap(START, 1, 10),
    upd(START, 15),
    start_back,  # 15 -> 12 within state epoch 1
    snap(START, 2, 0),  # a new state epoch may start anywhere
    snap(LIMIT, 1, 0),
    limit_first,  # Available at the limit: reported once ...
    upd(LIMIT, -1, b(20, 22, ACKNOWLEDGED, 5)),  # ... not again while 23..24 stay so
    upd(LIMIT, -1, b(25, 29, ARCHIVED, 9), b(31, 31, AVAILABLE, 4)),  # archived, or under
    limit_again,
    snap(EPOCH, 1, 0, b(0, 9, AVAILABLE, 3)),
    snap(EPOCH, 2, 0, b(0, 9, AVAILABLE, 1)),  # a new state epoch resets counts
    snap(GONE, 1, 0, b(0, 9, AVAILABLE, 4)),
    ShareTombstone(GONE),
    snap(GONE, 1, 0, b(0, 9, AVAILABLE, 1)),  # after a delete: a new history
]


def expected_findings(appended: list[Appended]) -> list[tuple[object, ...]]:
    def row(
        kind: str, record: Record, epoch: int, first: int, last: int, before: int | None, after: int
    ) -> tuple[object, ...]:
        p, offset = at(appended, record)
        k = record.key
        return (
            kind,
            p,
            offset,
            k.group_id,
            k.topic_id,
            k.partition,
            epoch,
            first,
            last,
            before,
            after,
        )

    return [
        row(DELIVERY_COUNT_BACKWARDS, counts_back, 1, 0, 4, 3, 1),
        row(DELIVERY_COUNT_BACKWARDS, counts_back, 1, 5, 9, 2, 1),
        row(START_OFFSET_BACKWARDS, start_back, 1, 12, 14, 15, 12),
        row(DELIVERY_LIMIT_AVAILABLE, limit_first, 1, 20, 24, None, 5),
        row(DELIVERY_LIMIT_AVAILABLE, limit_again, 1, 30, 30, None, 7),
    ]


def test_the_violations_in_a_log_are_reported_exactly(data_dir: str) -> None:
    appended = build(data_dir, ANOMALOUS_LOG)
    found = []
    for p in range(NUM_PARTITIONS):
        result = audit_partition(data_dir, p, delivery_limit=5)
        assert result.error == ""
        found.extend(result.findings)
    assert sorted(found, key=repr) == sorted(expected_findings(appended), key=repr)


def test_the_delivery_limit_is_a_setting(data_dir: str) -> None:
    build(data_dir, ANOMALOUS_LOG)
    kinds = [
        (f[0], f[7], f[8])
        for p in range(NUM_PARTITIONS)
        for f in audit_partition(data_dir, p, delivery_limit=7).findings
        if f[0] == DELIVERY_LIMIT_AVAILABLE
    ]
    assert kinds == [(DELIVERY_LIMIT_AVAILABLE, 30, 30)]


def test_offsets_count_once_in_the_histogram_with_the_count_they_left_with(data_dir: str) -> None:
    k = key("histogram")
    build(
        data_dir,
        [
            snap(k, 1, 0, b(0, 9, ACKNOWLEDGED, 1)),
            upd(k, 5),  # 0..4 leave the state with count 1
            upd(k, -1, b(5, 9, AVAILABLE, 2), b(10, 11, ACQUIRED, 3)),
        ],
    )
    result = audit_partition(data_dir, state_partition_of(k, NUM_PARTITIONS), delivery_limit=5)
    assert result.histogram == [("histogram", 1, 5), ("histogram", 2, 5), ("histogram", 3, 2)]
    assert result.ranges == [
        ("histogram", TOPIC, 0, 10, 11, 3, ACQUIRED),
        ("histogram", TOPIC, 0, 5, 9, 2, AVAILABLE),
    ]
    (summary,) = result.share_partitions
    # state partition, group, topic, partition, state epoch, leader epoch, start offset,
    # batches, in flight (Available or Acquired), delivery complete count, log records
    assert summary[1:] == ("histogram", TOPIC, 0, 1, 0, 5, 2, 7, -1, 3)


def test_a_frame_being_written_at_the_end_is_left_out(data_dir: str) -> None:
    k = key("tail")
    appended = build(data_dir, [snap(k, 1, 0, b(0, 1, AVAILABLE, 9))], segment_bytes=10**6)
    p = appended[0].state_partition
    directory = os.path.join(data_dir, "partitions", str(p))
    (segment,) = os.listdir(directory)
    with open(os.path.join(directory, segment), "ab") as f:
        f.write(b"\x00\x00\x00\x40\x12\x34")  # the start of a frame still being written
    result = audit_partition(data_dir, p, delivery_limit=5)
    assert (result.error, result.records, len(result.findings)) == ("", 1, 1)


def test_a_damaged_partition_is_reported_as_unreadable(data_dir: str) -> None:
    k = key("damaged")
    appended = build(data_dir, [snap(k, 1, 0), snap(k, 1, 1)], segment_bytes=10**6)
    p = appended[0].state_partition
    directory = os.path.join(data_dir, "partitions", str(p))
    (segment,) = os.listdir(directory)
    with open(os.path.join(directory, segment), "r+b") as f:
        f.seek(40)
        f.write(b"\xff")
    result = audit_partition(data_dir, p, delivery_limit=5)
    assert result.error.startswith("LogCorruptionError")


# -- the DataFrame transforms ------------------------------------------------------------


def test_delivery_histogram_sums_offsets_per_group_and_count() -> None:
    rows = [("g2", 1, 5), ("g1", 2, 3), ("g1", 2, 4), ("g1", 1, 1)]
    assert delivery_histogram(rows) == [
        {"group_id": "g1", "delivery_count": 1, "offsets": 1},
        {"group_id": "g1", "delivery_count": 2, "offsets": 7},
        {"group_id": "g2", "delivery_count": 1, "offsets": 5},
    ]


def test_most_redelivered_orders_by_count_then_key() -> None:
    rows = [
        ("g1", TOPIC, 0, 10, 19, 3, 0),
        ("g2", TOPIC, 1, 0, 0, 9, 4),
        ("g1", TOPIC, 0, 0, 4, 3, 1),
        ("g0", TOPIC, 0, 7, 7, 2, 0),
    ]
    names = RANGES_SCHEMA.fieldNames()
    expected = [dict(zip(names, rows[i], strict=True)) for i in (1, 2, 0)]
    assert most_redelivered(rows, limit=3) == expected


def test_the_small_tables_sort_as_spark_would(spark: SparkSession) -> None:
    """The driver sorts the small tables in Python: the same order as Spark's orderBy,
    non-ASCII ids included (both compare strings by code point)."""
    rows = [
        (0, "gé", TOPIC, 1, 1, 1, 0, 0, 0, 0, 1),
        (1, "g", TOPIC, 2, 1, 1, 0, 0, 0, 0, 1),
        (1, "g\U0001f600", TOPIC, 0, 1, 1, 0, 0, 0, 0, 1),
        (0, "g", "B" + TOPIC[1:], 0, 1, 1, 0, 0, 0, 0, 1),
        (1, "G", TOPIC, 0, 1, 1, 0, 0, 0, 0, 1),
    ]
    frame = spark.createDataFrame(rows, SHARE_PARTITIONS_SCHEMA)
    in_spark = [r.asDict() for r in frame.orderBy("group_id", "topic_id", "partition").collect()]
    assert share_partition_rows(rows) == in_spark


# -- the whole job ---------------------------------------------------------------------


def run_audit(spark: SparkSession, data_dir: str, out: Path, limit: int = 5) -> int:
    argv = ["--data-dir", data_dir, "--out", str(out), "--delivery-limit", str(limit)]
    return audit.main(argv, spark=spark)


def test_the_job_writes_the_violations_table_and_exits_1(
    spark: SparkSession, data_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    appended = build(data_dir, ANOMALOUS_LOG)
    out = tmp_path / "audit"

    assert run_audit(spark, data_dir, out) == audit.EXIT_FAILURE

    table = spark.read.parquet(str(out / DETAIL_TABLE))
    expected = spark.createDataFrame(expected_findings(appended), FINDINGS_SCHEMA)
    assertDataFrameEqual(table, expected)
    summary = json.loads((out / SUMMARY_JSON).read_text())
    assert summary["violations"] == 5
    assert summary["violation_counts"] == {
        DELIVERY_COUNT_BACKWARDS: 2,
        DELIVERY_LIMIT_AVAILABLE: 2,
        START_OFFSET_BACKWARDS: 1,
    }
    assert len(summary["violation_sample"]) == 5
    assert summary["records"] == len(ANOMALOUS_LOG)
    assert {s["group_id"] for s in summary["share_partitions"]} == {
        "counts", "start", "limit", "epoch", "gone",
    }  # fmt: skip
    page = (out / INDEX_HTML).read_text()
    assert "violations found" in page and START_OFFSET_BACKWARDS in page
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("audit result: ")]
    assert "5 violations" in line


def test_a_clean_log_reports_no_violation_and_exits_0(
    spark: SparkSession, data_dir: str, tmp_path: Path
) -> None:
    k, other = key("clean"), ShareKey("clean-2", TOPIC, 3)
    build(
        data_dir,
        [
            snap(k, 1, 0),
            upd(k, 0, b(0, 9, ACQUIRED, 1)),
            upd(k, -1, b(0, 4, ACKNOWLEDGED, 1), b(5, 9, AVAILABLE, 1)),
            upd(k, 5, b(5, 9, ACQUIRED, 2)),
            snap(other, 3, 100, b(100, 120, AVAILABLE, 4)),
            upd(other, 110, b(110, 120, ARCHIVED, 5)),
        ],
    )
    out = tmp_path / "audit"

    assert run_audit(spark, data_dir, out) == audit.EXIT_OK

    summary = json.loads((out / SUMMARY_JSON).read_text())
    assert (summary["violations"], summary["violation_counts"], summary["damaged"]) == (0, {}, [])
    assert spark.read.parquet(str(out / DETAIL_TABLE)).count() == 0
    assert (out / CHART_PNG).read_bytes().startswith(PNG_MAGIC)
    page = (out / INDEX_HTML).read_text()
    assert f'<img src="{CHART_PNG}"' in page
    assert f'href="{DETAIL_TABLE}"' in page and f'href="{SUMMARY_JSON}"' in page
    assert "sharecoord audit: clean" in page
    histogram = {(h["group_id"], h["delivery_count"]): h["offsets"] for h in summary["histogram"]}
    assert histogram == {("clean", 1): 5, ("clean", 2): 5, ("clean-2", 4): 10, ("clean-2", 5): 11}


def test_a_partition_swapped_while_it_is_read_is_read_again(
    data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    appended = build(data_dir, ANOMALOUS_LOG)
    real = logsource.os.open
    calls = []

    def vanishing_once(path: str, flags: int, *rest: int) -> int:
        # A prune or a compaction swap removed a segment between listing and opening.
        if path.endswith(".log"):
            calls.append(path)
            if len(calls) == 1:
                raise FileNotFoundError(path)
        return real(path, flags, *rest)

    monkeypatch.setattr(logsource.os, "open", vanishing_once)
    p = appended[0].state_partition
    result = audit_partition(data_dir, p, delivery_limit=5)
    assert result.error == ""
    assert result.records == sum(a.state_partition == p for a in appended)


@settings(max_examples=400, deadline=None)
@given(
    records=st.one_of(
        rpc_histories.map(lambda ops: raw_records(run_rpcs(ops, 1, 5))), hand_made_records()
    ),
    limit=st.integers(1, 4),
)
def test_auditing_what_each_update_changed_answers_as_auditing_every_batch(
    records: list[RawRecord], limit: int
) -> None:
    # The audit diffs only the batches an update changed when both states are clean
    # (auditor._differing); the same history audited with every batch diffed must give
    # the same findings, histogram, ranges and share-partitions.
    replayed = [
        (offset, timestamp, record)
        for (offset, record), (_, timestamp, *_) in zip(decoded(records), records, strict=True)
    ]

    def audited() -> PartitionAudit:
        auditor = Auditor(0, limit)
        for offset, timestamp, record in replayed:
            replay_records(auditor, [(offset, timestamp, record)])
            entry = auditor.state.get(record.key)
            if entry is not None and entry.batches_clean is True:
                assert is_clean(entry.state.state_batches)  # what the shortcut relies on
        return auditor.finish()

    shortcut = audited()
    with mock.patch.object(auditor_module, "_differing", lambda old, new: (old, new)):
        whole = audited()
    assert shortcut.findings == whole.findings
    assert shortcut.histogram == whole.histogram
    assert shortcut.ranges == whole.ranges
    assert shortcut.share_partitions == whole.share_partitions


def test_an_update_is_diffed_by_the_batches_it_changed() -> None:
    shared = [b(i * 10, i * 10 + 4, ACKNOWLEDGED, 1) for i in range(5)]
    changed, replacement = b(50, 54, ACQUIRED, 1), b(50, 54, AVAILABLE, 3)
    old, new = (*shared[:3], changed, *shared[3:]), (*shared[:3], replacement, *shared[3:])
    assert auditor_module._differing(old, new) == ((changed,), (replacement,))
    assert auditor_module._differing(old, old) == ((), ())
    grown = (*old, b(60, 60, ACQUIRED, 1))
    assert auditor_module._differing(old, grown) == ((), (grown[-1],))
