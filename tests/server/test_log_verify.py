"""`sharecoord log verify`'s verdict (docs/api.md#cli and docs/operations.md, repairing a
damaged partition): the summary line counts and names only the partitions that are
damaged (or do not replay), the exit code says whether any is, and a directory that is
no data directory at all is a usage error."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from persistence import StateLog
from persistence.ownership import Assignment
from protocol.records import ShareKey, ShareSnapshot, encode_record
from server.tools import log_verify

NUM_PARTITIONS = 5
RECORDS_EACH = 4
TOPIC = "AAAAAAAAAAAAAAAAAAAAAA"


def data_directory(path: Path, assignment: Assignment | None = None) -> str:
    """Every partition this node holds with RECORDS_EACH records that replay."""
    log = StateLog.open(str(path), NUM_PARTITIONS, assignment=assignment)
    try:
        for part in log.partitions:
            if assignment is not None and part.partition not in assignment.owned():
                continue
            part.open()
            for i in range(RECORDS_EACH):
                key = ShareKey("group", TOPIC, part.partition * 100 + i)
                part.append(*encode_record(ShareSnapshot(key, 0, 1, 1, 0, 1, 1, [])), 1)
            part.commit()
    finally:
        log.close()
    return str(path)


def newest_segment(data_dir: str, partition: int) -> str:
    directory = os.path.join(data_dir, "partitions", str(partition))
    return os.path.join(directory, max(n for n in os.listdir(directory) if n.endswith(".log")))


def flip_a_byte(path: str, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def undecodable_record_appended(data_dir: str, partition: int) -> None:
    """A valid frame whose key is not a share key: it does not replay."""
    log = StateLog.open(data_dir, NUM_PARTITIONS)
    try:
        part = log.partition(partition)
        part.open()
        part.append(0, b"not msgpack of a key", None, 1)
        part.commit()
    finally:
        log.close()


def verified(data_dir: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = log_verify(data_dir, out)
    return code, out.getvalue().splitlines()


def test_a_sound_directory_says_ok_with_every_partition(tmp_path: Path) -> None:
    data_dir = data_directory(tmp_path / "data")
    code, lines = verified(data_dir)
    assert code == 0
    assert lines[-1] == f"ok: 5 partitions, {5 * RECORDS_EACH} records in {data_dir}"


def test_the_summary_counts_and_names_only_the_damaged_partitions(tmp_path: Path) -> None:
    data_dir = data_directory(tmp_path / "data")
    flip_a_byte(newest_segment(data_dir, 1), 10)  # the first frame: valid ones follow
    undecodable_record_appended(data_dir, 3)
    code, lines = verified(data_dir)
    assert code == 1
    assert lines[1].startswith("partition 1: DAMAGED ")
    assert lines[3].startswith("partition 3: DOES NOT REPLAY ")
    records = 5 * RECORDS_EACH - RECORDS_EACH + 1  # partition 1 reads nothing; 3 has one more
    assert lines[-2] == f"DAMAGED: partitions 1, 3 (2 of 5), {records} records in {data_dir}"
    assert "--partition P`" in lines[-1]


def test_one_damaged_partition_is_named_in_the_summary_and_the_advice(tmp_path: Path) -> None:
    data_dir = data_directory(tmp_path / "data")
    undecodable_record_appended(data_dir, 2)
    code, lines = verified(data_dir)
    assert code == 1
    assert lines[-2].startswith("DAMAGED: partition 2 (1 of 5), ")
    assert f"--data-dir {data_dir} --partition 2`" in lines[-1]


def test_partitions_held_elsewhere_are_not_counted_as_damaged(tmp_path: Path) -> None:
    data_dir = data_directory(tmp_path / "data", Assignment(0, "fp", (0, 0, 1, 1, 0)))
    flip_a_byte(newest_segment(data_dir, 4), 10)
    code, lines = verified(data_dir)
    assert code == 1
    held = "held by other nodes"
    assert lines[-2] == (
        f"DAMAGED: partition 4 (1 of 5; 2 {held}), {2 * RECORDS_EACH} records in {data_dir}"
    )


def test_a_damaged_meta_is_the_directory_not_a_partition(tmp_path: Path) -> None:
    data_dir = data_directory(tmp_path / "data")
    Path(data_dir, "meta").write_text("{not json")
    code, lines = verified(data_dir)
    assert code == 1
    assert lines[0].startswith(f"DAMAGED {data_dir}/meta is not valid JSON")
    assert lines[-2] == (
        f"DAMAGED: the data directory itself (above); no partition checked, 0 records in {data_dir}"
    )


def test_a_directory_that_is_no_data_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong --data-dir (no meta, no partitions, no journal): one line, exit 2, and no
    DAMAGED verdict with repair advice."""
    code, lines = verified(str(tmp_path))
    assert (code, lines) == (2, [])
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"sharecoord log verify: {tmp_path} is not a sharecoord data directory: it has no "
        "meta, no partitions and no journal"
    )
