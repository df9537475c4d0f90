"""A data directory keeps the partitions its node owns, and tells them from what another
node left or what went missing (persistence/ownership.py;
docs/operations.md#moving-a-state-partition).

Node 0 owns 0-1 and node 1 owns 2-3 of four state partitions; the tests change that
assignment between opens, as a cluster file change would, and check what each open
creates, serves, refuses and keeps in CHECKPOINT and the journal."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil

import pytest

from persistence import (
    FileOps,
    GroupCommitter,
    LogError,
    LogRecord,
    StateLog,
    partition_dir,
    read_partition,
    verify,
)
from persistence.journal import read_checkpoint
from persistence.ownership import (
    Assignment,
    DataDirectoryOwnerError,
    PartitionOwnershipError,
    absent_by_design,
    read_assignment,
    read_owner,
)
from tests.persistence.log_helpers import append_records, write_records

N = 4
HALVES = (0, 0, 1, 1)


def assignment(node: int = 0, owners: tuple[int, ...] = HALVES) -> Assignment:
    return Assignment(node, "fp-" + "".join(map(str, owners)), owners)


def open_as(data_dir: str, node: int = 0, owners: tuple[int, ...] = HALVES) -> StateLog:
    return StateLog.open(data_dir, N, assignment=assignment(node, owners))


def refusal(log: StateLog, partition: int) -> str:
    with pytest.raises(PartitionOwnershipError) as refused:
        log.partition(partition).open()
    return str(refused.value)


def served(data_dir: str, partition: int, node: int = 0, owners: tuple[int, ...] = HALVES):
    log = open_as(data_dir, node, owners)
    try:
        log.partition(partition).open()
        return list(log.partition(partition).read())
    finally:
        log.close()


def crash_after_writes(data_dir: str, partition: int, count: int) -> list[LogRecord]:
    """Group-committed appends, then a crash: no checkpoint, so they are in the journal
    and (unsynced) in the partition's file."""
    log = open_as(data_dir)
    log.partition(partition).open()
    log.take_checkpoint = lambda lsn, written, on_failure=None, spread=0.0: {}  # type: ignore[method-assign]

    async def run() -> list[LogRecord]:
        committer = GroupCommitter(log)
        committer.start()
        records = append_records(log.partition(partition), count)
        await asyncio.gather(*(committer.wait_durable(partition, r.offset) for r in records))
        await committer.close()
        return records

    records = asyncio.run(run())
    log.close()
    return records


def test_a_new_directory_holds_only_the_owned_partitions_each_with_its_owner(data_dir):
    open_as(data_dir).close()
    assert sorted(os.listdir(os.path.join(data_dir, "partitions"))) == ["0", "1"]
    owner = read_owner_of(data_dir, 0)
    assert (owner.node_id, owner.assignment, owner.origin) == (0, "fp-0011", "created")
    assert read_assignment_of(data_dir) == assignment()
    with open(os.path.join(data_dir, "meta")) as meta:
        assert json.load(meta) == {"format": 2, "num_partitions": N}
    log = open_as(data_dir)
    assert "is not owned by this node (node 1 owns it)" in refusal(log, 2)
    log.partition(0).open()
    log.close()
    assert not os.path.exists(partition_dir(data_dir, 2))


def test_a_partition_moved_here_without_its_state_is_refused_and_not_created(data_dir):
    open_as(data_dir).close()
    moved = (0, 0, 0, 1)  # partition 2 goes from node 1 to node 0
    log = open_as(data_dir, owners=moved)
    message = refusal(log, 2)
    assert "moved to this node in the cluster file, but its state is on node 1" in message
    assert "partition export" in message
    assert "partition adopt" in message
    log.partition(0).open()  # the others serve
    log.close()
    assert not os.path.exists(partition_dir(data_dir, 2))
    # The record still says where the state is, so the next start says the same.
    assert read_assignment_of(data_dir).owners == (0, 0, 1, 1)
    log = open_as(data_dir, owners=moved)
    assert "its state is on node 1" in refusal(log, 2)
    log.close()


def test_a_partition_moved_away_keeps_its_directory_and_the_old_owner_refuses_it_back(
    data_dir,
):
    log = open_as(data_dir)
    log.partition(1).open()
    kept = write_records(log.partition(1), 3)
    log.close()
    log = open_as(data_dir, owners=(0, 1, 1, 1))  # partition 1 goes to node 1
    assert "node 1 owns it" in refusal(log, 1)
    log.close()
    assert list(read_partition(partition_dir(data_dir, 1))) == kept
    # Back to node 0 without the state node 1 may have written meanwhile: refused.
    log = open_as(data_dir)
    message = refusal(log, 1)
    assert "was given to node 1 by the last cluster map this node ran with" in message
    log.close()


def test_a_directory_another_node_created_is_refused(data_dir, tmp_path):
    other = str(tmp_path / "other")
    open_as(other, node=1).close()
    open_as(data_dir).close()
    shutil.rmtree(partition_dir(data_dir, 1))
    shutil.copytree(partition_dir(other, 2), partition_dir(data_dir, 1))  # by hand
    log = open_as(data_dir)
    message = refusal(log, 1)
    assert "was created by node 1, not by this node" in message
    log.close()


