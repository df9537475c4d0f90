"""The error table (docs/semantics.md §12, docs/api.md#error-codes): Kafka's numbers,
names, messages, retriability."""

from __future__ import annotations

import pytest

from protocol import errors

EXPECTED = {
    0: ("NONE", False),
    -1: ("UNKNOWN_SERVER_ERROR", False),
    3: ("UNKNOWN_TOPIC_OR_PARTITION", True),
    14: ("COORDINATOR_LOAD_IN_PROGRESS", True),
    15: ("COORDINATOR_NOT_AVAILABLE", True),
    16: ("NOT_COORDINATOR", True),
    31: ("CLUSTER_AUTHORIZATION_FAILED", False),
    42: ("INVALID_REQUEST", False),
    69: ("GROUP_ID_NOT_FOUND", False),
    74: ("FENCED_LEADER_EPOCH", False),
    124: ("FENCED_STATE_EPOCH", False),
}


@pytest.mark.parametrize(("code", "name_retriable"), sorted(EXPECTED.items()))
def test_12_error_table_has_kafka_numbers_names_and_retriability(code, name_retriable):
    name, retriable = name_retriable
    cls = errors.for_code(code)
    assert cls.errno == code
    assert cls.name == name
    assert cls.retriable is retriable


def test_12_table_holds_exactly_the_codes_in_use():
    assert set(errors.ERRORS) == set(EXPECTED)


def test_12_default_messages_are_kafkas():
    assert errors.default_message(0) is None
    assert errors.default_message(3) == "This server does not host this topic-partition."
    assert errors.default_message(14) == (
        "The coordinator is loading and hence can't process requests."
    )
    assert errors.default_message(74) == (
        "The leader epoch in the request is older than the epoch on the broker."
    )
    # Kafka 4.4.0's text, as its broker sends it (tests/kafka_peer compares the two).
    assert errors.default_message(124) == (
        "The coordinator rejected the request because the state epoch did not match."
    )


def test_12_unknown_code_maps_to_unknown_server_error():
    assert errors.for_code(9999) is errors.UnknownServerError


def test_12_errors_raise_with_code_and_message():
    exc = errors.FencedLeaderEpoch()
    assert exc.errno == 74
    assert "FENCED_LEADER_EPOCH" in str(exc)
    assert errors.InvalidRequest("custom").message == "custom"
