"""``spark.read.format("sharecoord").load(DATA_DIR)``: the state log as a DataFrame, one
row per record (spark_jobs/columns.py has the columns), the history and the live log in
one (spark_jobs/logsource.py says how they meet).

    from spark_jobs.datasource import register
    register(spark)                      # once per session
    log = spark.read.format("sharecoord").load("/var/lib/sharecoord")

Over the PostgreSQL store (docs/design.md#the-spark-jobs-on-postgresql), the
store is named by options instead of a path, as ``sharecoord serve`` takes it:

    log = (spark.read.format("sharecoord")
           .option("state_store", "postgresql://sharecoord@db1:5432/sharecoord")
           .option("state_store_schema", "public")      # the default
           .load())

(without a path or ``state_store``, ``SHARECOORD_STATE_STORE`` and
``SHARECOORD_STATE_STORE_SCHEMA`` name it, as for ``sharecoord serve``), the same
columns and rows: the history table below each state partition's watermark
and the records table at and above it, each state partition read by one COPY in one
transaction (psycopg must be importable on the executors: the ``postgres`` extra).

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
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_jobs.columns import SOURCE_DDL
from spark_jobs.logsource import Piece, Source, piece_bytes, plan, read_piece
from spark_jobs.session import register_data_source
from spark_jobs.storeref import STATE_STORE_ENV, StoreRef

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

NAME = "sharecoord"
PARTITIONINGS = ("segment", "state_partition")
DEFAULT_TASK_BYTES = 16 * 1024 * 1024
SCHEMA_ENV = "SHARECOORD_STATE_STORE_SCHEMA"
NO_DRIVER = (
    "this executor's Python cannot import psycopg, which reading a PostgreSQL store "
    "needs: run the executors on a Python with sharecoord's postgres extra, or start the "
    "session with spark_jobs.session.spark_session(..., reads_store=True), which ships "
    "one to a cluster and checks the executors first (docs/operations.md#spark-on-a-cluster)"
)


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
        uri = options.get("state_store")
        if not uri and not path:  # as serve takes it: the environment names the store
            uri = os.environ.get(STATE_STORE_ENV)
        schema = options.get("state_store_schema") or os.environ.get(SCHEMA_ENV) or "public"
        self.store = None if not uri else StoreRef(str(uri), str(schema))
        if not path and self.store is None:
            raise ValueError(
                'the sharecoord format needs a data directory, .load("/data"), or a '
                'PostgreSQL store, .option("state_store", "postgresql://...").load()'
            )
        self.path = str(path or "")
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
        if self.store is not None:
            return self._store_partitions(self.store)
        source = Source.open(self.path, history=self.history)
        wanted = self.partitions_wanted
        if wanted is None:
            wanted = list(range(source.num_partitions))
        pieces = plan(source, wanted, self.after, self.whole)
        if self.whole:
            return [_Pieces([piece]) for piece in pieces]
        return [_Pieces(group) for group in group_pieces(pieces, self.task_bytes)]

    def _store_partitions(self, store: StoreRef) -> list[InputPartition]:
        """A piece per state partition of the store, read whole by one COPY
        (spark_jobs/pgsource.py); with ``segment`` partitioning, as many to a task as
        make about ``task_bytes``."""
        # Only here: the driver (psycopg) is needed on the PostgreSQL store alone.
        from spark_jobs.pgsource import partition_sizes, store_facts  # noqa: PLC0415

        facts = store_facts(store)
        wanted = self.partitions_wanted
        if wanted is None:
            wanted = list(range(facts.num_partitions))
        kept = self.history and facts.history_retention_ms is not None
        pieces = [("store", store, p, self.after.get(p, -1), kept) for p in wanted]
        if self.whole:
            return [_Pieces([piece]) for piece in pieces]
        sizes = partition_sizes(store)
        groups: list[list[Piece]] = [[]]
        filled = 0
        for piece in pieces:
            if groups[-1] and filled >= self.task_bytes:
                groups.append([])
                filled = 0
            groups[-1].append(piece)
            filled += sizes.get(piece[2], 0)
        return [_Pieces(group) for group in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for piece in partition.value:
            if piece[0] == "store":
                _, store, state_partition, after, kept = piece
                read_store = _store_reader()
                yield from read_store(store, state_partition, after, with_history=kept)
            else:
                yield from read_piece(piece)


def _store_reader() -> Callable[..., Iterator[pa.RecordBatch]]:
    """pgsource's reader, imported on the executor: a Python there without psycopg is
    told what to do in the last line of Spark's trace, not as a module missing deep in
    it. (``spark_session(..., reads_store=True)`` checks the executors before any work.)"""
    try:
        from spark_jobs.pgsource import read_partition_batches  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "psycopg":
            raise
        raise RuntimeError(NO_DRIVER) from None
    return read_partition_batches


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
