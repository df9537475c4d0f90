"""Checks `sharecoord compact` and `sharecoord audit` make before spark-submit: each
returns None or one line saying what is wrong (the CLI exits 2 with it). No pyspark
here: they run in the CLI's process, before any JVM.
"""

from __future__ import annotations

from persistence import LogError, list_segments, partition_dir, pending_staged, read_meta
from persistence.history import read_declaration, resolve_dir
from spark_jobs import checkpoint


def anything_to_compact(data_dir: str) -> bool:
    """Whether any state partition has a sealed segment, or staged output waits."""
    num_partitions = int(read_meta(data_dir)["num_partitions"])
    for partition in range(num_partitions):
        directory = partition_dir(data_dir, partition)
        if len(list_segments(directory)) > 1 or pending_staged(directory):
            return True
    return False


def history_problem(data_dir: str, history_dir: str | None, retention_ms: int) -> str | None:
    """A --history-dir other than where the data directory already keeps its history."""
    if retention_ms == 0 or history_dir is None:
        return None
    try:
        declared = read_declaration(data_dir)
    except LogError as exc:
        return str(exc)
    wanted = resolve_dir(data_dir, history_dir)
    if declared is not None and declared.root != wanted:
        return (
            f"--history-dir {history_dir}: {data_dir} keeps its history at {declared.root} "
            f"(history.json there); move that directory and remove history.json first"
        )
    return None


def checkpoint_problem(
    out_dir: str, data_dir: str, delivery_limit: int, since_last: bool
) -> str | None:
    return checkpoint.problem(out_dir, data_dir, delivery_limit, since_last)
