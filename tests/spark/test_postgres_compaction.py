"""Compaction on the PostgreSQL store, its transaction alone (spark_jobs/pgcompact.py;
the job through Spark is in test_postgres_jobs.py): the state a node loads afterwards
is the state before, every record is in exactly one of the log and the history, a
swap that lost a race with a new epoch or another compaction is refused and changes
nothing, a prune between the read and the swap is folded again, and pruning with the
history kept moves what it deletes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from protocol.records import ShareKey, ShareTombstone
from spark_jobs import pgcompact
from spark_jobs.pgsource import read_log_below_end, read_partition
from tests.postgres import PostgresServer
from tests.spark.histories import (
    raw_records,
    rpc_histories,
    run_rpcs,
    state_partition_of,
)
from tests.spark.pg_stores import PgLog, prune_as_the_daemon_does, write_store
from tests.spark.test_audit import AVAILABLE, appended_of, b, key, snap, upd
from tests.spark.test_audit import NUM_PARTITIONS as PLANTED_PARTITIONS
from tests.spark.test_history import planted_log_records

NUM_PARTITIONS = 3
NEVER = -(2**62)  # a tombstone cutoff that keeps every tombstone


def keep_history(log: PgLog) -> None:
    """Declare the history as the compaction job does (for ever)."""
    log.execute("UPDATE {schema}.sharecoord_schema SET history_retention_ms = -1")


def compact_all(log: PgLog, keep: bool = True) -> list[pgcompact.PgPartitionCompaction]:
    return [
        pgcompact.compact_partition(log.store, p, NEVER, keep) for p in range(log.num_partitions)
    ]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(rpc_histories)
def test_a_compacted_store_loads_to_the_state_it_had_and_keeps_every_record_once(
    postgres: PostgresServer, ops: list
) -> None:
    log = write_store(postgres, run_rpcs(ops, NUM_PARTITIONS, 3), NUM_PARTITIONS)
    keep_history(log)
    before = log.states()
    results = compact_all(log)
    assert all(r.status in ("compacted", "skipped") for r in results), results
    assert log.states() == before
    log.every_record_once()
    log.keys_point_at_last_snapshots()
    # Twice is the same as once: the folded log folds to itself.
    compact_all(log)
    assert log.states() == before
    log.every_record_once()
    for p in range(NUM_PARTITIONS):
        assert read_partition(log.store, p) == raw_records(
            a for a in log.written if a.state_partition == p
        )


def test_without_a_history_compaction_moves_nothing_and_keeps_the_state(
    postgres: PostgresServer,
) -> None:
    log = write_store(postgres, planted_log_records()[0], PLANTED_PARTITIONS)
    before = log.states()
    results = compact_all(log, keep=False)
    assert any(r.status == "compacted" for r in results)
    assert log.states() == before
    assert log.execute("SELECT count(*) FROM {schema}.sharecoord_history") == "0"


def test_a_swap_after_the_epoch_moved_is_refused_and_changes_nothing(
    postgres: PostgresServer,
) -> None:
    log = write_store(postgres, planted_log_records()[0], PLANTED_PARTITIONS)
    keep_history(log)
    p = log.written[0].state_partition
    read = read_log_below_end(log.store, p)
    folded = pgcompact.fold(read.records, NEVER)
    # A new leader claims the partition (the lease of the test's node is handed over).
    log.execute(
        "UPDATE {schema}.sharecoord_leaders SET epoch = epoch + 1, node_id = 7 "
        f"WHERE state_partition = {p}"
    )
    records = log.rows("records", p)
    with pytest.raises(pgcompact.Refused, match="epoch moved"):
        pgcompact.swap(log.store, p, read, folded, NEVER, True)
    assert log.rows("records", p) == records
    assert log.rows("history", p) == [] and log.watermark(p) == 0
    # Through the task's entry point: one line, the status "refused".
    result = pgcompact.compact_partition(log.store, p, NEVER, True)
    assert result.status == "compacted"  # a fresh read under the new epoch goes through


def test_a_swap_after_another_compaction_is_refused_and_changes_nothing(
    postgres: PostgresServer,
) -> None:
    # Both keys end in updates: the other compaction's folded snapshots differ from the
    # records at their offsets (a fold that ends in a key's snapshot keeps its bytes).
    records = [a.record for a in planted_log_records()[0]]
    records += [upd(key("filler"), -1, b(60, 60, AVAILABLE, 1)), upd(key("victim"), 25)]
    log = write_store(postgres, appended_of(records), PLANTED_PARTITIONS)
    keep_history(log)
    p = log.written[0].state_partition
    first = read_log_below_end(log.store, p)
    second = read_log_below_end(log.store, p)
    pgcompact.swap(log.store, p, second, pgcompact.fold(second.records, NEVER), NEVER, True)
    after_second = (log.rows("records", p), log.rows("history", p))
    with pytest.raises(pgcompact.Refused, match="changed while it was compacted"):
        pgcompact.swap(log.store, p, first, pgcompact.fold(first.records, NEVER), NEVER, True)
    assert (log.rows("records", p), log.rows("history", p)) == after_second
    log.every_record_once()


def test_a_prune_between_the_read_and_the_swap_is_folded_again(postgres: PostgresServer) -> None:
    planted = planted_log_records()[0]
    p = planted[0].state_partition
    # A share-partition deleted early: its tombstone is what the prune takes, and a fold
    # of the whole read would put it back.
    gone = next(k for k in map(key, (f"gone-{i}" for i in range(99))) if partition_of(k) == p)
    records = [snap(gone, 1, 0), ShareTombstone(gone), *(a.record for a in planted)]
    log = write_store(postgres, appended_of(records), PLANTED_PARTITIONS)
    keep_history(log)
    before = log.states()
    read = read_log_below_end(log.store, p)
    folded = pgcompact.fold(read.records, NEVER)
    pruned_below = prune_as_the_daemon_does(log, p)
    assert pruned_below > 2
    result = pgcompact.swap(log.store, p, read, folded, NEVER, True)
    assert result.records_before == len([r for r in read.records if r[0] >= pruned_below])
    assert min(r[0] for r in log.rows("records", p)) >= pruned_below
    assert log.states() == before
    log.every_record_once()


def partition_of(k: ShareKey) -> int:
    return state_partition_of(k, PLANTED_PARTITIONS)


def test_pruning_with_the_history_kept_moves_what_it_deletes(postgres: PostgresServer) -> None:
    log = write_store(postgres, planted_log_records()[0], PLANTED_PARTITIONS)
    p = log.written[0].state_partition
    # Without a history, pruning deletes for good.
    without = write_store(postgres, planted_log_records()[0], PLANTED_PARTITIONS)
    prune_as_the_daemon_does(without, p)
    assert without.rows("history", p) == []
    # With one, the deleting transaction moves the rows.
    keep_history(log)
    before = log.states()
    mark = prune_as_the_daemon_does(log, p)
    assert log.watermark(p) == mark
    assert [r[0] for r in log.rows("history", p)] == list(range(mark))
    assert log.states() == before
    log.every_record_once()
