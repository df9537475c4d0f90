"""The rows of the data source and of the history (spark_jobs/columns.py), without Spark:
the same fields, names and values as `log dump --json`, all from protocol.records.FIELDS,
and the history's files read as they were first written."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import given, settings

from persistence.history import read_exports
from protocol.records import FIELDS, SNAPSHOT_RECORD_TYPE, RecordDecoder, record_row
from spark_jobs import compact, logsource, pgcompact
from spark_jobs.columns import (
    HISTORY_SCHEMA,
    SOURCE_SCHEMA,
    collector_paused,
    decode_values,
    record_batch,
)
from spark_jobs.history import read_export
from spark_jobs.sealed import RawRecord
from spark_jobs.storeref import StoreRef
from tests.spark.histories import decoded, hand_made_records

# A history export written before the data source's columns took the records' names
# (spark_jobs/history.py of that time, through export_segment): a snapshot, an update
# and a tombstone of one key at offsets 0, 1, 2. Its batches column is "batches".
OLD_HISTORY = Path(__file__).parent / "data" / "history-before-rename"


def dump_rows(state_partition: int, records: list[RawRecord]) -> list[dict]:
    """What `log dump --json` prints for `records`."""
    return [
        record_row(state_partition, raw[0], raw[1], record)
        for raw, (_, record) in zip(records, decoded(records), strict=True)
    ]


def source_rows(state_partition: int, records: list[RawRecord]) -> list[dict]:
    """The data source's rows for `records`, timestamps in ms."""
    batch = record_batch(records, decode_values(records), RecordDecoder(), state_partition)
    rows: list[dict] = batch.to_pylist()
    for row in rows:
        row["timestamp"] = int(row["timestamp"].timestamp() * 1000)
    return rows


@settings(max_examples=200, deadline=None)
@given(hand_made_records())
def test_a_data_source_row_is_the_line_log_dump_json_prints(records: list[RawRecord]) -> None:
    rows = source_rows(7, records)
    assert rows == dump_rows(7, records)
    assert all(list(row) == SOURCE_SCHEMA.names for row in rows)


def test_the_columns_are_the_declared_fields_and_the_history_keeps_its_names() -> None:
    assert SOURCE_SCHEMA.names == [f.name for f in FIELDS]
    # The history's files hold every field but the partition (in their directory names),
    # under the names they were first written with.
    assert HISTORY_SCHEMA.names == [f.history_name or f.name for f in FIELDS[1:]]
    assert "batches" in HISTORY_SCHEMA.names


def test_a_history_file_written_before_the_rename_reads_with_the_records_names() -> None:
    (export,) = read_exports(str(OLD_HISTORY), 0)
    (batch,) = read_export(str(OLD_HISTORY), export)
    rows = batch.to_pylist()
    assert batch.schema.names == SOURCE_SCHEMA.names
    assert [row["record_type"] for row in rows] == [
        "ShareSnapshot",
        "ShareUpdate",
        "ShareTombstone",
    ]
    assert rows[0]["state_batches"] == [
        {"first_offset": 100, "last_offset": 104, "delivery_state": 0, "delivery_count": 1}
    ]
    assert [len(row["state_batches"] or []) for row in rows] == [1, 2, 0]
    assert (rows[0]["fence_leader_epoch"], rows[0]["fence_state_epoch"]) == (5, None)
    assert rows[1]["delivery_complete_count"] == 3


def test_a_partitions_compaction_runs_without_the_cyclic_collector_and_puts_it_back() -> None:
    seen = []

    @collector_paused
    def task(fail: bool) -> str:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("the task failed")
        return "done"

    assert gc.isenabled()
    assert task(False) == "done"
    assert gc.isenabled()
    with pytest.raises(ValueError, match="the task failed"):
        task(True)
    assert gc.isenabled()
    gc.disable()
    try:
        task(False)
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()
    assert seen == [False, False, False]
    assert task.__name__ == "task"  # pickled by name where the module is importable


def test_compaction_tasks_and_data_source_rows_run_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = []

    def work(*_: object) -> NoReturn:
        seen.append(gc.isenabled())
        raise ValueError("stop here")

    monkeypatch.setattr(compact, "_compact", work)
    monkeypatch.setattr(pgcompact, "read_log_below_end", work)
    monkeypatch.setattr(logsource, "record_batch", work)
    assert compact.compact_partition("data", 0, 0).status == "failed"
    assert pgcompact.compact_partition(StoreRef("postgresql:///x"), 0, 0, True).status == "failed"
    with pytest.raises(ValueError, match="stop here"):  # the data source's rows
        next(logsource.to_batches([(0, 0, SNAPSHOT_RECORD_TYPE, b"k", None)], 0))
    assert seen == [False, False, False]
    assert gc.isenabled()
