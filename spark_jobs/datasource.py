"""``spark.read.format("sharecoord").load(DATA_DIR)``: the state log as a DataFrame, one
row per record (spark_jobs/columns.py has the columns), the history and the live log in
one (spark_jobs/logsource.py says how they meet).

    from spark_jobs.datasource import register
    register(spark)                      # once per session
    log = spark.read.format("sharecoord").load("/var/lib/sharecoord")

Options:

* ``history`` (default true): false reads the live log alone;
* ``partitions``: state partitions to read, e.g. ``"0,7"`` (default: all);
* ``after``: JSON ``{"<p>": offset}``, only records above that offset (what an
  incremental audit reads);
* ``partitioning``: ``segment`` (default: history exports and segments spread over the
  tasks, about ``task_bytes`` (default 16 MiB) of files each) or ``state_partition`` (a
  task per state partition, its records in offset order).

The executors need this package (``sharecoord`` ships it with ``--py-files``) and
pyarrow: the Python Data Source API hands rows to the JVM as Arrow batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_jobs.columns import SOURCE_DDL
from spark_jobs.logsource import Piece, Source, piece_bytes, plan, read_piece
from spark_jobs.session import register_data_source

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

NAME = "sharecoord"
PARTITIONINGS = ("segment", "state_partition")
DEFAULT_TASK_BYTES = 16 * 1024 * 1024


class ShareLogDataSource(DataSource):
    """The ``sharecoord`` format."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return ShareLogReader(dict(self.options))


class _Pieces(InputPartition):
    """What one Spark task reads: a few pieces (logsource.Piece), in order."""

    def __init__(self, pieces: list[Piece]) -> None:
        super().__init__(pieces)


class ShareLogReader(DataSourceReader):
    def __init__(self, options: dict[str, Any]) -> None:
        path = options.get("path")
        if not path:
            raise ValueError('the sharecoord format needs a data directory: .load("/data")')
        self.path = str(path)
        self.history = str(options.get("history", "true")).strip().lower() != "false"
        partitioning = str(options.get("partitioning", "segment")).strip().lower()
        if partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be one of {', '.join(PARTITIONINGS)}")
        self.whole = partitioning == "state_partition"
        self.after = {int(p): int(o) for p, o in json.loads(options.get("after") or "{}").items()}
        self.task_bytes = int(options.get("task_bytes") or DEFAULT_TASK_BYTES)
        chosen = str(options.get("partitions") or "").strip()
        self.partitions_wanted = [int(p) for p in chosen.split(",")] if chosen else None

    def partitions(self) -> list[InputPartition]:
        source = Source.open(self.path, history=self.history)
        wanted = self.partitions_wanted
        if wanted is None:
            wanted = list(range(source.num_partitions))
        pieces = plan(source, wanted, self.after, self.whole)
        if self.whole:
            return [_Pieces([piece]) for piece in pieces]
        return [_Pieces(group) for group in group_pieces(pieces, self.task_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for piece in partition.value:
            yield from read_piece(piece)


def group_pieces(pieces: list[Piece], task_bytes: int) -> list[list[Piece]]:
    """Consecutive pieces in groups of about `task_bytes`: a Spark task costs a Python
    worker's round trip (a few hundred milliseconds on two busy cores), more than
    reading a small segment."""
    groups: list[list[Piece]] = [[]]
    filled = 0
    for piece in pieces:
        if groups[-1] and filled >= task_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(piece)
        filled += piece_bytes(piece)
    return groups


def register(spark: SparkSession) -> None:
    """Make ``format("sharecoord")`` known to this session, its Python workers running
    this environment (spark_jobs/session.py says how, and when it cannot)."""
    register_data_source(spark, ShareLogDataSource)
