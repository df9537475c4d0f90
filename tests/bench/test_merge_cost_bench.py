"""bench.merge_cost: what it says where it cannot measure."""

from __future__ import annotations

import pytest

from bench import merge_cost


def test_a_compiled_replay_is_refused_in_one_line(monkeypatch):
    # The write merges are captured through the replay's module dict, which a compiled
    # replay never reads: it would time nothing, so it says so instead.
    monkeypatch.setattr(merge_cost, "compiled_modules", lambda: ["protocol/replay.py"])
    with pytest.raises(SystemExit) as exited:
        merge_cost.main(["--baseline", ""])
    message = str(exited.value.code)
    assert "compiled" in message
    assert "make pure" in message
    assert "\n" not in message


def test_a_section_without_merges_is_reported_not_divided_by(capsys):
    assert merge_cost.compare("load", [], list, merge_cost._as_loader, {}, 3) == {}
    assert "load: no merges to time" in capsys.readouterr().out
