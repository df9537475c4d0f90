"""A reader for the small YAML subset docker-compose.yml is written in (no registry and
no PyYAML here: the deployment is checked by reading it).

Accepted: `key: value` mappings nested by indentation, block sequences of scalars
(`- item`), flow sequences written as JSON (`["a", "b"]`), scalars plain or double
quoted, and comments. Anything else is a ValueError naming the line, so the file cannot
drift into YAML this reader would misread.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN = re.compile(r"[A-Za-z0-9_./:@*\[\]-][^#]*")


def parse(text: str) -> Any:
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        content = _strip_comment(raw).rstrip()
        if content.strip():
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise ValueError(f"line {number}: tabs in the indentation")
            lines.append((number, len(content) - len(content.lstrip()), content.strip()))
    value, end = _block(lines, 0, 0)
    if end != len(lines):
        raise ValueError(f"line {lines[end][0]}: unexpected indentation")
    return value


def _strip_comment(line: str) -> str:
    in_quotes = False
    for i, char in enumerate(line):
        if char == '"' and (i == 0 or line[i - 1] != "\\"):
            in_quotes = not in_quotes
        elif char == "#" and not in_quotes and (i == 0 or line[i - 1] == " "):
            return line[:i]
    return line


def _block(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][2].startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    items = []
    while i < len(lines) and lines[i][1] == indent and lines[i][2].startswith("- "):
        items.append(_scalar(lines[i][0], lines[i][2][2:].strip()))
        i += 1
    return items, i


def _mapping(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][1] == indent:
        number, _, content = lines[i]
        key, sep, rest = content.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
            raise ValueError(f"line {number}: expected `key: value`, got {content!r}")
        if key in mapping:
            raise ValueError(f"line {number}: duplicate key {key!r}")
        rest = rest.strip()
        if rest:
            mapping[key] = _scalar(number, rest)
            i += 1
        elif i + 1 < len(lines) and lines[i + 1][1] > indent:
            mapping[key], i = _block(lines, i + 1, lines[i + 1][1])
        else:
            mapping[key] = None
            i += 1
    if i < len(lines) and lines[i][1] > indent:
        raise ValueError(f"line {lines[i][0]}: unexpected indentation")
    return mapping, i


def _scalar(number: int, text: str) -> Any:
    if text.startswith(("[", '"')):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"line {number}: not a JSON-style flow value: {exc}") from None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.startswith(("{", "'", "&", "*", "!", "|", ">")) or not _PLAIN.fullmatch(text):
        raise ValueError(f"line {number}: YAML this reader does not take: {text!r}")
    return text
