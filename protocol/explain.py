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
* strings that are stored or echoed must be encodable as UTF-8 (JSON can carry lone
  surrogates);
* a topic id is a Kafka Uuid in either spelling (``protocol.topic_id``).
"""

from __future__ import annotations

import functools
from typing import Any

from msgspec import inspect as mi

from protocol.topic_id import canonical_topic_id

__all__ = ["BodyError", "describe", "expected", "first_problem"]


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
        # repr escapes lone surrogates, so the message always encodes.
        return f"a string ({value!r})" if len(value) <= 40 else f"a string ({value[:40]!r}...)"
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


def first_problem(value: object, declared: Any) -> BodyError | None:
    """The first way ``value`` (a parsed body) fails to fit ``declared``, or None."""
    info = _type_info(declared)
    if isinstance(info, mi.StructType) and type(value) is not dict:
        return BodyError("", f"expected the body to be a map, got {describe(value)}")
    return _check(value, info, "")


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


def _check(value: object, info: mi.Type, path: str, wanted: str | None = None) -> BodyError | None:
    wanted = wanted or expected(info)
    if isinstance(info, mi.Metadata):
        problem = _check(value, info.type, path, wanted)
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
        return _check(value, others[0], path, wanted) if len(others) == 1 else None
    if isinstance(info, mi.IntType):
        if type(value) is not int or not _in_bounds(value, info):
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        return None
    if isinstance(info, mi.StrType):
        if type(value) is not str or (info.min_length and len(value) < info.min_length):
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return BodyError(
                    path, "expected valid Unicode text, got a string with a lone surrogate"
                )
        return None
    if isinstance(info, mi.ListType):
        if type(value) is not list:
            return BodyError(path, f"expected {wanted}, got {describe(value)}")
        for i, item in enumerate(value):
            problem = _check(item, info.item_type, f"{path}[{i}]")
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
            problem = _check(value[f.encode_name], f.type, at)
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


def msgspec_problem(exc: Exception) -> BodyError:
    """msgspec's own account of a failure, as a BodyError (used only when the walk
    found nothing to say, which would be a disagreement between the two)."""
    text = str(exc)
    problem, sep, where = text.rpartition(" - at `")
    if not sep:
        return BodyError("", text)
    path = where.rstrip("`")
    path = path[2:] if path.startswith("$.") else path.lstrip("$")
    return BodyError(path, problem)
