"""Issue #14: an audit that never gives a false all-clear.

The story: a log holding a violation is compacted and pruned; the audit still reports the
violation, and says which window it covered. Also: the data source returns exactly what
`log dump --json` prints (sealed and active segments, and history), and incremental
audits add up to a full one."""

from __future__ import annotations

import io
import itertools
import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import expr

from persistence import StateLog, list_segments, partition_dir
from persistence.history import HistoryIndex, read_declaration, read_exports
from protocol.records import Record, ShareKey, ShareSnapshot, ShareTombstone
from server.tools import log_dump
from spark_jobs import audit, compact
from spark_jobs.auditor import Auditor, replay_records
from spark_jobs.datasource import register
from tests.spark.histories import (
    BASE_TIME_MS,
    Appended,
    rpc_histories,
    run_rpcs,
    state_partition_of,
    write_log,
)
from tests.spark.pg_stores import SECRET, PgLog, prune_after_new_snapshots, write_more, write_store
from tests.spark.test_audit import (
    AVAILABLE,
    NUM_PARTITIONS,
    START_OFFSET_BACKWARDS,
    TOPIC,
    appended_of,
    b,
    build,
    key,
    snap,
    upd,
)

FILLER = key("filler")


def planted_log(data_dir: str) -> tuple[list[Appended], Appended]:
    """A start offset going backwards early in the log, then enough traffic on another
    key of the same state partition that compaction and pruning have work to do."""
    appended, planted = planted_log_records()
    write_log(data_dir, appended, NUM_PARTITIONS, 300)
    return appended, planted


def planted_log_records() -> tuple[list[Appended], Appended]:
    """planted_log's records, written nowhere."""
    victim = key("victim")
    records: list[Record] = [snap(victim, 1, 10), upd(victim, 15), upd(victim, 12)]
    records += [snap(FILLER, 1, 0, b(0, 3, AVAILABLE, 1))]
    records += [upd(FILLER, -1, b(i, i, AVAILABLE, 1)) for i in range(40)]
    records += [snap(victim, 1, 20), snap(FILLER, 1, 50)]
    appended = appended_of(records)
    (planted,) = [a for a in appended if a.record is records[2]]
    return appended, planted


def compact_now(spark: SparkSession, capsys: pytest.CaptureFixture[str], data_dir: str) -> str:
    # The records are of 2023: a retention counted in days would expire them at once.
    code = compact.main(["--data-dir", data_dir, "--history-retention-ms", "-1"], spark=spark)
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def prune_as_the_daemon_does(data_dir: str, partition: int) -> list[str]:
    """PartitionLog.prune below the last segment, asking the history as the daemon's
    prune job does (server/service.py)."""
    history = HistoryIndex.load(data_dir)
    assert history is not None
    with StateLog.open(data_dir, NUM_PARTITIONS) as log:
        partition_log = log.partition(partition)
        partition_log.open()
        mark = partition_log.segments[-1].base_offset
        return partition_log.prune(mark, lambda s: history.holds(partition, s))


def run_audit(spark: SparkSession, data_dir: str, out: Path, *extra: str) -> tuple[int, dict]:
    code = audit.main(["--data-dir", data_dir, "--out", str(out), *extra], spark=spark)
    return code, json.loads((out / "summary.json").read_text())


