"""Why a body does not fit the schema: the error path of every decoder.

The decoders run msgspec on the bytes; that is the whole cost of a good body. A body
msgspec refuses is parsed again with the standard parsers and walked here, against the
same declarations (``msgspec.inspect``), to name the first field that is wrong, in
declaration order, with what was expected (taken from the declarations' widths and
``expected`` phrases) and what was received. The rules are docs/api.md's and
docs/semantics.md §A.1's:

* integers are exactly ``int`` (never a bool or a float, not even ``1.0``) within their
  width; strings are exactly ``str`` (msgpack bin is not a string);
* a field without a default is required; unknown fields are ignored;
* strings must be text: UTF-8 in the body, no lone surrogate (a JSON escape can make
  one); the error path's parsers (``protocol.reparse``) mark what the bytes held, so
  that the message says which (``text_problem``);
* a topic id is a Kafka Uuid in either spelling (``protocol.topic_id``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from msgspec import inspect as mi

from protocol.topic_id import canonical_topic_id

__all__ = [
    "NESTED_TOO_DEEP",
    "BigInteger",
    "BodyError",
    "describe",
    "expected",
    "first_problem",
    "text_problem",
]

NESTED_TOO_DEEP = (
    "the body nests lists and maps too deeply to be decoded (hundreds of levels); "
    "no body of the API nests more than 7"
)


class BodyError(ValueError):
    """A body that cannot be used: HTTP 400 with ``{"error_code": 42, ...}``.

    ``field`` is the path of the offending field (``topics[0].partitions[2].state_epoch``),
    ``""`` for the whole body; ``problem`` says what was wrong and what was expected.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)

    def __reduce__(self) -> tuple[type[BodyError], tuple[str, str]]:
        return (BodyError, (self.field, self.problem))

    def under(self, prefix: str) -> BodyError:
        """The same error with its field path placed below ``prefix``."""
        if not self.field:
            return BodyError(prefix, self.problem)
        sep = "" if self.field.startswith("[") else "."
        return BodyError(f"{prefix}{sep}{self.field}", self.problem)


class BigInteger:
    """An integer literal of a JSON body too long to convert (Python refuses more than
    4300 digits): what ``protocol.reparse`` puts in its place, so that the walk can name
    the field that holds it."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def describe(value: object) -> str:
    """A short, safe description of a received value for an error message."""
    if value is None:
        return "null"
    if value is True or value is False:
        return f"a boolean ({str(value).lower()})"
    if type(value) is int:
        bits = value.bit_length()
        return str(value) if bits <= 128 else f"an integer of {bits} bits"
    if type(value) is float:
        return f"a float ({value!r})"
    if type(value) is str:
        if not value.isascii() and _SURROGATE.search(value):
            return "a string that is not valid Unicode text"
        # repr escapes what is not printable, so the message is one line and encodes.
        return f"a string ({value!r})" if len(value) <= 40 else f"a string ({value[:40]!r}...)"
    if type(value) is BigInteger:
        return f"an integer of {value.digits} digits"
    if type(value) is bytes:
        return "binary data (msgpack bin)"
    if type(value) is list or type(value) is tuple:
        return "a list"
    if type(value) is dict:
        return "a map"
    return f"a msgpack {type(value).__name__}"


@functools.cache
def _type_info(declared: Any) -> mi.Type:
    return mi.type_info(declared)


def first_problem(value: object, declared: Any, *, marked: bool = False) -> BodyError | None:
    """The first way ``value`` (a parsed body) fails to fit ``declared``, or None.
    ``marked``: its strings carry the marks of ``protocol.reparse`` (``text_problem``)."""
    info = _type_info(declared)
    if isinstance(info, mi.StructType) and type(value) is not dict:
        return BodyError("", f"expected the body to be a map, got {describe(value)}")
    return _check(value, info, "", marked)


# U+DC80-U+DCFF: a byte that is not UTF-8 (Python's "surrogateescape"); U+DC00-U+DC1F: a
# raw control character in a JSON string. Both are surrogates no UTF-8 body can carry.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_BYTE_MARKS = range(0xDC80, 0xDD00)
_CONTROL_MARKS = range(0xDC00, 0xDC20)
_RUN_SHOWN = 4  # bytes of a run that is not UTF-8 quoted in a message


def text_problem(text: str, marked: bool = False) -> str | None:
    """Why ``text`` is not a string the API can take, or None: bytes that are not UTF-8,
    a raw control character in a JSON string, or a lone surrogate. ``marked``: the
    text's surrogates are marks ``protocol.reparse`` made of the body's bytes (above);
    otherwise every surrogate is one a JSON escape (``\\ud800``) made."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    at = found.start()
    code = ord(text[at])
    if marked and code in _BYTE_MARKS:
        end = at
        while end < len(text) and end - at < _RUN_SHOWN and ord(text[end]) in _BYTE_MARKS:
            end += 1
        raw = bytes(ord(c) - 0xDC00 for c in text[at:end])
        offset = len(text[:at].encode("utf-8"))
        return (
            f"expected UTF-8 text, got {_not_utf8(raw)} ({raw.hex(' ')}) "
            f"at byte {offset} of the string"
        )
    if marked and code in _CONTROL_MARKS:
        control = code - 0xDC00
        return (
            f"a raw control character (U+{control:04X}) at character {at} of the string: "
            f"a JSON string carries it escaped, as \\u{control:04x}"
        )
    return (
        f"expected valid Unicode text, got a lone surrogate (\\u{code:04x}) "
        f"at character {at} of the string"
    )


