"""Issue 22: every setting is declared once (server/config/), and the documentation's
settings tables are generated from the declarations by ``make docs`` (``python -m
server.config FILE``), between ``<!-- settings:NAME:begin -->`` and ``... :end -->``.

A table that differs from what the declarations generate fails here, saying to run
``make docs``; the generated tables are checked to hold every declared setting, so a
generator that dropped one would fail too; and the synopsis in docs/api.md is checked
against the flags the CLI's parser really takes.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from server.commands.cli import build_parser
from server.config import SERVE_SETTINGS, Setting, commands, parse_int
from server.config import engine as config_engine
from server.config.docs import DocsError, command_table, regenerate
from tests.test_operator_docs import section

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = ROOT / "docs" / "operations.md"
SEMANTICS = ROOT / "docs" / "semantics.md"
API = ROOT / "docs" / "api.md"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def check_current(name: str, text: str) -> None:
    """Fail, with a diff and what to run, when ``text``'s tables are stale."""
    generated = regenerate(text)
    if generated != text:
        diff = difflib.unified_diff(
            text.splitlines(), generated.splitlines(), f"{name} (now)", f"{name} (generated)",
            lineterm="", n=0,
        )  # fmt: skip
        lines = list(diff)
        raise AssertionError(
            f"{name}: its settings tables differ from the declarations in server/config/: "
            "run `make docs` and commit the result.\n" + "\n".join(lines[:40])
        )


def marked(text: str, name: str) -> str:
    """What lies between one pair of markers."""
    match = re.search(
        rf"<!-- settings:{name}:begin -->\n(.*?)<!-- settings:{name}:end -->", text, re.DOTALL
    )
    assert match, f"no settings:{name} markers"
    return match[1]


def first_column(table: str) -> list[str]:
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return [row.split("|")[1].strip().strip("`") for row in rows]


# --- the documents are current ---------------------------------------------------------


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_settings_table_is_what_the_declarations_generate(path):
    check_current(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))


def test_the_tables_are_where_readers_look_for_them():
    settings = section(OPERATIONS, "Settings")
    assert "<!-- settings:serve:begin -->" in settings
    spark = section(OPERATIONS, "Compaction and audit with Spark")
    assert "<!-- settings:compact:begin -->" in spark
    assert "<!-- settings:audit:begin -->" in spark
    kafka = section(SEMANTICS, "11. Settings with a Kafka counterpart")
    assert "<!-- settings:kafka:begin -->" in kafka
    assert "<!-- settings:synopsis:begin -->" in section(API, "CLI")


def test_the_serve_table_has_every_serve_setting_in_declaration_order():
    names = first_column(marked(OPERATIONS.read_text(), "serve"))
    assert names == [s.name for s in SERVE_SETTINGS]
    assert "access_log" in names


@pytest.mark.parametrize("command", ["compact", "audit"])
def test_the_spark_commands_tables_have_each_of_their_settings(command):
    names = first_column(marked(OPERATIONS.read_text(), command))
    assert names == [s.name for s in commands()[command]]


def test_section_11_has_every_setting_with_a_kafka_counterpart_once():
    table = marked(SEMANTICS.read_text(), "kafka")
    declared = {s.kafka.name for table in commands().values() for s in table if s.kafka}
    assert sorted(first_column(table)) == sorted(declared)
    assert "`history_retention_ms` of `sharecoord compact`" in table


# --- the synopsis is what the CLI takes ---------------------------------------------------


def leaf_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(path), parser
    for action in subcommands:
        for name, child in action.choices.items():
            yield from leaf_parsers(child, (*path, name))


def test_each_command_the_cli_builds_from_settings_is_declared_under_its_name():
    with_settings = {
        name: parser
        for name, parser in leaf_parsers(build_parser())
        if any("--config" in a.option_strings for a in parser._actions)
    }
    assert sorted(with_settings) == sorted(commands())
    for name, parser in with_settings.items():
        taken = {flag for a in parser._actions for flag in a.option_strings} - {"-h", "--help"}
        settings = commands()[name]
        declared = {"--config", *(s.flag for s in settings)}
        declared |= {"--no-" + s.flag.removeprefix("--") for s in settings if s.is_bool}
        assert taken == declared, name


