"""Shared helpers for the log's tests: deterministic records, filling a partition, the
check every recovery test ends with (appends and group commit work, and a reopen reads
everything back), and an independent fold of sealed segments for compaction tests."""

from __future__ import annotations

import asyncio
import os
import struct
import zlib

from persistence import (
    FileOps,
    GroupCommitter,
    LogRecord,
    PartitionLog,
    StateLog,
    encode_frame,
    list_segments,
    partition_dir,
    read_segment,
)
from persistence.frame import (
    CRC_AT,
    CRC_START,
    KEY_AT,
    KEY_LENGTH_AT,
    MAGIC_AT,
    RECORD_TYPE_AT,
    iter_frames,
)
from protocol.records import RecordDecoder, ShareSnapshot, encode_key, encode_value
from protocol.replay import ShareStateMap

NUM_PARTITIONS = 2
VALUE_SIZE = 40
TIMESTAMP_BASE = 1_700_000_000_000
FRAME_SIZE = len(encode_frame(0, 0, 0, b"key-0", b"x" * VALUE_SIZE))  # 79 bytes


def record_fields(i: int) -> tuple[int, bytes, bytes | None, int]:
    """Record number i: (record_type, key, value, timestamp), all frames FRAME_SIZE long."""
    return i % 2, f"key-{i % 5}".encode(), bytes([i % 251]) * VALUE_SIZE, TIMESTAMP_BASE + i


def append_records(part: PartitionLog, count: int, first: int = 0) -> list[LogRecord]:
    """Append records first..first+count-1 (buffered only); return them as they will
    read back."""
    appended = []
    for i in range(first, first + count):
        record_type, key, value, timestamp = record_fields(i)
        offset = part.append(record_type, key, value, timestamp)
        appended.append(LogRecord(offset, timestamp, record_type, key, value))
    return appended


def write_records(part: PartitionLog, count: int, first: int = 0) -> list[LogRecord]:
    """Append and fsync (without a GroupCommitter)."""
    appended = append_records(part, count, first)
    part.commit()
    return appended


def open_log(
    data_dir: str,
    *,
    segment_bytes: int = 100 * 1024 * 1024,
    num_partitions: int = NUM_PARTITIONS,
    fs: FileOps | None = None,
    lock: bool = True,
) -> StateLog:
    return StateLog.open(data_dir, num_partitions, segment_bytes=segment_bytes, fs=fs, lock=lock)


def write_through_journal(
    data_dir: str, num_partitions: int, rounds: int, per_round: int
) -> list[list[LogRecord]]:
    """Appends committed by a GroupCommitter, then a crash: no last checkpoint, so every
    record of this run is in the journal and (unsynced) in the partition files."""
    log = StateLog.open(data_dir, num_partitions)
    for part in log.partitions:
        part.open()
    # As a killed process: no checkpoint, not even the committer's last one.
    log.take_checkpoint = lambda lsn, written, on_failure=None, spread=0.0: {}  # type: ignore[method-assign]
    written: list[list[LogRecord]] = [[] for _ in range(num_partitions)]

    async def run() -> None:
        committer = GroupCommitter(log)
        committer.start()
        for round_number in range(rounds):
            waits = []
            for p in range(num_partitions):
                records = append_records(
                    log.partition(p), per_round, first=round_number * per_round
                )
                written[p] += records
                waits += [committer.wait_durable(p, r.offset) for r in records]
            await asyncio.gather(*waits)
        await committer.close()

    asyncio.run(run())
    log.close()
    return written


def newest_segment(data_dir: str, partition: int) -> str:
    return list_segments(partition_dir(data_dir, partition))[-1].path