def _not_utf8(raw: bytes) -> str:
    """What a run of bytes that do not decode is, in words."""
    first, second = raw[0], raw[1] if len(raw) > 1 else 0
    # A lead byte, then a continuation byte (0x80-0xBF) that UTF-8 does not allow after it.
    if first in (0xC0, 0xC1) or (first, second >> 4) in ((0xE0, 8), (0xE0, 9), (0xF0, 8)):
        return "an overlong UTF-8 form"
    if first == 0xED and 0xA0 <= second <= 0xBF:
        return "a UTF-16 surrogate encoded in UTF-8"
    return "bytes that are not UTF-8"


def expected(info: mi.Type) -> str:
    """What a field of this declared type must hold, in words."""
    if isinstance(info, mi.Metadata):
        phrase = (info.extra or {}).get("expected")
        return phrase if isinstance(phrase, str) else expected(info.type)
    if isinstance(info, mi.IntType):
        return "an integer"
    if isinstance(info, mi.StrType):
        return "a non-empty string" if info.min_length else "a string"
    if isinstance(info, mi.ListType):
        return "a list"
    if isinstance(info, mi.StructType):
        return "a map"
    if isinstance(info, mi.NoneType):
        return "null"
    if isinstance(info, mi.UnionType):
        return " or ".join(expected(t) for t in info.types)
    return "a value"


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check(
    value: object, info: mi.Type, path: str, marked: bool, wanted: str | None = None
) -> BodyError | None:
    wanted = wanted or expected(info)
    if isinstance(info, mi.Metadata):
        problem = _check(value, info.type, path, marked, wanted)
        if problem is None and (info.extra or {}).get("check") == "topic_id":
            try:
                canonical_topic_id(value)  # type: ignore[arg-type]
            except ValueError:
                return BodyError(path, f"expected {wanted}, got {describe(value)}")
        return problem
    if isinstance(info, mi.UnionType):
        if value is None and any(isinstance(t, mi.NoneType) for t in info.types):
            return None
        others = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return _check(value, others[0], path, marked, wanted) if len(others) == 1 else None
    if isinstance(info, mi.IntType):
        if type(value) is not int or not _in_bounds(value, info):
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        return None
    if isinstance(info, mi.StrType):
        if type(value) is not str or (info.min_length and len(value) < info.min_length):
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        unfit = text_problem(value, marked)
        return None if unfit is None else BodyError(path, unfit)
    if isinstance(info, mi.ListType):
        if type(value) is not list:
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        for i, item in enumerate(value):
            problem = _check(item, info.item_type, f"{path}[{i}]", marked)
            if problem is not None:
                return problem
        return None
    if isinstance(info, mi.StructType):
        if type(value) is not dict:
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        for f in info.fields:
            at = _at(path, f.encode_name)
            if f.encode_name not in value:
                if f.required:
                    return BodyError(at, f"missing required field, expected {expected(f.type)}")
                continue
            problem = _check(value[f.encode_name], f.type, at, marked)
            if problem is not None:
                return problem
        return None
    if isinstance(info, mi.NoneType):
        return None if value is None else BodyError(path, f"expected null, got {describe(value)}")
    return None


def _in_bounds(value: int, info: mi.IntType) -> bool:
    if info.ge is not None and value < info.ge:
        return False
    if info.le is not None and value > info.le:
        return False
    if info.gt is not None and value <= info.gt:
        return False
    return not (info.lt is not None and value >= info.lt)


def msgspec_problem(exc: BaseException) -> BodyError:
    """msgspec's own account of a failure, as a BodyError (used only when the walk
    found nothing to say, which would be a disagreement between the two)."""
    if isinstance(exc, RecursionError):
        return BodyError("", NESTED_TOO_DEEP)
    if isinstance(exc, UnicodeDecodeError):
        return BodyError("", "the body holds a string that is not UTF-8")
    text = str(exc)
    problem, sep, where = text.rpartition(" - at `")
    if not sep:
        return BodyError("", text)
    path = where.rstrip("`")
    path = path[2:] if path.startswith("$.") else path.lstrip("$")
    return BodyError(path, problem)
