"""Writing and reading the history's Parquet files (layout and markers:
persistence/history.py).

An export writes one segment's records at or above the partition's watermark, one
Parquet file per UTC day they fall on, each through a temporary name and a rename, and
then the segment's marker. A crash before the marker leaves files no reader looks at
(readers go by markers) and that the next export of the same segment overwrites with the
same bytes; a crash after it leaves a finished export, which the next exporter skips.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from persistence.history import (
    MS_PER_DAY,
    ExportedFile,
    SegmentExport,
    data_path,
    day_of,
    make_dirs,
    publish,
    temp_name,
    write_marker,
)
from protocol.records import FIELDS, LOG_OFFSET, STATE_PARTITION, RecordDecoder
from spark_jobs.columns import (
    HISTORY_FIELDS,
    HISTORY_SCHEMA,
    SOURCE_SCHEMA,
    DecodedValues,
    record_batch,
)
from spark_jobs.sealed import RawRecord

# Small row groups would make a day's file slow to scan; one segment is at most
# segment_bytes (100 MiB by default) of frames, so a row group per file is plenty.
_ROW_GROUP_ROWS = 1 << 20


@dataclass(frozen=True)
class SegmentRecords:
    """One sealed segment as an exporter has it: its fingerprint and its records."""

    name: str  # the segment file's name, <base>.log
    fingerprint: str
    records: Sequence[RawRecord]
    decoded: DecodedValues


def export_segment(
    root: str,
    partition: int,
    segment: SegmentRecords,
    watermark: int,
    decoder: RecordDecoder,
) -> SegmentExport:
    """Write the history of one segment (its records at or above `watermark`) and then
    its marker; returns the marker."""
    records = segment.records
    start = _first_at_or_above(records, watermark)
    files: list[ExportedFile] = []
    timestamps = np.array([r[1] for r in records[start:]], dtype=np.int64)
    if start < len(records):
        batch = record_batch(records, segment.decoded, decoder).slice(start)
        days = np.floor_divide(timestamps, MS_PER_DAY)
        for day_number in np.unique(days):
            rows = batch.filter(pa.array(days == day_number))
            day = day_of(int(day_number) * MS_PER_DAY)
            files.append(_write_day(root, partition, day, segment.fingerprint, rows))
    export = SegmentExport(
        partition=partition,
        segment=segment.fingerprint,
        first_offset=records[0][0] if records else None,
        last_offset=records[-1][0] if records else None,
        records=len(records) - start,
        files=tuple(files),
        min_timestamp=int(timestamps.min()) if len(timestamps) else None,
        max_timestamp=int(timestamps.max()) if len(timestamps) else None,
        exported_at=time.time_ns() // 1_000_000,
    )
    write_marker(root, export)
    return export


def _first_at_or_above(records: Sequence[RawRecord], offset: int) -> int:
    low, high = 0, len(records)
    while low < high:
        middle = (low + high) // 2
        if records[middle][0] < offset:
            low = middle + 1
        else:
            high = middle
    return low


def _write_day(
    root: str, partition: int, day: str, fingerprint: str, rows: pa.RecordBatch
) -> ExportedFile:
    path = data_path(root, partition, day, fingerprint)
    make_dirs(os.path.dirname(path))
    temp = temp_name(path)
    try:
        pq.write_table(pa.Table.from_batches([rows]), temp, row_group_size=_ROW_GROUP_ROWS)
        publish(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    offsets = rows.column(LOG_OFFSET.name)
    return ExportedFile(
        path=os.path.relpath(path, root),
        day=day,
        records=rows.num_rows,
        first_offset=offsets[0].as_py(),
        last_offset=offsets[-1].as_py(),
    )


def read_export(
    root: str, export: SegmentExport, after: int = -1, below: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The records of one export with an offset above `after` (and below `below`), in
    offset order, as data source rows. A file retention removed meanwhile is skipped:
    its records are gone, and the reader's gap accounting says so."""
    tables = []
    for exported in export.files:
        if exported.last_offset <= after or (below is not None and exported.first_offset >= below):
            continue
        try:
            tables.append(pq.read_table(os.path.join(root, exported.path), schema=HISTORY_SCHEMA))
        except FileNotFoundError:
            continue
    if not tables:
        return
    # The files' own column names, where they differ, become the rows'.
    table = pa.concat_tables(tables).rename_columns([f.name for f in HISTORY_FIELDS])
    offsets = LOG_OFFSET.name
    if len(tables) > 1:
        table = table.sort_by(offsets)
    mask = pc.greater(table.column(offsets), after)
    if below is not None:
        mask = pc.and_(mask, pc.less(table.column(offsets), below))
    table = table.filter(mask)
    if table.num_rows == 0:
        return
    partition_column = pa.array(np.full(table.num_rows, export.partition, dtype=np.int32))
    at = FIELDS.index(STATE_PARTITION)
    table = table.add_column(at, SOURCE_SCHEMA.field(at), partition_column)
    yield from table.combine_chunks().to_batches()
