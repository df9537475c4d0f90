"""The frame format (persistence/frame.py's docstring) and its decoder."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from persistence.frame import (
    CRC_AT,
    CRC_COPY_BELOW,
    CRC_START,
    KEY_AT,
    KEY_LENGTH_AT,
    MAGIC_AT,
    MAX_FRAME_LENGTH,
    OFFSET_AT,
    RECORD_TYPE_AT,
    TIMESTAMP_AT,
    CorruptFrame,
    FrameError,
    IncompleteFrame,
    InvalidFrame,
    LogRecord,
    decode_frame,
    encode_frame,
    find_next_frame,
    iter_frames,
    walk_frames,
)
from protocol.records import RECORD_TYPES
from tests.persistence.log_helpers import resealed


def log_records(values: st.SearchStrategy[bytes | None]) -> st.SearchStrategy[LogRecord]:
    return st.builds(
        LogRecord,
        offset=st.integers(0, 2**63 - 1),
        timestamp=st.integers(-(2**63), 2**63 - 1),
        record_type=st.sampled_from(RECORD_TYPES),
        key=st.binary(max_size=64),
        value=values,
    )


records = log_records(st.none() | st.binary(max_size=256))
# Frames walk_frames checksums through its view of the buffer rather than a copy.
large_records = log_records(st.binary(min_size=CRC_COPY_BELOW - 64, max_size=CRC_COPY_BELOW + 64))


def encode(record: LogRecord) -> bytes:
    return encode_frame(
        record.offset, record.timestamp, record.record_type, record.key, record.value
    )


@given(records)
def test_a_frame_decodes_to_the_record_it_encodes(record: LogRecord) -> None:
    frame = encode(record)
    assert decode_frame(frame) == (record, len(frame))


@given(st.lists(records, max_size=8), st.binary(max_size=16))
def test_frames_concatenate_and_decode_in_order_from_any_position(
    batch: list[LogRecord], prefix: bytes
) -> None:
    data = prefix + b"".join(encode(r) for r in batch)
    assert [r for _, r in iter_frames(data, len(prefix))] == batch


def test_fields_sit_at_the_documented_positions() -> None:
    frame = encode_frame(7, 1234, 1, b"kk", b"vvv")
    length, crc = struct.unpack_from(">II", frame, 0)
    assert length == len(frame) - 4 == 30 + 2 + 3
    assert crc == zlib.crc32(frame[CRC_START:])
    assert frame[CRC_AT : CRC_AT + 4] == struct.pack(">I", crc)
    assert frame[MAGIC_AT] == 1
    assert frame[RECORD_TYPE_AT] == 1
    assert struct.unpack_from(">q", frame, OFFSET_AT) == (7,)
    assert struct.unpack_from(">q", frame, TIMESTAMP_AT) == (1234,)
    assert struct.unpack_from(">I", frame, KEY_LENGTH_AT) == (2,)
    assert frame[KEY_AT : KEY_AT + 2] == b"kk"
    assert struct.unpack_from(">i", frame, KEY_AT + 2) == (3,)
    assert frame[KEY_AT + 6 :] == b"vvv"


def test_a_tombstone_is_value_length_minus_one_and_no_value_bytes() -> None:
    frame = encode_frame(0, 0, 0, b"k", None)
    assert struct.unpack_from(">i", frame, KEY_AT + 1) == (-1,)
    assert len(frame) == KEY_AT + 1 + 4
    assert decode_frame(frame)[0].value is None


def test_an_empty_value_is_not_a_tombstone() -> None:
    assert decode_frame(encode_frame(0, 0, 0, b"k", b""))[0].value == b""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((-1, 0, 0, b"k", b"v"), "offset must be >= 0"),
        ((0, 0, 256, b"k", b"v"), "out of range"),
        ((0, 2**63, 0, b"k", b"v"), "out of range"),
        ((0, 0, 0, b"k", b"v" * MAX_FRAME_LENGTH), "exceeds the frame limit"),
    ],
)
def test_encoding_refuses_a_record_no_frame_can_hold(
    fields: tuple[int, int, int, bytes, bytes], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        encode_frame(*fields)


def test_a_clean_end_yields_nothing_more() -> None:
    frame = encode_frame(3, 0, 0, b"k", b"v")
    assert list(iter_frames(frame + frame, len(frame) * 2)) == []
    assert list(iter_frames(b"")) == []


@pytest.mark.parametrize("cut", range(1, 40))
def test_a_frame_cut_short_at_any_byte_is_incomplete_at_its_start(cut: int) -> None:
    first = encode_frame(0, 0, 0, b"k", b"value")
    second = encode_frame(1, 0, 0, b"key", b"some value")
    data = (first + second)[: len(first) + min(cut, len(second) - 1)]
    with pytest.raises(IncompleteFrame) as raised:
        list(iter_frames(data))
    assert raised.value.position == len(first)


def test_a_flipped_bit_anywhere_after_the_length_is_corrupt() -> None:
    frame = encode_frame(5, 99, 1, b"key", b"value")
    for byte in range(4, len(frame)):
        for bit in range(8):
            damaged = bytearray(frame)
            damaged[byte] ^= 1 << bit
            with pytest.raises(CorruptFrame) as raised:
                decode_frame(bytes(damaged))
            assert raised.value.position == 0


def test_a_length_above_the_limit_is_corrupt_not_a_reason_to_wait_for_more() -> None:
    data = struct.pack(">I", MAX_FRAME_LENGTH + 1) + b"\0" * 100
    with pytest.raises(CorruptFrame, match="length field"):
        decode_frame(data)


def test_zeroed_bytes_are_corrupt() -> None:
    with pytest.raises(CorruptFrame):
        decode_frame(b"\0" * 512)


SOUND = encode_frame(0, 0, 0, b"kk", b"vv")
VALUE_LENGTH_AT = KEY_AT + 2


def short_frame(length: int) -> bytes:
    """A length field below the smallest frame, with the checksum of the bytes it claims."""
    body = bytes([1]) * (length - 4)
    return struct.pack(">II", length, zlib.crc32(body)) + body


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(resealed(SOUND, MAGIC_AT, b"\x02"), "magic byte 2", id="magic"),
        pytest.param(resealed(SOUND, RECORD_TYPE_AT, b"\x07"), "record type 7", id="record-type"),
        pytest.param(
            resealed(SOUND, OFFSET_AT, struct.pack(">q", -5)), "negative record offset", id="offset"
        ),
        pytest.param(
            resealed(SOUND, KEY_LENGTH_AT, struct.pack(">I", 3)), "value length", id="key-length"
        ),
        pytest.param(
            resealed(SOUND, KEY_LENGTH_AT, struct.pack(">I", 2**32 - 1)),
            "key length 4294967295 overruns",
            id="key-length-huge",
        ),
        pytest.param(
            resealed(SOUND, VALUE_LENGTH_AT, struct.pack(">i", -2)),
            "value length -2",
            id="value-length-negative",
        ),
        pytest.param(
            resealed(SOUND, VALUE_LENGTH_AT, struct.pack(">i", 1)),
            "value length 1",
            id="value-length-short",
        ),
        pytest.param(
            resealed(SOUND, VALUE_LENGTH_AT, struct.pack(">i", -1)),
            "value length -1",
            id="tombstone-with-bytes",
        ),
        pytest.param(short_frame(5), "length field 5", id="length-field-5"),
        pytest.param(short_frame(29), "length field 29", id="length-field-29"),
    ],
)
def test_impossible_fields_with_a_matching_checksum_are_invalid(frame: bytes, reason: str) -> None:
    """The checksum holds, so these bytes were written so: InvalidFrame, which no reader
    takes for a torn write."""
    with pytest.raises(InvalidFrame, match=reason) as raised:
        decode_frame(frame + SOUND)
    assert raised.value.position == 0


def test_a_short_length_field_is_incomplete_until_its_bytes_are_there() -> None:
    frame = short_frame(20)
    with pytest.raises(IncompleteFrame) as raised:
        decode_frame(frame[:-1])
    assert raised.value.needed == len(frame)


def test_a_short_length_field_whose_checksum_fails_is_corrupt_not_invalid() -> None:
    frame = bytearray(short_frame(20))
    frame[-1] ^= 0xFF
    with pytest.raises(CorruptFrame) as raised:
        decode_frame(bytes(frame))
    assert not isinstance(raised.value, InvalidFrame)


@given(st.binary(max_size=300))
def test_garbage_never_decodes_silently_wrong(garbage: bytes) -> None:
    """Random bytes decode to frames only if they hold frames: the decoder either stops
    with a FrameError or returns frames that re-encode to exactly the bytes read."""
    pos = 0
    stopped: FrameError | None = None
    try:
        for start, record in iter_frames(garbage):
            frame = encode(record)
            assert garbage[start : start + len(frame)] == frame
            pos = start + len(frame)
    except FrameError as error:
        stopped = error
    if stopped is None:
        assert pos == len(garbage)
    else:
        assert stopped.position == pos
        assert str(stopped).startswith(f"byte {pos}: ")


def test_the_next_valid_frame_is_found_past_damage() -> None:
    frames = [encode_frame(i, 0, 0, b"k", b"v" * i) for i in range(4)]
    data = bytearray(b"".join(frames))
    data[len(frames[0]) + 10] ^= 0xFF  # damage the second frame
    third = len(frames[0]) + len(frames[1])
    assert find_next_frame(bytes(data), len(frames[0]), 0) == third
    assert find_next_frame(bytes(data), len(frames[0]), 3) == third + len(frames[2])
    assert find_next_frame(bytes(data), len(frames[0]), 4) is None
    assert find_next_frame(b"\0" * 4096, 0, 0) is None


def decoded_walk(
    data: bytes, min_offset: int, below: int | None
) -> tuple[list[tuple[int, int, int, bytes, bytes | None]], int]:
    """What walk_frames must return, by decode_frame: each frame it accepts while the
    offsets ascend from min_offset and stay below ``below``, then where it stopped."""
    taken = []
    pos = 0
    while pos < len(data):
        try:
            record, end = decode_frame(data, pos)
        except FrameError:
            break
        if record.offset < min_offset or (below is not None and record.offset >= below):
            break
        taken.append(
            (record.offset, record.timestamp, record.record_type, record.key, record.value)
        )
        min_offset = record.offset + 1
        pos = end
    return taken, pos


IMPOSSIBLE = [  # (field position, bytes) that make a resealed frame invalid
    (MAGIC_AT, b"\x02"),
    (RECORD_TYPE_AT, b"\x07"),
    (KEY_LENGTH_AT, struct.pack(">I", 2**32 - 1)),
]


@given(
    st.lists(records | large_records, max_size=6),
    st.data(),
    st.sampled_from(["sound", "cut", "flipped", "resealed", "value-length"]),
)
def test_walk_frames_takes_exactly_what_decode_frame_accepts(
    batch: list[LogRecord], data: st.DataObject, damage: str
) -> None:
    """The loaders' fast loop (walk_frames) against the decoder: the same records, and
    the same stop, on sound frames and after every kind of damage, offsets in any order."""
    if data.draw(st.booleans()):  # mostly ascending offsets, as a log holds them
        batch = sorted(batch, key=lambda record: record.offset)
    frames = [encode(r) for r in batch]
    buf = b"".join(frames)
    if frames and damage != "sound":
        at = data.draw(st.integers(0, len(frames) - 1))
        start = sum(len(f) for f in frames[:at])
        frame = frames[at]
        if damage == "cut":
            buf = buf[: start + data.draw(st.integers(0, len(frame) - 1))]
        elif damage == "flipped":
            byte = start + data.draw(st.integers(0, len(frame) - 1))
            buf = buf[:byte] + bytes([buf[byte] ^ 0xFF]) + buf[byte + 1 :]
        elif damage == "resealed":
            field, value = data.draw(st.sampled_from(IMPOSSIBLE))
            buf = buf[:start] + resealed(frame, field, value) + buf[start + len(frame) :]
        else:  # a value length that is not the value's
            key_end = KEY_AT + len(batch[at].key)
            wrong = data.draw(st.sampled_from([-2, -1, 0, 1, 2**31 - 1]))
            bad = resealed(frame, key_end, struct.pack(">i", wrong))
            buf = buf[:start] + bad + buf[start + len(frame) :]
    min_offset = data.draw(st.just(0) | st.integers(0, 2**62))
    below = data.draw(st.none() | st.integers(0, 2**63 - 1))
    assert walk_frames(buf, 0, min_offset, below) == decoded_walk(buf, min_offset, below)
