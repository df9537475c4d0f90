"""The compaction's fast reader of sealed segments accepts exactly what persistence's
reader accepts, and reports damage as it does."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence import LogCorruptionError, encode_frame, fingerprint_segment, read_segment
from persistence.fileops import FileOps
from persistence.segments import scan_segment
from spark_jobs.sealed import read_sealed_segment

BASE = 100


def segment_bytes(count: int) -> tuple[bytes, list[tuple[int, int, int, bytes, bytes | None]]]:
    records = []
    for i in range(count):
        value = None if i % 7 == 3 else bytes([i % 251]) * (i % 13)
        records.append((BASE + 2 * i, 1_700_000_000_000 + i, i % 2, f"key-{i % 4}".encode(), value))
    return b"".join(encode_frame(*r) for r in records), records


def write(tmp_path: Path, data: bytes, base: int = BASE) -> str:
    path = tmp_path / f"{base:020d}.log"
    path.write_bytes(data)
    return str(path)


def test_a_sealed_segment_reads_back_with_its_fingerprint(tmp_path: Path) -> None:
    data, records = segment_bytes(40)
    path = write(tmp_path, data)
    read = read_sealed_segment(path, BASE)
    assert read.records == records
    assert read.fingerprint == fingerprint_segment(path)
    assert read.last_offset == records[-1][0]


def test_an_empty_sealed_segment_has_no_last_frame(tmp_path: Path) -> None:
    path = write(tmp_path, b"")
    read = read_sealed_segment(path, BASE)
    assert (read.records, read.last_offset) == ([], None)
    assert read.fingerprint == fingerprint_segment(path)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12),
    st.data(),
    st.sampled_from(["flip", "truncate", "zero", "append"]),
)
def test_damage_is_found_exactly_where_persistence_finds_it(
    tmp_path_factory: pytest.TempPathFactory, count: int, data: st.DataObject, how: str
) -> None:
    clean, _ = segment_bytes(count)
    damaged = bytearray(clean)
    at = data.draw(st.integers(0, len(clean) - 1))
    if how == "flip":
        damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "truncate":
        del damaged[at:]
    elif how == "zero":
        damaged[at : at + 16] = bytes(len(damaged[at : at + 16]))
    else:
        damaged += data.draw(st.binary(min_size=1, max_size=40))
    path = write(tmp_path_factory.mktemp("seg"), bytes(damaged))
    scan = scan_segment(FileOps(), path, BASE)
    if scan.damage is None:
        assert read_sealed_segment(path, BASE).records == [
            (r.offset, r.timestamp, r.record_type, r.key, r.value) for r in read_segment(path)
        ]
    else:
        with pytest.raises(LogCorruptionError) as raised:
            read_sealed_segment(path, BASE)
        assert (raised.value.position, raised.value.reason) == (
            scan.damage.position,
            scan.damage.reason,
        )


@pytest.mark.parametrize(
    ("after_offset", "below_offset", "accepted"),
    [
        (-1, None, True),
        (BASE + 2, None, False),  # the first offset must exceed the previous segment's last
        (-1, BASE + 2 * 9, False),  # every offset must stay below the next segment's base
        (-1, BASE + 2 * 9 + 1, True),
    ],
)
def test_offsets_must_fit_between_the_neighbouring_segments(
    tmp_path: Path, after_offset: int, below_offset: int | None, accepted: bool
) -> None:
    data, records = segment_bytes(10)
    path = write(tmp_path, data)
    if accepted:
        read = read_sealed_segment(path, BASE, after_offset=after_offset, below_offset=below_offset)
        assert read.records == records
    else:
        with pytest.raises(LogCorruptionError, match="offset"):
            read_sealed_segment(path, BASE, after_offset=after_offset, below_offset=below_offset)


def test_a_segment_is_read_from_its_own_base(tmp_path: Path) -> None:
    data, _ = segment_bytes(3)
    path = write(tmp_path, data, base=BASE + 1)  # its first record (offset 100) is below
    with pytest.raises(LogCorruptionError, match="at least 101"):
        read_sealed_segment(path, BASE + 1)
    assert os.path.exists(path)


def with_body(frame: bytes, change: int, value: bytes) -> bytes:
    """`frame` with body bytes at `change` replaced and a checksum that holds."""
    body = bytearray(frame[8:])
    body[change - 8 : change - 8 + len(value)] = value
    return frame[:4] + zlib.crc32(body).to_bytes(4, "big") + bytes(body)


FRAME = encode_frame(BASE, 1, 0, b"key", b"value")
VALUE_LENGTH_AT = 30 + len(b"key")


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(with_body(FRAME, 8, b"\x02"), "magic", id="magic"),
        pytest.param(
            with_body(FRAME, VALUE_LENGTH_AT, (4).to_bytes(4, "big")), "value", id="short-value"
        ),
        pytest.param(
            with_body(FRAME, VALUE_LENGTH_AT, (-1).to_bytes(4, "big", signed=True)),
            "value",
            id="null-value-with-bytes",
        ),
        pytest.param(
            with_body(FRAME, VALUE_LENGTH_AT, (-2).to_bytes(4, "big", signed=True)),
            "value",
            id="negative-value",
        ),
        pytest.param(with_body(FRAME, 26, (99).to_bytes(4, "big")), "key length", id="key-overrun"),
        pytest.param(
            with_body(FRAME, 10, (-5).to_bytes(8, "big", signed=True)),
            "offset",
            id="negative-offset",
        ),
    ],
)
def test_a_frame_whose_checksum_holds_but_whose_fields_do_not_is_damage(
    tmp_path: Path, frame: bytes, reason: str
) -> None:
    path = write(tmp_path, encode_frame(BASE - 1, 0, 0, b"k", None) + frame, base=0)
    with pytest.raises(LogCorruptionError, match=reason) as raised:
        read_sealed_segment(path, 0)
    assert raised.value.position == len(encode_frame(BASE - 1, 0, 0, b"k", None))
