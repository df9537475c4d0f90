"""Kafka's wire primitives: what every request and response of the Kafka protocol is
made of. Pure, no I/O: bytes in, values out, and the reverse. The messages made of them
are declared in ``protocol/kafka_specs`` and compiled by ``protocol.kafka_codec``;
``protocol.kafka_wire`` is the module the rest of the code reads the wire through.

Primitives (all integers big-endian, two's complement):

| type | bytes | notes |
| --- | --- | --- |
| int8, int16, int32, int64 | 1, 2, 4, 8 | |
| unsigned varint | 1-5 | 7 bits per byte, low group first, high bit = more follows (a uint32) |
| varint | 1-5 | zigzag-encoded int32 in an unsigned varint |
| uuid | 16 | the 16 bytes of a Kafka Uuid; a topic id prints as their base64url, 22 chars |
| string | int16 N, N bytes UTF-8 | N = -1 is null (nullable string only) |
| compact string | uvarint N+1, N bytes UTF-8 | 0 is null (nullable compact string only) |
| bytes | int32 N, N bytes | N = -1 is null (nullable bytes only) |
| compact bytes | uvarint N+1, N bytes | 0 is null (nullable compact bytes only) |
| array | int32 N, N elements | N = -1 is null |
| compact array | uvarint N+1, N elements | 0 is null |
| tagged fields | uvarint count; each: uvarint tag, size, bytes | end flexible structures |

Unknown tagged fields are skipped whole.

Everything malformed (a read past the end, a null where none is allowed, a varint of
more than five bytes, invalid UTF-8, a count larger than the bytes left) raises
``WireError``; a server closes the connection on it, as Kafka does.
"""

from __future__ import annotations

import struct

__all__ = [
    "Reader",
    "WireError",
    "bytes_",
    "compact_array_length",
    "compact_bytes",
    "compact_string",
    "frame",
    "int8",
    "int16",
    "int32",
    "int64",
    "nullable_bytes",
    "nullable_compact_bytes",
    "nullable_compact_string",
    "nullable_string",
    "peek_api",
    "string",
    "uvarint",
    "varint",
]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_API = struct.Struct(">hh")


class WireError(ValueError):
    """Bytes that are not what the schema says: the connection is closed."""


