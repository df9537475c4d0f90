"""The error path's parsers: a body msgspec refused, parsed again with the standard
parsers so that ``protocol.explain`` can name what is wrong and where, or, when it does
not parse at all, why, in the API's words rather than the parser's.

They differ from the standard parsers in what they keep for the walk:

* A string's bytes that are not UTF-8 (overlong forms and encoded surrogates included)
  come out as the surrogates U+DC80-U+DCFF (Python's ``surrogateescape``), and in JSON
  a raw control character other than tab, newline and carriage return (JSON allows none
  in a string) as U+DC00-U+DC1F: ``explain.text_problem`` then names the field and what
  the bytes were. Such bytes in a field the API does not know are ignored, as msgspec
  ignores them; a raw control character is not, wherever it is: the body is not JSON.
* A JSON integer literal too long to convert (Python refuses more than 4300 digits) is
  a ``BigInteger``, so that the walk names the field that holds it.

A body that does not parse gets one sentence: empty, a byte order mark in front, not
UTF-8 where no string is, nested too deeply, cut short, something after its end, a
syntax error with its line and column. These raise ``BodyError`` with no field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import msgpack

from protocol.explain import NESTED_TOO_DEEP, BigInteger, BodyError

__all__ = ["Reparsed", "reparse_json", "reparse_msgpack"]


@dataclass(frozen=True, slots=True)
class Reparsed:
    """A parsed body; ``marked``: its strings may carry the marks above. ``not_json``:
    the refusal of a raw control character, for when the walk finds none in a field."""

    value: object
    marked: bool
    not_json: BodyError | None = None


_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_JSON_SPACE = b" \t\r\n"

# --- JSON -------------------------------------------------------------------------------

# What JSON allows between tokens stays as it is: marking it would change the structure.
_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_MARK_CONTROL = {c: 0xDC00 + c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}
# No field of the API takes an integer of more than 20 digits.
_LONGEST_INT_LITERAL = 4000


class _NotANumber(ValueError):
    """NaN, Infinity or -Infinity, which Python's parser takes and JSON does not."""


def _refuse_constant(name: str) -> object:
    raise _NotANumber(name)


def _parse_int(literal: str) -> int | BigInteger:
    if len(literal) > _LONGEST_INT_LITERAL:
        return BigInteger(len(literal.lstrip("-")))
    return int(literal)


_JSON_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_parse_int)

# The standard parser's messages (json.decoder), said as the API says things.
_JSON_SYNTAX = {
    "Expecting value": "expected a value",
    "Expecting property name enclosed in double quotes": "expected a field name in double quotes",
    "Expecting ':' delimiter": "expected ':' after a field name",
    "Expecting ',' delimiter": "expected ',' or the end of a list or map",
    "Unterminated string starting at": "a string that is never closed",
    "Invalid \\escape": "an escape JSON does not have "
    '(it has \\", \\\\, \\/, \\b, \\f, \\n, \\r, \\t and \\uXXXX)',
    "Invalid \\uXXXX escape": "a \\u escape without four hexadecimal digits",
    "Extra data": "more after the end of the JSON value",
}
# The raw control characters left unmarked (JSON allows them between tokens).
_WHITESPACE = {"\t": ("tab", "\\t"), "\n": ("newline", "\\n"), "\r": ("carriage return", "\\r")}


def reparse_json(body: bytes) -> Reparsed:
    """``body`` parsed as JSON for the walk. Raises ``BodyError`` if it does not parse."""
    if not body.strip(_JSON_SPACE):
        raise BodyError("", "the body is empty: expected a JSON object")
    if body.startswith(_UTF8_BOM):
        raise BodyError(
            "", "the body starts with a byte order mark (EF BB BF): send the JSON text without it"
        )
    if body.startswith(_UTF16_BOMS):
        raise BodyError(
            "", "the body is UTF-16 (it starts with a UTF-16 byte order mark): send it in UTF-8"
        )
    try:
        text = body.decode("utf-8")
        marked = False
    except UnicodeDecodeError:
        text = body.decode("utf-8", "surrogateescape")
        marked = True
    not_json = None
    control = _RAW_CONTROL.search(text)
    if control is not None:
        at = control.start()
        code = ord(text[at])
        not_json = _not_json(
            f"a raw control character (U+{code:04X}), which JSON allows nowhere "
            f"(in a string it is escaped, as \\u{code:04x})",
            text,
            at,
        )
        text = text.translate(_MARK_CONTROL)
        marked = True
    try:
        value = _JSON_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise _syntax_error(text, exc, marked) from None
    except _NotANumber as exc:
        raise BodyError(
            "",
            f"the body is not valid JSON: {exc} is not a JSON number (JSON has no "
            "NaN, Infinity or -Infinity)",
        ) from None
    except RecursionError:
        raise BodyError("", NESTED_TOO_DEEP) from None
    return Reparsed(value, marked, not_json)