class OwnerUnreadable(FileOps):
    """Partition 1's OWNER fails to open with EIO while `broken` is set."""

    broken = True

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if self.broken and path.endswith(os.path.join("partitions", "1", "OWNER")):
            raise OSError(errno.EIO, "Input/output error (test)", path)
        return super().open(path, flags, mode)


def test_an_owner_a_disk_error_hid_at_start_is_judged_when_the_partition_opens(
    data_dir, tmp_path
):
    other = str(tmp_path / "other")
    open_as(other, node=1).close()
    open_as(data_dir).close()
    shutil.rmtree(partition_dir(data_dir, 1))
    shutil.copytree(partition_dir(other, 2), partition_dir(data_dir, 1))  # by hand
    fs = OwnerUnreadable()
    log = StateLog.open(data_dir, N, assignment=assignment(), fs=fs)
    try:
        with pytest.raises(OSError, match="Input/output error"):
            log.partition(1).open()  # the loader retries this
        log.partition(0).open()  # the others serve
        fs.broken = False
        assert "was created by node 1, not by this node" in refusal(log, 1)
    finally:
        fs.broken = False
        log.close()


def test_an_owner_a_disk_error_hid_is_judged_by_the_loaders_retry_too(data_dir, tmp_path):
    """The runtime retries a failed load with reset_to_durable(): it must not open the
    directory without the judgement open() would have made."""
    other = str(tmp_path / "other")
    open_as(other, node=1).close()
    open_as(data_dir).close()
    shutil.rmtree(partition_dir(data_dir, 1))
    shutil.copytree(partition_dir(other, 2), partition_dir(data_dir, 1))  # by hand
    fs = OwnerUnreadable()
    log = StateLog.open(data_dir, N, assignment=assignment(), fs=fs)
    try:
        with pytest.raises(OSError, match="Input/output error"):
            log.partition(1).open()
        fs.broken = False
        with pytest.raises(PartitionOwnershipError, match="was created by node 1"):
            log.partition(1).reset_to_durable()
    finally:
        fs.broken = False
        log.close()


def test_assignment_is_written_again_only_when_it_changes(data_dir):
    """Rewritten at every start, it was the first thing a start on a full disk failed at."""
    open_as(data_dir).close()
    path = os.path.join(data_dir, "ASSIGNMENT")
    written = os.stat(path).st_ino
    open_as(data_dir).close()
    assert os.stat(path).st_ino == written
    open_as(data_dir, owners=(0, 1, 1, 1)).close()
    assert read_assignment_of(data_dir).owners == (0, 1, 1, 1)
    assert os.stat(path).st_ino != written


def test_a_missing_partition_this_node_held_is_refused_not_recreated(data_dir):
    open_as(data_dir).close()
    shutil.rmtree(partition_dir(data_dir, 0))
    log = open_as(data_dir)
    assert "is missing" in refusal(log, 0)
    assert "this node held it" in refusal(log, 0)
    log.close()
    assert not os.path.exists(partition_dir(data_dir, 0))


def test_a_missing_partition_that_checkpoint_names_is_refused(data_dir):
    log = open_as(data_dir)
    log.partition(1).open()
    write_records(log.partition(1), 2)
    log.close()
    open_as(data_dir, owners=(0, 1, 1, 1)).close()  # 1 moves away ...
    assert 1 in read_checkpoint_of(data_dir).partitions
    shutil.rmtree(partition_dir(data_dir, 1))  # ... its directory is deleted ...
    log = open_as(data_dir)  # ... and it comes back
    assert "the journal's CHECKPOINT shows it had records" in refusal(log, 1)
    log.close()


def test_the_data_directory_of_another_node_is_refused_whole(data_dir):
    open_as(data_dir).close()
    with pytest.raises(DataDirectoryOwnerError, match=r"data directory of node 0.*--node-id 0"):
        open_as(data_dir, node=1)
    open_as(data_dir).close()  # the refusal released the lock


# --- directories made before OWNER files ---------------------------------------------------


def legacy_directory(data_dir: str) -> list[LogRecord]:
    """What the version before ownership left: every partition directory, no OWNER, no
    ASSIGNMENT; records in partition 1."""
    log = StateLog.open(data_dir, N)
    log.partition(1).open()
    written = write_records(log.partition(1), 4)
    log.close()
    assert sorted(os.listdir(os.path.join(data_dir, "partitions"))) == ["0", "1", "2", "3"]
    return written


def test_a_directory_without_owner_files_is_migrated_on_its_first_open(data_dir):
    written = legacy_directory(data_dir)
    assert served(data_dir, 1) == written
    for p in (0, 1):
        owner = read_owner_of(data_dir, p)
        assert (owner.node_id, owner.origin) == (0, "migrated")
    for p in (2, 3):  # not this node's: left as they were
        assert read_owner(FS, partition_dir(data_dir, p)) is None
    assert read_assignment_of(data_dir) == assignment()
    assert served(data_dir, 1) == written  # and from then on as any directory
    assert verify(data_dir).ok


