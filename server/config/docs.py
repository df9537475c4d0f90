"""The settings tables of the documentation, generated from the declarations.

A Markdown file holds a generated table between two marker comments, and ``make docs``
(``python -m server.config FILE``) rewrites what is between them:

    <!-- settings:serve:begin -->
    | setting | flag / environment | default | meaning |
    ...
    <!-- settings:serve:end -->

The name between ``settings:`` and ``:begin`` is a command (``serve``, ``compact``,
``log-dump`` for ``log dump``): the table of its settings; ``kafka``: every setting with
a Kafka counterpart (docs/semantics.md §11); or ``synopsis``: the usage line of every
command that takes settings (docs/api.md#cli). tests/test_settings_docs.py fails while
a file's tables differ from what this generates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from server.config.engine import Setting, commands, show_default
from server.config.serve import SERVE_SETTINGS

KAFKA_TABLE = "kafka"
SYNOPSIS = "synopsis"
SYNOPSIS_WIDTH = 92

_MARKER = re.compile(r"<!-- settings:(?P<name>[^:>]*):(?P<side>begin|end) -->")


class DocsError(ValueError):
    """A marker that names no table or has no partner, or a table a declaration cannot
    fill."""


def regenerate(text: str) -> str:
    """``text`` with every marked table replaced by what the declarations generate."""
    parts: list[str] = []
    done = 0
    begin: re.Match[str] | None = None
    for marker in _MARKER.finditer(text):
        line = text.count("\n", 0, marker.start()) + 1
        if marker["side"] == "begin":
            if begin is not None:
                raise DocsError(f"line {line}: {marker[0]} inside {begin[0]}")
            begin = marker
            continue
        if begin is None or begin["name"] != marker["name"]:
            raise DocsError(f"line {line}: {marker[0]} has no begin marker before it")
        parts += [text[done : begin.end()], "\n\n", table(begin["name"]), "\n"]
        done, begin = marker.start(), None
    if begin is not None:
        line = text.count("\n", 0, begin.start()) + 1
        raise DocsError(f"line {line}: {begin[0]} has no end marker after it")
    return "".join([*parts, text[done:]])


def table(name: str) -> str:
    """The Markdown table a marker names."""
    if name == KAFKA_TABLE:
        return kafka_table()
    if name == SYNOPSIS:
        return synopsis()
    by_marker = {command.replace(" ", "-"): command for command in commands()}
    if name not in by_marker:
        known = ", ".join([KAFKA_TABLE, SYNOPSIS, *by_marker])
        raise DocsError(f"no settings table {name!r} (the tables: {known})")
    command = by_marker[name]
    return command_table(command, commands()[command])


def command_table(command: str, settings: Sequence[Setting]) -> str:
    """One command's settings: the table of docs/operations.md#settings."""
    rows = [
        "| setting | flag / environment | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for s in settings:
        if not s.meaning:
            raise DocsError(f"setting {s.name} of {command} declares no meaning for its table")
        flag = f"`{s.flag}` / `{s.env_var}`"
        default = "required" if s.required else _default(s.default)
        rows.append(_row(f"`{s.name}`", flag, default, s.meaning))
    return "\n".join(rows) + "\n"


def kafka_table() -> str:
    """Every setting with a Kafka counterpart, once, serve's first: docs/semantics.md §11."""
    rows = [
        "| Kafka config | Kafka default | sharecoord setting | sharecoord default | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    seen: set[str] = set()
    for command, settings in commands().items():
        for s in settings:
            if s.kafka is None or s.name in seen:
                continue
            seen.add(s.name)
            name = f"`{s.name}`" if command == "serve" else f"`{s.name}` of `sharecoord {command}`"
            kafka = s.kafka
            kafka_default, default = _default(kafka.default), _default(s.default)
            rows.append(_row(f"`{kafka.name}`", kafka_default, name, default, kafka.note))
    return "\n".join(rows) + "\n"


def synopsis() -> str:
    """A code block with the usage of every command that takes settings, wrapped."""
    tables = commands()
    indent = max(len(f"sharecoord {name}") for name in tables) + 1
    lines = ["```"]
    for name, settings in tables.items():
        words = ["[--config FILE]", *(_usage(s) for s in settings)]
        line = f"sharecoord {name}".ljust(indent) + words[0]
        for word in words[1:]:
            if len(line) + 1 + len(word) > SYNOPSIS_WIDTH:
                lines.append(line)
                line = " " * indent + word
            else:
                line += " " + word
        lines.append(line)
    lines.append("```")
    return "\n".join(lines) + "\n"


def _usage(setting: Setting) -> str:
    if setting.is_bool:
        return f"[{setting.flag} | --no-{setting.flag.removeprefix('--')}]"
    word = f"{setting.flag} {setting.metavar or 'VALUE'}"
    return word if setting.required else f"[{word}]"


def _default(value: Any) -> str:
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return show_default(value)


def _row(*cells: str) -> str:
    """A table row; a ``|`` inside a cell is escaped, an empty cell stays empty."""
    escaped = [cell.replace("|", "\\|") for cell in cells]
    return "|" + "|".join(f" {cell} " if cell else " " for cell in escaped) + "|"


def describe_settings(settings: Sequence[Setting] = SERVE_SETTINGS) -> str:
    """Every column of a config table in Markdown, the Kafka names included."""
    lines = [
        "| name | flag | env var | default | Kafka name | doc |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in settings:
        kafka = f"`{s.kafka_name}`" if s.kafka_name else ""
        default = f"`{show_default(s.default)}`"
        doc = s.doc.replace("|", "\\|")
        lines.append(f"| `{s.name}` | `{s.flag}` | `{s.env_var}` | {default} | {kafka} | {doc} |")
    return "\n".join(lines) + "\n"
