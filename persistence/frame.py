"""The record frame: the unit written to, and verified in, every segment file.

A segment file is a plain concatenation of frames, nothing before, between or after
them. All integers are big-endian.

    offset  size  field
    0       4     length        u32: number of bytes after this field (= 30 + k + v)
    4       4     crc           u32: zlib.crc32 of bytes [8, 4 + length)
    8       1     magic         u8 = 1, the frame format version; anything else is damage
    9       1     record_type   u8: 0 ShareSnapshot or tombstone, 1 ShareUpdate
                                (protocol.records.RECORD_TYPES); anything else is damage
    10      8     offset        i64, >= 0: the record's offset in its state partition
    18      8     timestamp     i64, ms since the epoch
    26      4     key_length    u32 = k
    30      k     key           opaque bytes (msgpack, written by protocol/)
    30+k    4     value_length  i32 = v, or -1 for a null value (a tombstone)
    34+k    v     value         opaque bytes; absent when value_length is -1

The checksum does not cover the length field: a damaged length makes the checksum run
over the wrong bytes, so it is caught all the same. A length above MAX_FRAME_LENGTH is
damage, never a reason to read 4 GiB.

Decoding tells three outcomes apart: a frame, a clean end (the buffer ends exactly on a
frame boundary), and a FrameError at a byte position, which is either IncompleteFrame
(the buffer ends inside the frame: a torn write, or a write still in progress) or
CorruptFrame (the bytes are there but are not a frame). A CorruptFrame whose checksum
holds is an InvalidFrame: its bytes are exactly what some writer wrote, yet its fields
are impossible (a key or value length that does not add up to the frame length, a
value length below -1, a length field below the smallest frame, an unknown magic byte
or record type, a negative offset). A crash cannot produce one (a torn write is cut
short or fails its checksum), so a reader never takes one for a torn tail, wherever it
lies.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from protocol.loading import RawRecord
from protocol.records import RECORD_TYPES

MAGIC: Final = 1


# Named positions of the fields inside a frame (see the table above).
LENGTH_AT = 0
CRC_AT = 4
CRC_START: Final = 8  # the checksum covers [CRC_START, 4 + length)
MAGIC_AT = 8
RECORD_TYPE_AT = 9
OFFSET_AT = 10
TIMESTAMP_AT = 18
KEY_LENGTH_AT = 26
KEY_AT = 30

LENGTH: Final = struct.Struct(">I")
PREFIX: Final = struct.Struct(">II")  # length, crc
HEADER: Final = struct.Struct(">IIBBqqI")  # length .. key_length: everything before the key
BODY_HEAD: Final = struct.Struct(">BBqqI")  # magic .. key_length: the checksummed part of HEADER
VALUE_LENGTH: Final = struct.Struct(">i")
# What every append calls, bound once: a compiled module (server/native.py) would look
# the method up on the Struct, or the function up on its module, at each call.
_pack_prefix: Final = PREFIX.pack
_pack_body_head: Final = BODY_HEAD.pack
_pack_value_length: Final = VALUE_LENGTH.pack
_crc32: Final = zlib.crc32

HEADER_SIZE: Final = HEADER.size  # 30
assert HEADER_SIZE == KEY_AT
LENGTH_FIELD_SIZE: Final = LENGTH.size
# The length of a frame with an empty key and a null value: the smallest a frame can be.
MIN_LENGTH: Final = HEADER_SIZE - LENGTH_FIELD_SIZE + VALUE_LENGTH.size  # 30
MAX_FRAME_LENGTH: Final = 64 * 1024 * 1024
# walk_frames checksums frames shorter than this over a copy of their bytes.
CRC_COPY_BELOW = 4096
NULL_VALUE_LENGTH: Final = -1
# A length field below MIN_LENGTH is still checked against the bytes it claims when the
# checksum then covers at least one byte: one that holds was written so (InvalidFrame).
SHORTEST_CHECKED_LENGTH = CRC_START - LENGTH_FIELD_SIZE + 1  # 5
_KNOWN_TYPES = " or ".join(map(str, RECORD_TYPES))


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of a state partition's log, as appended and as read back."""

    offset: int
    timestamp: int
    record_type: int
    key: bytes
    value: bytes | None  # None is a tombstone