def test_after_the_migration_an_empty_leftover_moved_here_is_refused(data_dir):
    legacy_directory(data_dir)
    open_as(data_dir).close()  # the migration
    log = open_as(data_dir, owners=(0, 0, 0, 1))  # 2 comes here; its leftover is empty
    assert "its state is on node 1" in refusal(log, 2)
    log.close()


def test_a_leftover_with_records_and_no_owner_is_refused(data_dir):
    legacy_directory(data_dir)
    open_as(data_dir, owners=(0, 1, 1, 1)).close()  # migrated while 1 was elsewhere
    log = open_as(data_dir, owners=(0, 0, 1, 1))
    assert "has records in" in refusal(log, 1)
    assert "no OWNER file" in refusal(log, 1)
    log.close()


# --- the journal and CHECKPOINT of partitions not opened -------------------------------------


def test_a_partition_moved_away_after_a_crash_gets_its_journal_frames_in_its_files(data_dir):
    records = crash_after_writes(data_dir, 1, 5)
    os.truncate(partition_dir(data_dir, 1) + "/00000000000000000000.log", 0)
    log = open_as(data_dir, owners=(0, 1, 1, 1))  # 1 moved away before the restart
    assert log.held == set()
    log.close()
    # Its directory has everything, the journal nothing of it any more.
    shutil.rmtree(os.path.join(data_dir, "journal"))
    os.makedirs(os.path.join(data_dir, "journal"))
    with open(os.path.join(data_dir, "journal", "CHECKPOINT"), "w") as f:
        json.dump({"format": 1, "partitions": {}}, f)
    assert list(read_partition(partition_dir(data_dir, 1))) == records


def test_frames_of_a_partition_whose_directory_is_gone_are_held_in_the_journal(data_dir):
    records = crash_after_writes(data_dir, 1, 5)
    entry = read_checkpoint_of(data_dir).partitions.get(1)
    gone = partition_dir(data_dir, 1) + ".aside"
    os.rename(partition_dir(data_dir, 1), gone)
    log = open_as(data_dir, owners=(0, 1, 1, 1))
    assert log.held == {1}
    checkpoint = read_checkpoint_of(data_dir)
    assert checkpoint.partitions.get(1) == entry  # exactly as it was
    lsn = log.journal.end_lsn if log.journal is not None else 0
    log.take_checkpoint(lsn, set())
    assert read_checkpoint_of(data_dir).partitions.get(1) == entry
    log.close()
    assert read_checkpoint_of(data_dir).partitions.get(1) == entry
    # The frames are still there: put the directory back, and it reads them.
    os.rename(gone, partition_dir(data_dir, 1))
    assert list(read_partition(partition_dir(data_dir, 1))) == records


def test_readers_tell_a_partition_of_another_node_from_a_missing_one(data_dir):
    open_as(data_dir).close()
    assert absent_by_design(FS, data_dir, 2) == "not held by this node: node 1 owns it"
    assert absent_by_design(FS, data_dir, 0) is None
    assert list(read_partition(partition_dir(data_dir, 2))) == []
    report = verify(data_dir)
    assert report.ok
    assert [p.absent for p in report.partitions] == [
        None,
        None,
        "not held by this node: node 1 owns it",
        "not held by this node: node 1 owns it",
    ]
    shutil.rmtree(partition_dir(data_dir, 0))
    assert absent_by_design(FS, data_dir, 0) is None
    assert not verify(data_dir).ok
    with pytest.raises(LogError):
        list(read_partition(partition_dir(data_dir, 0)))


def test_verify_notes_journal_records_of_a_partition_held_for_another_node(data_dir):
    """Partition 1 crashed with records only in the journal, its directory moved away,
    and the cluster map gave it to node 1: `log verify` calls it absent (no damage) but
    says the journal here still keeps records of it."""
    crash_after_writes(data_dir, 1, 3)
    os.rename(partition_dir(data_dir, 1), partition_dir(data_dir, 1) + ".aside")
    log = open_as(data_dir, owners=(0, 1, 1, 1))
    assert log.held == {1}
    log.close()
    report = verify(data_dir)
    assert report.ok
    moved = report.partitions[1]
    assert moved.absent == "not held by this node: node 1 owns it"
    assert any("journal here still holds records" in note for note in moved.notes)
    assert report.partitions[2].absent is not None and report.partitions[2].notes == []


FS = __import__("persistence").FileOps()


def read_owner_of(data_dir: str, partition: int):
    owner = read_owner(FS, partition_dir(data_dir, partition))
    assert owner is not None
    return owner


def read_assignment_of(data_dir: str) -> Assignment:
    found = read_assignment(FS, data_dir)
    assert found is not None
    return found


def read_checkpoint_of(data_dir: str):
    return read_checkpoint(FS, os.path.join(data_dir, "journal"))
