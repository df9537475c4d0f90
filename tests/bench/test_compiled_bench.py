"""`make bench` benches the compiled mode and leaves the tree as it found it
(bench/compiled.py): the build and the run are stand-ins here, the decisions are real."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from bench import compiled


class _Tree:
    """The checkout's mode as bench/compiled.py sees it, and what it was asked to do."""

    def __init__(self, compiled_now: bool, stale: bool = False) -> None:
        self.compiled = compiled_now
        self.stale = stale
        self.calls: list[str] = []

    def compiled_modules(self) -> list[str]:
        return ["protocol/shard.py"] if self.compiled else []

    def stale_build(self) -> str | None:
        return "older than its source" if self.compiled and self.stale else None

    def build(self) -> int:
        self.calls.append("build")
        self.compiled, self.stale = True, False
        return 0

    def remove(self, quiet: bool = False) -> int:
        self.calls.append("remove")
        self.compiled = False
        return 0


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> _Tree:
    state = _Tree(compiled_now=False)
    for name in ("compiled_modules", "stale_build", "build", "remove"):
        monkeypatch.setattr(compiled.native, name, getattr(state, name))
    monkeypatch.setattr(compiled.native, "has_compiler", lambda: True)
    return state


def _child(tree: _Tree, seen: list[Any], outcome: Any = 0) -> Any:
    def run(argv: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        seen.append((argv, tree.compiled))
        if isinstance(outcome, BaseException):
            raise outcome
        return subprocess.CompletedProcess(argv, outcome)

    return run


def test_a_pure_tree_is_built_for_the_run_and_pure_again_after(
    tree: _Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen, outcome=3))
    assert compiled.main(["--only", "entry"]) == 3  # the bench's own exit code
    assert seen == [([sys.executable, "-m", "bench", "--only", "entry"], True)]
    assert tree.calls == ["build", "remove"]
    assert not tree.compiled


def test_an_interrupted_run_still_leaves_the_tree_pure(
    tree: _Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen, KeyboardInterrupt()))
    assert compiled.main([]) == 130
    assert tree.calls == ["build", "remove"]
    assert not tree.compiled


def test_a_compiled_tree_is_benched_as_it_is_and_kept(
    tree: _Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.compiled = True
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen))
    assert compiled.main([]) == 0
    assert seen[0][1] is True
    assert tree.calls == []
    assert tree.compiled


def test_a_stale_build_is_rebuilt_and_kept(tree: _Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer had built the tree: after the run it is compiled still, of the
    # source as it is now.
    tree.compiled, tree.stale = True, True
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen))
    assert compiled.main([]) == 0
    assert tree.calls == ["build"]
    assert tree.compiled and not tree.stale


def test_without_a_compiler_the_pure_modules_are_benched(
    tree: _Tree, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compiled.native, "has_compiler", lambda: False)
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen))
    assert compiled.main([]) == 0
    assert seen[0][1] is False
    assert tree.calls == []
    assert "no C compiler" in capsys.readouterr().out


def test_a_failed_build_stops_before_the_run(tree: _Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled.native, "build", lambda: 1)
    seen: list[Any] = []
    monkeypatch.setattr(compiled.subprocess, "run", _child(tree, seen))
    with pytest.raises(SystemExit, match="did not build"):
        compiled.main([])
    assert seen == []
