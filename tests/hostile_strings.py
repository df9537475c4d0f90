"""Strings of hostile bytes at any string position of a body, in both encodings, and the
problem the daemon names for each (docs/api.md "How a body is checked").

No encoder writes these: bytes that are not UTF-8 (overlong forms and UTF-16 surrogates
encoded in UTF-8 among them, which UTF-8 forbids), JSON escapes of lone surrogates as
they are, raw control characters inside a JSON string. A body is built with
``PLACEHOLDER`` where the hostile string goes, encoded, and the placeholder's bytes are
then replaced by the hostile ones (``encode_with``).
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
from hypothesis import strategies as st

from protocol.codec import Format

PLACEHOLDER = "HOSTILE-BYTES-GO-HERE"

NOT_UTF8 = "expected UTF-8 text, got "
# kind -> (the string's bytes, what the message says of them)
_NOT_UTF8: dict[str, tuple[bytes, str]] = {
    "invalid": (b"g\xff\xfe", "bytes that are not UTF-8 (ff fe) at byte 1"),
    "cut short": (b"ab\xe2\x82", "bytes that are not UTF-8 (e2 82) at byte 2"),
    "continuation alone": (b"\x80", "bytes that are not UTF-8 (80) at byte 0"),
    "overlong 2": (b"\xc0\xaf", "an overlong UTF-8 form (c0 af) at byte 0"),
    "overlong 3": (b"\xe0\x80\xaf", "an overlong UTF-8 form (e0 80 af) at byte 0"),
    "overlong 4": (b"\xf0\x80\x80\xaf", "an overlong UTF-8 form (f0 80 80 af) at byte 0"),
    "surrogate": (b"\xed\xa0\x80", "a UTF-16 surrogate encoded in UTF-8 (ed a0 80) at byte 0"),
    "low surrogate": (
        b"\xe2\x82\xac\xed\xbf\xbf",
        "a UTF-16 surrogate encoded in UTF-8 (ed bf bf) at byte 3",
    ),
    "beyond U+10FFFF": (b"\xf4\x90\x80\x80", "bytes that are not UTF-8 (f4 90 80 80) at byte 0"),
    "five bytes": (b"\xf8\x88\x80\x80\x80", "bytes that are not UTF-8 (f8 88 80 80) at byte 0"),
}
# Bytes that are not UTF-8, whatever the encoding: kind -> (bytes, the problem).
HOSTILE_STRINGS: dict[str, tuple[bytes, str]] = {
    kind: (raw, f"{NOT_UTF8}{what} of the string") for kind, (raw, what) in _NOT_UTF8.items()
}
# What only JSON text can carry.
JSON_ONLY_STRINGS: dict[str, tuple[bytes, str]] = {
    "escaped surrogate": (
        b"\\ud800",
        "expected valid Unicode text, got a lone surrogate (\\ud800) at character 0 of the string",
    ),
    "escaped low surrogate": (
        b"a\\udfff",
        "expected valid Unicode text, got a lone surrogate (\\udfff) at character 1 of the string",
    ),
    "raw NUL": (
        b"a\x00",
        "a raw control character (U+0000) at character 1 of the string: a JSON string "
        "carries it escaped, as \\u0000",
    ),
    "raw escape character": (
        b"\x1b[31m",
        "a raw control character (U+001B) at character 0 of the string: a JSON string "
        "carries it escaped, as \\u001b",
    ),
}


def is_json(fmt: object) -> bool:
    return fmt in ("json", Format.JSON)


def hostile_strings(fmt: object) -> dict[str, tuple[bytes, str]]:
    """Every kind the encoding can carry: kind -> (bytes, the problem)."""
    return {**HOSTILE_STRINGS, **(JSON_ONLY_STRINGS if is_json(fmt) else {})}


def msgpack_str(raw: bytes) -> bytes:
    """A msgpack str of exactly ``raw``, whatever it holds."""
    if len(raw) < 32:
        return bytes([0xA0 | len(raw)]) + raw
    if len(raw) < 256:
        return b"\xd9" + bytes([len(raw)]) + raw
    return b"\xda" + len(raw).to_bytes(2, "big") + raw


def encode_with(obj: Any, raw: bytes, fmt: object) -> bytes:
    """``obj`` encoded as ``fmt`` (``"json"``/``"msgpack"`` or a ``Format``), its strings
    ``PLACEHOLDER`` made of exactly the bytes ``raw``."""
    if is_json(fmt):
        return json.dumps(obj).encode().replace(PLACEHOLDER.encode(), raw)
    # Another lone surrogate in obj is written as msgpack would write its UTF-8.
    packed = msgpack.packb(obj, unicode_errors="surrogatepass")
    return packed.replace(msgpack.packb(PLACEHOLDER), msgpack_str(raw))


# --- strategies, for the fuzzers ------------------------------------------------------------


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


_TEXT_BYTES = st.text(max_size=6).map(lambda text: text.encode("utf-8", "surrogatepass"))
_ANY_NOT_UTF8 = st.one_of(
    st.sampled_from([raw for raw, _ in HOSTILE_STRINGS.values()]),
    st.binary(min_size=1, max_size=12).filter(lambda raw: not _is_utf8(raw)),
)


def not_utf8() -> st.SearchStrategy[bytes]:
    """Bytes no UTF-8 decoder takes, in a string that may be valid around them."""
    return st.builds(lambda a, b, c: a + b + c, _TEXT_BYTES, _ANY_NOT_UTF8, _TEXT_BYTES)


_JSON_ONLY = st.sampled_from(
    [
        *(raw for raw, _ in JSON_ONLY_STRINGS.values()),
        b"\\udc00", b"\\ud83d", b"\\udfff\\ud800", b"x\\ud800y",  # lone, and pairs reversed
        *(bytes([c]) for c in range(0x20)),  # every raw control character
    ]
)  # fmt: skip


def hostile_text(fmt: object) -> st.SearchStrategy[bytes]:
    """The bytes of a string no body of ``fmt`` may carry: not UTF-8, and in JSON also
    lone surrogate escapes and raw control characters. In JSON text they never hold a
    quote or a backslash that would end the string or escape what follows."""
    if not is_json(fmt):
        return not_utf8()
    plain = not_utf8().filter(lambda raw: b'"' not in raw and b"\\" not in raw)
    around = _TEXT_BYTES.filter(lambda raw: b'"' not in raw and b"\\" not in raw)
    json_only = st.builds(lambda a, b, c: a + b + c, around, _JSON_ONLY, around)
    return st.one_of(plain, json_only)