class Reader:
    """A cursor over one frame's bytes. Every read checks the bounds."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> int:
        pos = self.pos
        if n > self.end - pos:
            raise WireError(f"truncated: {n} bytes wanted at byte {pos}, {self.end - pos} left")
        self.pos = pos + n
        return pos

    def int8(self) -> int:
        value: int = _I8.unpack_from(self.buf, self._take(1))[0]
        return value

    def int16(self) -> int:
        value: int = _I16.unpack_from(self.buf, self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack_from(self.buf, self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _I64.unpack_from(self.buf, self._take(8))[0]
        return value

    def uvarint(self) -> int:
        """An unsigned varint of at most five bytes (a uint32), as Kafka reads them."""
        buf, pos, end = self.buf, self.pos, self.end
        if pos < end and buf[pos] < 0x80:  # the common case: one byte
            self.pos = pos + 1
            return buf[pos]
        value = shift = 0
        for _ in range(5):
            if pos >= end:
                raise WireError(f"truncated varint at byte {self.pos}")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                if value > 0xFFFFFFFF:
                    raise WireError("an unsigned varint beyond 32 bits")
                return value
            shift += 7
        raise WireError(f"a varint of more than five bytes at byte {self.pos}")

    def varint(self) -> int:
        """A zigzag-encoded int32."""
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def uuid(self) -> bytes:
        pos = self._take(16)
        return bytes(self.buf[pos : pos + 16])

    def _text(self, n: int) -> str:
        pos = self._take(n)
        try:
            return str(self.buf[pos : pos + n], "utf-8")
        except UnicodeDecodeError:
            raise WireError(f"a string that is not UTF-8 at byte {pos}") from None

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise WireError("null where a string is required")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < 0:
            if n != -1:
                raise WireError(f"a string length of {n}")
            return None
        return self._text(n)

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise WireError("null where a string is required")
        return self._text(n)

    def nullable_compact_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._text(n)

    def bytes_(self) -> bytes:
        n = self.int32()
        if n < 0:
            raise WireError("null where bytes are required")
        pos = self._take(n)
        return bytes(self.buf[pos : pos + n])

    def compact_bytes(self) -> bytes:
        n = self.uvarint() - 1
        if n < 0:
            raise WireError("null where bytes are required")
        pos = self._take(n)
        return bytes(self.buf[pos : pos + n])

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n < 0:
            if n != -1:
                raise WireError(f"a bytes length of {n}")
            return None
        pos = self._take(n)
        return bytes(self.buf[pos : pos + n])

    def nullable_compact_bytes(self) -> bytes | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        pos = self._take(n)
        return bytes(self.buf[pos : pos + n])

    def _count(self, n: int) -> int:
        # Every element takes a byte at least: a count beyond the bytes left is a lie,
        # refused before anything is sized by it.
        if n > self.end - self.pos:
            raise WireError(f"an array of {n} elements in {self.end - self.pos} bytes")
        return n

    def array_length(self) -> int:
        n = self.int32()
        if n < 0:
            raise WireError("null where an array is required")
        return self._count(n)

    def compact_array_length(self) -> int:
        n = self.uvarint() - 1
        if n < 0:
            raise WireError("null where an array is required")
        return self._count(n)

    def nullable_array_length(self) -> int:
        """-1 for a null array."""
        n = self.int32()
        if n < 0:
            if n != -1:
                raise WireError(f"an array length of {n}")
            return -1
        return self._count(n)

    def nullable_compact_array_length(self) -> int:
        """-1 for a null array."""
        n = self.uvarint() - 1
        return -1 if n < 0 else self._count(n)

    def tag_count(self) -> int:
        """How many tagged fields follow; a count beyond the bytes left is refused before
        anything loops on it."""
        return self._count(self.uvarint())

    def skip_tagged_fields(self) -> None:
        """Tagged fields we know none of: skipped whole."""
        buf, pos = self.buf, self.pos
        if pos < self.end and buf[pos] == 0:  # the common case: none
            self.pos = pos + 1
            return
        for _ in range(self.tag_count()):
            self.uvarint()  # the tag
            self._take(self.uvarint())

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise WireError(f"{self.end - self.pos} bytes after the end of the message")


# --- writing --------------------------------------------------------------------------

_SMALL_UVARINTS = [bytes([n]) for n in range(128)]


def uvarint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL_UVARINTS[n]
    if n < 0 or n > 0xFFFFFFFF:
        raise ValueError(f"{n} is not a uint32")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint(n: int) -> bytes:
    if not -(2**31) <= n < 2**31:
        raise ValueError(f"{n} is not an int32")
    return uvarint(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def int8(n: int) -> bytes:
    return _I8.pack(n)


def int16(n: int) -> bytes:
    return _I16.pack(n)


def int32(n: int) -> bytes:
    return _I32.pack(n)


def int64(n: int) -> bytes:
    return _I64.pack(n)


def string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def nullable_string(text: str | None) -> bytes:
    return b"\xff\xff" if text is None else string(text)


def compact_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return uvarint(len(raw) + 1) + raw


def nullable_compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    # Messages may quote what a client sent; what UTF-8 cannot carry is escaped.
    raw = text.encode("utf-8", "backslashreplace")
    return uvarint(len(raw) + 1) + raw


def bytes_(raw: bytes) -> bytes:
    return _I32.pack(len(raw)) + raw


def nullable_bytes(raw: bytes | None) -> bytes:
    return b"\xff\xff\xff\xff" if raw is None else bytes_(raw)


def compact_bytes(raw: bytes) -> bytes:
    return uvarint(len(raw) + 1) + raw


def nullable_compact_bytes(raw: bytes | None) -> bytes:
    return b"\x00" if raw is None else compact_bytes(raw)


def compact_array_length(n: int) -> bytes:
    return uvarint(n + 1)


def frame(*parts: bytes) -> bytes:
    """Parts joined behind their int32 size."""
    body = b"".join(parts)
    return _I32.pack(len(body)) + body


def peek_api(buf: bytes) -> tuple[int, int]:
    """``(api_key, api_version)``, the first four bytes of every request: what decides
    how the rest of the header reads."""
    if len(buf) < 4:
        raise WireError("a request shorter than its api key and version")
    key, version = _API.unpack_from(buf, 0)
    return key, version