def _syntax_error(text: str, exc: json.JSONDecodeError, marked: bool) -> BodyError:
    at = exc.pos
    code = ord(text[at]) if at < len(text) else -1
    if marked and 0xDC80 <= code <= 0xDCFF:
        raw = bytes(ord(c) - 0xDC00 for c in text[at : at + 4] if 0xDC80 <= ord(c) <= 0xDCFF)
        return _not_json(f"bytes that are not UTF-8 ({raw.hex(' ')}); JSON is UTF-8 text", text, at)
    if marked and 0xDC00 <= code <= 0xDC1F:
        return _not_json(
            f"a control character (U+{code - 0xDC00:04X}) outside any string", text, at
        )
    if exc.msg == "Invalid control character at":
        name, escape = _WHITESPACE[text[at]]
        return _not_json(
            f"a raw {name} (U+{code:04X}) in a string; JSON carries it escaped, as {escape}",
            text,
            at,
        )
    problem = _JSON_SYNTAX.get(exc.msg, exc.msg)
    if exc.msg == "Expecting value" and not text[:at].strip():
        problem = "expected a JSON object"
    return _not_json(problem, text, at)


def _not_json(problem: str, text: str, at: int) -> BodyError:
    line = text.count("\n", 0, at) + 1
    column = at - text.rfind("\n", 0, at)
    return BodyError("", f"the body is not valid JSON: {problem} (line {line}, column {column})")


# --- msgpack ----------------------------------------------------------------------------

# msgspec's own refusal says where it stopped: "... (byte 12)".
_AT_BYTE = re.compile(r"\(byte (\d+)\)$")


def reparse_msgpack(body: bytes, refused: BaseException) -> Reparsed:
    """``body`` parsed as msgpack for the walk; ``refused`` is msgspec's refusal of it,
    for where it stopped. Raises ``BodyError`` if it does not parse."""
    if not body:
        raise BodyError("", "the body is empty: expected a msgpack map")
    if body.startswith(_UTF8_BOM):
        raise BodyError(
            "",
            "the body starts with a UTF-8 byte order mark (EF BB BF), which is no part of "
            "msgpack: send the map alone",
        )
    try:
        value = msgpack.unpackb(
            body, raw=False, strict_map_key=True, unicode_errors="surrogateescape"
        )
    except msgpack.ExtraData as exc:
        extra = len(exc.extra)
        problem = (
            f"{extra} more {'byte' if extra == 1 else 'bytes'} after its first value "
            "(a body is one msgpack map, and nothing after it)"
        )
    except msgpack.FormatError:
        found = _AT_BYTE.search(str(refused))
        where = f" at offset {found[1]}" if found else ""
        problem = f"byte 0xc1{where}, which msgpack never uses"
    except (msgpack.StackError, RecursionError):
        raise BodyError("", NESTED_TOO_DEEP) from None
    # msgpack documents none of the rest: what it raises for bytes it cannot take is
    # told by its message, and none may escape.
    except Exception as exc:
        text = str(exc)
        if "incomplete input" in text:
            problem = "it ends in the middle of a value (cut short)"
        elif "map key" in text:
            problem = "a map key that is not a string"
        elif "timestamp" in text:
            problem = "a timestamp (extension type -1) whose data is not 4, 8 or 12 bytes"
        else:
            problem = text[:200].encode("utf-8", "backslashreplace").decode("utf-8")
            problem = problem or "it does not decode"
    else:
        return Reparsed(value, marked=True)
    raise BodyError("", f"the body is not valid msgpack: {problem}")