class Place:
    """Where the story's log lives: a data directory ("local"), or a PostgreSQL store
    on the session's server ("postgres"); the same steps on either."""

    def __init__(self, kind: str, data_dir: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.request = request
        self.log: PgLog | None = None

    def planted(self) -> tuple[list[Appended], Appended]:
        if self.kind == "local":
            return planted_log(self.data_dir)
        appended, planted = planted_log_records()
        self.log = write_store(self.request.getfixturevalue("postgres"), appended, NUM_PARTITIONS)
        return appended, planted

    @property
    def where(self) -> list[str]:
        if self.log is None:
            return ["--data-dir", self.data_dir]
        return ["--state-store", self.log.store.uri, "--state-store-schema", self.log.store.schema]

    @property
    def history(self) -> str:
        """How the audit's report names the history."""
        if self.log is None:
            return os.path.join(self.data_dir, "history")
        return f"{self.log.store.schema}.sharecoord_history"

    def compact(self, spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> str:
        # The records are of 2023: a retention counted in days would expire them at once.
        code = compact.main([*self.where, "--history-retention-ms", "-1"], spark=spark)
        out, err = capsys.readouterr()
        assert code == 0, out
        assert SECRET not in out + err
        return out

    def prune(self, partition: int, appended: list[Appended]) -> None:
        """Prune as the daemon does; something is deleted."""
        if self.log is None:
            # The compacted output was exported (as no records), so it may go.
            assert prune_as_the_daemon_does(self.data_dir, partition)
        else:
            # The compacted log holds each key's last snapshot: a node writes newer ones
            # (the same states) before any of it is redundant.
            appended += prune_after_new_snapshots(self.log, partition)

    def audit(self, spark: SparkSession, out: Path, *extra: str) -> tuple[int, dict]:
        code = audit.main([*self.where, "--out", str(out), *extra], spark=spark)
        summary = (out / "summary.json").read_text()
        assert SECRET not in summary + (out / "index.html").read_text()
        return code, json.loads(summary)

    def write_more(self, more: list[Appended]) -> None:
        if self.log is None:
            write_log(self.data_dir, more, NUM_PARTITIONS, 300)
        else:
            write_more(self.log, more)


@pytest.fixture(params=["local", "postgres"])
def place(request: pytest.FixtureRequest, data_dir: str) -> Place:
    return Place(request.param, data_dir, request)


def test_a_violation_survives_compaction_and_pruning_and_the_audit_says_its_window(
    spark: SparkSession, place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    appended, planted = place.planted()
    p = planted.state_partition
    code, before = place.audit(spark, tmp_path / "before")
    assert (code, before["violation_counts"]) == (1, {START_OFFSET_BACKWARDS: 1})

    place.compact(spark, capsys)
    place.prune(p, appended)
    code, after = place.audit(spark, tmp_path / "after")
    out = capsys.readouterr().out

    assert code == 1
    assert after["violation_counts"] == {START_OFFSET_BACKWARDS: 1}
    (finding,) = after["violation_sample"]
    assert (finding["state_partition"], finding["log_offset"]) == (p, planted.offset)
    ours = [a for a in appended if a.state_partition == p]
    (window,) = [w for w in after["windows"] if w["state_partition"] == p]
    assert (window["first_offset"], window["last_offset"]) == (0, ours[-1].offset)
    assert window["records"] == len(ours) and window["missing_offsets"] == 0
    assert after["history"] == place.history
    assert "window: " in out and "history: " in out
    # The histogram still counts what was folded away.
    assert after["histogram"] == before["histogram"]


def test_without_the_history_the_folded_violation_is_gone_and_the_window_says_why(
    spark: SparkSession, data_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, planted = planted_log(data_dir)
    code = compact.main(["--data-dir", data_dir, "--history-retention-ms", "0"], spark=spark)
    assert code == 0 and read_declaration(data_dir) is None
    capsys.readouterr()
    code, summary = run_audit(spark, data_dir, tmp_path / "report")
    (window,) = [w for w in summary["windows"] if w["state_partition"] == planted.state_partition]
    assert code == 0 and summary["history"] is None
    assert window["missing_offsets"] > 0  # no all-clear without saying what was not seen


def dumped(data_dir: str) -> list[dict]:
    out = io.StringIO()
    assert log_dump(data_dir, None, True, out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def source_frame(spark: SparkSession, data_dir: str, **options: str) -> DataFrame:
    """The data source's rows, their timestamps in ms as `log dump --json` prints them."""
    register(spark)
    frame = spark.read.format("sharecoord").options(**options).load(data_dir)
    return frame.withColumn("timestamp", expr("unix_millis(timestamp)"))


def source_rows(spark: SparkSession, data_dir: str, **options: str) -> list[dict]:
    rows = [r.asDict(recursive=True) for r in source_frame(spark, data_dir, **options).collect()]
    return sorted(rows, key=lambda r: (r["state_partition"], r["log_offset"]))


def test_the_data_source_has_the_columns_log_dump_json_prints_and_the_same_rows(
    spark: SparkSession, data_dir: str
) -> None:
    """One layout, two transports: the columns are the keys of every line `log dump
    --json` prints, in that order, for each record kind, and the values agree."""
    victim, other = key("victim"), key("other")
    no_fences = ShareSnapshot(other, 0, 2, 0, 0, 1, 1, [])  # null fence fields
    records = [snap(victim, 1, 10, b(10, 12, AVAILABLE, 2)), upd(victim, 11)]
    build(data_dir, [*records, no_fences, ShareTombstone(other)])
    lines = dumped(data_dir)
    assert {line["record_type"] for line in lines} == {
        "ShareSnapshot",
        "ShareUpdate",
        "ShareTombstone",
    }
    columns = source_frame(spark, data_dir).columns
    assert all(list(line) == columns for line in lines)
    rows = source_rows(spark, data_dir)
    assert [list(row) for row in rows] == [columns] * len(lines)
    assert rows == sorted(lines, key=lambda r: (r["state_partition"], r["log_offset"]))


def test_the_data_source_returns_what_log_dump_prints_before_and_after_compaction(
    spark: SparkSession, data_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    planted_log(data_dir)
    with StateLog.open(data_dir, NUM_PARTITIONS) as log:  # the active segment grows too
        partition_log = log.partition(0)
        partition_log.open()
        assert len(list_segments(partition_dir(data_dir, 0))) > 1
    original = dumped(data_dir)
    live = source_rows(spark, data_dir)
    assert live == original
    compact_now(spark, capsys, data_dir)
    assert dumped(data_dir) != original  # the live log was folded ...
    assert source_rows(spark, data_dir) == original  # ... the history keeps what it was
    # One task per state partition gives the same rows; so does a read of one partition.
    assert source_rows(spark, data_dir, partitioning="state_partition") == original
    only = source_rows(spark, data_dir, partitions="1")
    assert only == [r for r in original if r["state_partition"] == 1]
    exports = read_exports(os.path.join(data_dir, "history"), 0)
    assert exports and all(e.records or not e.files for e in exports)


# -- incremental == full ------------------------------------------------------------------


def findings_of(appended: list[Appended], cuts: list[int]) -> tuple[list, list]:
    """The findings of one auditor over everything, and of auditors that stop at each
    cut, dump, and resume."""

    def timed(items: list[Appended]) -> list[tuple[int, int, Record]]:
        return [(a.offset, a.timestamp, a.record) for a in items]

    full = Auditor(0, 3)
    replay_records(full, timed(appended))
    pieces: list = []
    dumped_state = None
    bounds = [0, *sorted(cuts), len(appended)]
    for start, end in itertools.pairwise(bounds):
        auditor = Auditor.resume(0, 3, dumped_state)
        replay_records(auditor, timed(appended[start:end]))
        pieces += auditor.result.findings
        dumped_state = auditor.dump()
        summary = auditor.finish()
    return full.finish().findings, (pieces, summary)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rpc_histories, rpc_histories)
def test_incremental_audits_find_what_a_full_audit_finds(ops: list, cut_ops: list) -> None:
    appended = [a for a in run_rpcs(ops, 1, 3) if a.state_partition == 0]
    cuts = sorted({(len(cut_ops) * 7 + i * 13) % (len(appended) + 1) for i in range(3)})
    full, (incremental, last) = findings_of(appended, cuts)
    assert incremental == full
    whole = Auditor(0, 3)
    replay_records(whole, [(a.offset, a.timestamp, a.record) for a in appended])
    report = whole.finish()
    # The tallies carried across runs end where one run's end.
    assert (last.histogram, last.ranges, last.share_partitions) == (
        report.histogram,
        report.ranges,
        report.share_partitions,
    )
    assert last.since.records == len(appended)


def test_since_last_reads_only_what_is_new_and_carries_the_rest(
    spark: SparkSession, place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    appended, planted = place.planted()
    out = tmp_path / "daily"
    code, first = place.audit(spark, out, "--since-last")
    assert (code, first["mode"], first["violations"]) == (1, "full", 1)
    place.compact(spark, capsys)
    more = [
        Appended(planted.state_partition, appended[-1].offset + 1 + i, BASE_TIME_MS + 10**6, r)
        for i, r in enumerate([upd(key("victim"), 30), upd(key("victim"), 25)])
    ]
    place.write_more(more)
    code, second = place.audit(spark, out, "--since-last")
    capsys.readouterr()
    assert second["mode"] == "since last" and second["records"] == len(more)
    assert (code, second["violation_counts"]) == (1, {START_OFFSET_BACKWARDS: 1})
    assert second["earlier_violations"] == {START_OFFSET_BACKWARDS: 1}
    code, full = place.audit(spark, tmp_path / "full")
    assert full["violation_counts"] == {START_OFFSET_BACKWARDS: 2}
    assert full["histogram"] == second["histogram"]
    assert full["share_partitions"] == second["share_partitions"]


def test_a_checkpoint_of_another_data_directory_is_refused(
    spark: SparkSession, data_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted_log(data_dir)
    out = tmp_path / "report"
    run_audit(spark, data_dir, out)
    other = str(tmp_path / "other")
    write_log(other, [], NUM_PARTITIONS, 300)
    code = audit.main(["--data-dir", other, "--out", str(out), "--since-last"], spark=spark)
    assert code == 2
    assert "give each data directory its own --out" in capsys.readouterr().err


def test_share_key_fixture_is_in_one_partition() -> None:
    # The story needs victim and filler in one state partition (segments roll there).
    assert state_partition_of(key("victim"), NUM_PARTITIONS) == state_partition_of(
        FILLER, NUM_PARTITIONS
    )
    assert isinstance(FILLER, ShareKey)


# -- the README's Spark SQL example ---------------------------------------------------------


def readme_query() -> str:
    """The SQL of the README's data source example."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index('spark.sql("""') + len('spark.sql("""')
    return readme[start : readme.index('""")', start)]


def test_the_readme_query_finds_the_most_redelivered_offsets_of_a_group_last_hour(
    spark: SparkSession, data_dir: str
) -> None:
    now = int(time.time() * 1000)
    orders, other = ShareKey("orders", TOPIC, 0), ShareKey("other", TOPIC, 0)
    timed = [
        (now - 3 * 3600_000, snap(orders, 1, 0, b(0, 9, AVAILABLE, 9))),  # too old
        (now - 600_000, upd(orders, -1, b(0, 4, AVAILABLE, 3), b(5, 9, AVAILABLE, 1))),
        (now - 60_000, upd(orders, -1, b(0, 4, AVAILABLE, 4))),
        (now - 60_000, upd(other, -1, b(0, 4, AVAILABLE, 7))),  # another group
    ]
    offsets = dict.fromkeys(range(NUM_PARTITIONS), 0)
    appended = []
    for timestamp, record in timed:
        p = state_partition_of(record.key, NUM_PARTITIONS)
        appended.append(Appended(p, offsets[p], timestamp, record))
        offsets[p] += 1
    write_log(data_dir, appended, NUM_PARTITIONS, 300)
    register(spark)
    spark.read.format("sharecoord").load(data_dir).createOrReplaceTempView("share_log")
    rows = [tuple(r) for r in spark.sql(readme_query()).collect()]
    assert rows == [(TOPIC, 0, 0, 4, 4), (TOPIC, 0, 5, 9, 1)]