class FrameError(Exception):
    """The bytes at `position` are not a whole, valid frame."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(position, reason)
        self.position = position
        self.reason = reason

    def __str__(self) -> str:
        return f"byte {self.position}: {self.reason}"


class IncompleteFrame(FrameError):
    """The buffer ends inside the frame starting at `position`.

    `needed` is how many bytes from `position` the frame needs, when its length field
    could be read (0 when even the length field is cut)."""

    def __init__(self, position: int, reason: str, needed: int) -> None:
        super().__init__(position, reason)
        self.needed = needed


class CorruptFrame(FrameError):
    """The bytes at `position` are present but do not form a valid frame."""


class InvalidFrame(CorruptFrame):
    """The frame at `position` has a checksum that holds but fields no writer makes (the
    module docstring): never a torn write."""


def encode_frame(
    offset: int, timestamp: int, record_type: int, key: bytes, value: bytes | None
) -> bytes:
    """Return the frame for one record. Raises ValueError for a record no frame can hold."""
    frame = bytearray()
    encode_frame_into(frame, offset, timestamp, record_type, key, value)
    return bytes(frame)


def encode_frame_into(
    buffer: bytearray,
    offset: int,
    timestamp: int,
    record_type: int,
    key: bytes,
    value: bytes | None,
) -> None:
    """Append the frame of one record to ``buffer``, where a commit writes it from as
    it is. (Measured: packing the header in place with ``pack_into`` and checksumming
    through a memoryview costs more than this, ~1.0 µs against ~0.65 µs a frame.)"""
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    value_length = NULL_VALUE_LENGTH if value is None else len(value)
    length = MIN_LENGTH + len(key) + max(value_length, 0)
    if length > MAX_FRAME_LENGTH:
        raise ValueError(f"record of {length} bytes exceeds the frame limit {MAX_FRAME_LENGTH}")
    try:
        body = b"".join(
            (
                _pack_body_head(MAGIC, record_type, offset, timestamp, len(key)),
                key,
                _pack_value_length(value_length),
                value or b"",
            )
        )
    except struct.error as exc:
        raise ValueError(f"record field out of range: {exc}") from None
    # An object, not an int: compiled, an int would be unboxed and boxed again (a new
    # object each frame) on its way from crc32 into pack.
    crc: object = _crc32(body)
    buffer += _pack_prefix(length, crc)
    buffer += body


def frame_crc(frame: bytes | memoryview) -> int:
    """The checksum stored in an encoded frame."""
    crc: int = PREFIX.unpack_from(frame, 0)[1]
    return crc


def decode_frame(buf: bytes | memoryview, pos: int = 0) -> tuple[LogRecord, int]:
    """Decode the frame that starts at buf[pos]; return it and the position after it.

    Raises IncompleteFrame if buf ends before the frame does (pos == len(buf) included:
    check for a clean end first), CorruptFrame if the bytes are not a valid frame."""
    available = len(buf) - pos
    if available < LENGTH_FIELD_SIZE:
        raise IncompleteFrame(pos, f"{available} bytes left, the length field needs 4", 0)
    (length,) = LENGTH.unpack_from(buf, pos)
    if length < MIN_LENGTH or length > MAX_FRAME_LENGTH:
        raise _bad_length(buf, pos, length)
    end = pos + LENGTH_FIELD_SIZE + length
    if end > len(buf):
        raise IncompleteFrame(
            pos,
            f"frame of {LENGTH_FIELD_SIZE + length} bytes cut after {available}",
            LENGTH_FIELD_SIZE + length,
        )
    _, crc, magic, record_type, offset, timestamp, key_length = HEADER.unpack_from(buf, pos)
    actual_crc = zlib.crc32(memoryview(buf)[pos + CRC_START : end])
    if actual_crc != crc:
        raise CorruptFrame(
            pos, f"checksum mismatch: stored {crc:#010x}, computed {actual_crc:#010x}"
        )
    # The checksum holds: whatever is wrong from here on was written so (InvalidFrame).
    if magic != MAGIC:
        raise InvalidFrame(pos, f"magic byte {magic}, expected {MAGIC}")
    if record_type not in RECORD_TYPES:
        raise InvalidFrame(pos, f"record type {record_type}, expected {_KNOWN_TYPES}")
    if offset < 0:
        raise InvalidFrame(pos, f"negative record offset {offset}")
    key_end = pos + KEY_AT + key_length
    if key_end + VALUE_LENGTH.size > end:
        raise InvalidFrame(pos, f"key length {key_length} overruns the frame")
    (value_length,) = VALUE_LENGTH.unpack_from(buf, key_end)
    value_start = key_end + VALUE_LENGTH.size
    if value_length < NULL_VALUE_LENGTH or value_start + max(value_length, 0) != end:
        raise InvalidFrame(pos, f"value length {value_length} disagrees with the frame length")
    value = None if value_length == NULL_VALUE_LENGTH else bytes(buf[value_start:end])
    record = LogRecord(offset, timestamp, record_type, bytes(buf[pos + KEY_AT : key_end]), value)
    return record, end


def _bad_length(buf: bytes | memoryview, pos: int, length: int) -> FrameError:
    """What a length field outside [MIN_LENGTH, MAX_FRAME_LENGTH] makes of the frame: an
    InvalidFrame if it is short and the checksum over the bytes it claims holds, an
    IncompleteFrame if those bytes are not all there yet, else a CorruptFrame."""
    reason = f"length field {length} outside [{MIN_LENGTH}, {MAX_FRAME_LENGTH}]"
    if not SHORTEST_CHECKED_LENGTH <= length < MIN_LENGTH:
        return CorruptFrame(pos, reason)
    end = pos + LENGTH_FIELD_SIZE + length
    if end > len(buf):
        return IncompleteFrame(pos, f"{reason}, cut after {len(buf) - pos} bytes", end - pos)
    _, crc = PREFIX.unpack_from(buf, pos)
    if zlib.crc32(memoryview(buf)[pos + CRC_START : end]) == crc:
        return InvalidFrame(pos, f"{reason}, yet its checksum holds")
    return CorruptFrame(pos, reason)


def iter_frames(buf: bytes | memoryview, pos: int = 0) -> Iterator[tuple[int, LogRecord]]:
    """Yield (position, record) for each frame from buf[pos] up to a clean end.

    Raises FrameError at the first position that does not hold a whole valid frame."""
    while pos < len(buf):
        record, end = decode_frame(buf, pos)
        yield pos, record
        pos = end


def find_next_frame(buf: bytes | memoryview, after: int, min_offset: int) -> int | None:
    """The position of the first valid frame starting after `after` whose offset is at
    least `min_offset`, or None. Used to tell a torn tail (nothing valid follows the
    damage) from damage in the middle (valid frames follow it)."""
    magic = bytes((MAGIC,))
    view = bytes(buf) if isinstance(buf, memoryview) else buf
    search_from = after + 1 + MAGIC_AT
    while True:
        found = view.find(magic, search_from)
        if found < 0:
            return None
        candidate = found - MAGIC_AT
        search_from = found + 1
        try:
            record, _ = decode_frame(view, candidate)
        except FrameError:
            continue
        if record.offset >= min_offset:
            return candidate


def walk_frames(
    buf: bytes, pos: int, min_offset: int, below_offset: int | None
) -> tuple[list[RawRecord], int]:
    """The records of the whole valid frames from buf[pos] on, each with an offset at
    least `min_offset` (and above the one before) and below `below_offset`, and the
    position of the first frame not taken: the end of `buf`, or a frame cut short or
    not accepted there. The checks of ``decode_frame`` and the readers' offset order,
    without a LogRecord per frame: a loop a third as costly, for the readers that take
    every frame of a file (loading, compaction). Why a frame was not taken is left to
    those readers (``decode_frame`` says)."""
    unpack_header = HEADER.unpack_from
    unpack_value_length = VALUE_LENGTH.unpack_from
    crc32 = zlib.crc32
    # The module's constants as locals, and the value length by struct rather than a
    # slice and int.from_bytes: together 0.69x the loop's CPU per frame (measured
    # against the loop before on the bench's 1M-record log; not measured apart).
    header_size, length_field, crc_start, key_at = HEADER_SIZE, LENGTH_FIELD_SIZE, CRC_START, KEY_AT
    shortest, longest, magic_byte, types = MIN_LENGTH, MAX_FRAME_LENGTH, MAGIC, RECORD_TYPES
    null_length, value_length_size = NULL_VALUE_LENGTH, VALUE_LENGTH.size
    # A small frame's checksum over a copy of its bytes: a bytes slice costs less than a
    # memoryview slice (80 against 200 ns for the bench's frames); a large one through
    # the view, never copied.
    copy_below = CRC_COPY_BELOW
    view = memoryview(buf)
    size = len(buf)
    below = below_offset if below_offset is not None else 1 << 63
    records: list[RawRecord] = []
    append = records.append
    value: bytes | None
    while pos < size:
        if size - pos < header_size:
            break
        # Typed, so that the compiled mode unpacks the header as seven machine
        # integers and compares them natively: 450 against 690 ns a frame there (the
        # bench's 1M-record log; the pure loop unchanged at ~650).
        header: tuple[int, int, int, int, int, int, int] = unpack_header(buf, pos)
        length, crc, magic, record_type, offset, timestamp, key_length = header
        end = pos + length_field + length
        if (
            length < shortest
            or length > longest
            or end > size
            or crc32(
                buf[pos + crc_start : end] if length < copy_below else view[pos + crc_start : end]
            )
            != crc
            or magic != magic_byte
            or record_type not in types
            or offset < min_offset
            or offset >= below
        ):
            break
        key_end = pos + key_at + key_length
        value_start = key_end + value_length_size
        if value_start > end:
            break
        value_length: int = unpack_value_length(buf, key_end)[0]
        if value_length == null_length:
            if value_start != end:
                break
            value = None
        elif value_length < null_length or value_start + value_length != end:
            break
        else:
            value = buf[value_start:end]
        append((offset, timestamp, record_type, buf[pos + key_at : key_end], value))
        min_offset = offset + 1
        pos = end
    view.release()
    return records, pos


def last_frame_of(buf: bytes, end: int, record: RawRecord) -> tuple[int, int]:
    """(checksum, position) of the frame of `record`, which ends at buf[end]."""
    _, _, _, key, value = record
    at = end - (HEADER_SIZE + len(key) + VALUE_LENGTH.size + len(value or b""))
    crc: int = PREFIX.unpack_from(buf, at)[1]
    return crc, at