def frame_starts(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += 4 + struct.unpack_from(">I", data, pos)[0]
    return starts


def read_back(data_dir: str, partition: int, **open_args: int) -> list[LogRecord]:
    """Reopen the directory (full recovery) and read one partition."""
    log = open_log(data_dir, **open_args)
    try:
        part = log.partition(partition)
        part.open()
        return list(part.read())
    finally:
        log.close()


async def group_commit(log: StateLog, partition: int, count: int, first: int) -> list[LogRecord]:
    """Append `count` records and wait for a GroupCommitter to make them durable."""
    committer = GroupCommitter(log)
    committer.start()
    try:
        part = log.partition(partition)
        appended = append_records(part, count, first)
        await asyncio.gather(*(committer.wait_durable(partition, r.offset) for r in appended))
        return appended
    finally:
        await committer.close()


def check_appends_work_afterwards(
    log: StateLog, partition: int, kept: list[LogRecord], *, first: int = 1000
) -> list[LogRecord]:
    """The partition is open: group-commit three more records, close, reopen, and check
    the log reads back as `kept` followed by them. Returns the whole log."""
    part = log.partition(partition)
    before_end = part.log_end_offset
    added = asyncio.run(group_commit(log, partition, 3, first))
    assert [r.offset for r in added] == [before_end, before_end + 1, before_end + 2]
    segment_bytes = part.segment_bytes
    log.close()
    everything = read_back(
        log.data_dir, partition, segment_bytes=segment_bytes, num_partitions=log.num_partitions
    )
    assert everything == kept + added
    return everything


def frames_in(path: str) -> list[tuple[int, int, LogRecord]]:
    """(start, end, record) of every frame of a file that holds only valid frames."""
    with open(path, "rb") as segment:
        data = segment.read()
    positions = [pos for pos, _ in iter_frames(data)] + [len(data)]
    return [
        (start, end, record)
        for (start, record), end in zip(iter_frames(data), positions[1:], strict=True)
    ]


def resealed(frame: bytes, at: int, data: bytes) -> bytes:
    """``frame`` with ``data`` written at byte ``at`` and its checksum computed again:
    bytes no crash can make, only a writer (a bug, another program, a hand edit)."""
    changed = bytearray(frame)
    changed[at : at + len(data)] = data
    changed[CRC_AT : CRC_AT + 4] = struct.pack(">I", zlib.crc32(changed[CRC_START:]))
    return bytes(changed)


def impossible_frames(offset: int) -> dict[str, bytes]:
    """Frames of record `offset` whose checksum holds but whose fields no writer makes,
    by what is wrong (persistence/frame.py: InvalidFrame)."""
    key = b"key"
    sound = encode_frame(offset, TIMESTAMP_BASE, 1, key, b"value")
    value_length_at = KEY_AT + len(key)
    changes = {
        "key-length-past-the-frame": (KEY_LENGTH_AT, struct.pack(">I", 1000)),
        "key-length-short": (KEY_LENGTH_AT, struct.pack(">I", 2)),
        "value-length-negative": (value_length_at, struct.pack(">i", -2)),
        "value-length-past-the-frame": (value_length_at, struct.pack(">i", 6)),
        "tombstone-with-value-bytes": (value_length_at, struct.pack(">i", -1)),
        "record-type-unknown": (RECORD_TYPE_AT, b"\x09"),
        "magic-unknown": (MAGIC_AT, b"\x02"),
    }
    frames = {name: resealed(sound, *change) for name, change in changes.items()}
    # A length field of 20, below the smallest frame (30), over 16 bytes it checksums.
    frames["length-field-20"] = resealed(struct.pack(">II", 20, 0) + bytes(range(16)), 0, b"")
    return frames


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def tree_snapshot(root: str) -> dict[str, bytes]:
    """Every file under root with its content, to prove something changed nothing."""
    snapshot = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            snapshot[os.path.relpath(path, root)] = file_bytes(path)
    return snapshot


def fold_sealed(directory: str) -> tuple[int, list[bytes], list[str]]:
    """A partition directory's sealed segments folded as the Spark job folds them, by
    plain replay: one ShareSnapshot per live key (with its fencing maxima) and a
    tombstone per deleted one, each at the offset of the key's last record. Returns the
    first offset, the frames, and the segment paths they replace."""
    sealed = list_segments(directory)[:-1]
    state = ShareStateMap(500)
    decoder = RecordDecoder()
    last = {}
    for segment in sealed:
        for frame in read_segment(segment.path):
            record = decoder.decode(frame.record_type, frame.key, frame.value)
            state.replay(frame.offset, record)
            last[record.key] = (frame.offset, frame.timestamp)
    frames = []
    for key, (offset, timestamp) in sorted(last.items(), key=lambda item: item[1]):
        entry = state.get(key)
        if entry is None:
            frames.append(encode_frame(offset, timestamp, 0, encode_key(key), None))
            continue
        s = entry.state
        snapshot = ShareSnapshot(
            key,
            s.snapshot_epoch,
            s.state_epoch,
            s.leader_epoch,
            s.start_offset,
            s.create_timestamp,
            s.write_timestamp,
            s.state_batches,
            s.delivery_complete_count,
            entry.leader_fence,
            entry.state_fence,
        )
        frames.append(encode_frame(offset, timestamp, 0, encode_key(key), encode_value(snapshot)))
    return sealed[0].base_offset, frames, [s.path for s in sealed]