def test_the_synopsis_brackets_optional_flags_only():
    synopsis = marked(API.read_text(), "synopsis")
    assert "--out DIR [--delivery-limit N]" in synopsis  # audit: --out is required
    assert "[--access-log | --no-access-log]" in synopsis
    assert "--from DIR [--node-id N]" in synopsis


# --- a change to a declaration makes the documents stale ----------------------------------


def test_a_new_serve_setting_makes_the_operations_table_stale(monkeypatch):
    added = Setting(
        "widget_count", 7, "Widgets.", parse_int, meaning="how many widgets the daemon keeps"
    )
    tables = dict(config_engine._COMMANDS)
    monkeypatch.setitem(config_engine._COMMANDS, "serve", (*tables["serve"], added))
    with pytest.raises(AssertionError, match="run `make docs`") as stale:
        check_current("docs/operations.md", OPERATIONS.read_text())
    message = str(stale.value)
    assert "+| `widget_count` | `--widget-count` / `SHARECOORD_WIDGET_COUNT` | 7 |" in message


def test_a_changed_kafka_counterpart_makes_section_11_stale(monkeypatch):
    serve = config_engine._COMMANDS["serve"]
    changed = tuple(
        s if s.kafka is None or s.name != "append_linger_ms" else _with_kafka_default(s, 10)
        for s in serve
    )
    monkeypatch.setitem(config_engine._COMMANDS, "serve", changed)
    with pytest.raises(AssertionError, match="run `make docs`") as stale:
        check_current("docs/semantics.md", SEMANTICS.read_text())
    assert "+| `share.coordinator.append.linger.ms` | 10 |" in str(stale.value)


def _with_kafka_default(setting: Setting, default: int) -> Setting:
    assert setting.kafka is not None
    return replace(setting, kafka=replace(setting.kafka, default=default))


def test_a_setting_without_a_meaning_cannot_be_tabled():
    bare = Setting("widget_count", 7, "Widgets.", parse_int)
    with pytest.raises(DocsError, match="widget_count of serve declares no meaning"):
        command_table("serve", [bare])


# --- the markers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a\n<!-- settings:serve:begin -->\n", "line 2: .* has no end marker after it"),
        ("<!-- settings:serve:end -->\n", "line 1: .* has no begin marker before it"),
        (
            "<!-- settings:serve:begin -->\n<!-- settings:audit:end -->\n",
            "line 2: <!-- settings:audit:end --> has no begin marker",
        ),
        (
            "<!-- settings:serve:begin -->\n<!-- settings:audit:begin -->\n",
            "line 2: .* inside <!-- settings:serve:begin -->",
        ),
        (
            "<!-- settings:log dump:begin -->\n<!-- settings:log dump:end -->\n",
            r"no settings table 'log dump' \(the tables: kafka, synopsis, serve, .*log-dump",
        ),
    ],
)
def test_a_marker_that_cannot_be_filled_is_refused_naming_its_line(text, problem):
    with pytest.raises(DocsError, match=problem):
        regenerate(text)


def test_regenerating_keeps_everything_outside_the_markers():
    text = (
        "# Title\n\nbefore\n<!-- settings:log-verify:begin -->\nold\n"
        "<!-- settings:log-verify:end -->\nafter\n"
    )
    new = regenerate(text)
    assert new.startswith("# Title\n\nbefore\n<!-- settings:log-verify:begin -->\n\n| setting |")
    assert new.endswith("|\n\n<!-- settings:log-verify:end -->\nafter\n")
    assert "old" not in new
    assert regenerate(new) == new


def test_python_m_server_config_prints_the_file_regenerated_and_refuses_a_broken_one(tmp_path):
    stale = tmp_path / "stale.md"
    stale.write_text(OPERATIONS.read_text().replace("| `access_log` |", "| `gone` |"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "server.config", str(stale)],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == OPERATIONS.read_text()

    broken = tmp_path / "broken.md"
    broken.write_text("<!-- settings:serve:begin -->\n")
    done = subprocess.run(
        [sys.executable, "-m", "server.config", str(broken)],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "broken.md: line 1: <!-- settings:serve:begin --> has no end marker" in done.stderr
