"""The model of acknowledged state: what a store may show after acknowledged writes and
writes whose answer never came, and what it may not."""

from __future__ import annotations

import pytest

from tests.harness.acknowledged import Acknowledged


def test_an_acknowledged_state_must_be_shown_exactly() -> None:
    model = Acknowledged({"a": 1, "b": 2})
    model.acknowledge("a", 5)
    assert model.mismatches({"a": 5, "b": 2}) == []
    assert model.mismatches({"a": 1, "b": 2}) == ["'a': shows 1, may be in [5]"]
    assert model.mismatches({"b": 2}) == ["'a': shows None, may be in [5]"]


def test_an_unanswered_write_may_or_may_not_be_there_and_is_settled_by_what_shows() -> None:
    model = Acknowledged({"a": 1})
    model.unanswered("a", 2, 3)
    assert model.uncertain() == ["a"]
    assert not model.reconcile("a", 4)
    assert model.reconcile("a", 3)
    assert model.exact("a") == 3
    assert model.uncertain() == []
    model.unanswered("a", 4)
    with pytest.raises(AssertionError):
        model.exact("a")  # not known while an answer is missing


def test_a_key_first_written_without_an_answer_may_be_absent() -> None:
    for shown in ({}, {"new": 7}):
        model: Acknowledged[str, int] = Acknowledged({})
        model.unanswered("new", 7)
        assert model.possible["new"] == [None, 7]
        model.verify(shown)
        assert model.exact("new") == shown.get("new")


def test_verify_refuses_what_was_never_written() -> None:
    model = Acknowledged({"a": 1})
    model.verify({"a": 1, "gone": None})
    with pytest.raises(AssertionError, match="never written: \\['stranger'\\]"):
        model.verify({"a": 1, "stranger": 9})
    with pytest.raises(AssertionError, match="1 keys lost or changed"):
        model.verify({"a": 2})


def test_matches_compares_a_state_with_what_the_store_shows() -> None:
    model = Acknowledged({"a": 3}, matches=lambda state, shown: shown == {"offset": state})
    assert model.reconcile("a", {"offset": 3})
    assert not model.reconcile("a", 3)
