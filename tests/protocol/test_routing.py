"""Topic ids, coordinator keys and partitionFor (docs/semantics.md §1.2, §1.3)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.routing import (
    _INTERPRETED,
    coordinator_key,
    java_string_hash,
    kafka_abs,
    parse_coordinator_key,
    partition_for,
    partition_for_key,
)
from protocol.topic_id import canonical_topic_id, parse_key_topic_id, topic_id_to_rfc4122
from server.native import compiled_modules


def test_1_3_spec_example_group1_uuid_0_1_partition_0_is_state_partition_20():
    assert java_string_hash("group1:AAAAAAAAAAAAAAAAAAAAAQ:0") == 1506717070
    assert partition_for("group1", "AAAAAAAAAAAAAAAAAAAAAQ", 0, 50) == 20


def test_1_3_java_hash_wraps_to_int32():
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE, a classic Java fact.
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97


def test_1_3_java_hash_counts_utf16_code_units():
    # U+1F600 is a surrogate pair D83D DE00 in Java's String.
    expected = ((0xD83D * 31) + 0xDE00) * 31 + 0xE9
    assert java_string_hash("\U0001f600\u00e9") == expected


def test_1_3_kafka_abs_maps_int_min_to_zero():
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5
    assert kafka_abs(7) == 7


@given(st.text(max_size=30), st.integers(0, 2**31 - 1), st.integers(1, 200))
def test_1_3_partition_for_is_in_range(group, partition, n):
    assert 0 <= partition_for(group, "AAAAAAAAAAAAAAAAAAAAAQ", partition, n) < n


def test_1_2_uuid_0_1_prints_as_22_chars():
    assert canonical_topic_id("00000000-0000-0000-0000-000000000001") == "AAAAAAAAAAAAAAAAAAAAAQ"


@given(st.uuids())
def test_1_2_both_spellings_name_the_same_topic(u: uuid.UUID):
    short = canonical_topic_id(str(u))
    assert len(short) == 22
    assert canonical_topic_id(short) == short
    assert canonical_topic_id(str(u).upper()) == short
    assert topic_id_to_rfc4122(short) == str(u)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "AAAAAAAAAAAAAAAAAAAAA",  # 21 chars
        "AAAAAAAAAAAAAAAAAAAAAQ==",  # padded: not accepted in request bodies
        "AAAAAAAAAAAAAAAAAAAA+Q",  # '+' is not base64url
        "{00000000-0000-0000-0000-000000000001}",
        "00000000000000000000000000000001",
        "00000000-0000-0000-0000-00000000000g",
    ],
)
def test_a1_2_topic_id_that_is_neither_form_is_refused(bad):
    with pytest.raises(ValueError, match="topic id"):
        canonical_topic_id(bad)


def test_1_2_key_topic_id_accepts_java_padding_and_rejects_long_input():
    assert parse_key_topic_id("AAAAAAAAAAAAAAAAAAAAAQ==") == "AAAAAAAAAAAAAAAAAAAAAQ"
    with pytest.raises(ValueError, match="base64url"):
        parse_key_topic_id("AAAAAAAAAAAAAAAAAAAAAQ===")
    with pytest.raises(ValueError, match="base64url"):
        parse_key_topic_id("AAAAAAAAAAAAAAAAAAAAAQ=")


def test_1_2_key_parsing_drops_trailing_empty_tokens():
    assert parse_coordinator_key("g:AAAAAAAAAAAAAAAAAAAAAQ:1:") == (
        "g",
        "AAAAAAAAAAAAAAAAAAAAAQ",
        1,
    )
    assert parse_coordinator_key("g:AAAAAAAAAAAAAAAAAAAAAQ:1:::") == (
        "g",
        "AAAAAAAAAAAAAAAAAAAAAQ",
        1,
    )


def test_1_2_key_parsing_reformats_the_topic_id_and_partition_before_hashing():
    messy = "group1:AAAAAAAAAAAAAAAAAAAAAQ==:+0"
    assert parse_coordinator_key(messy) == ("group1", "AAAAAAAAAAAAAAAAAAAAAQ", 0)
    assert partition_for_key(messy, 50) == 20


def test_1_2_key_parsing_keeps_the_group_id_as_given():
    """The RPCs route on the group id as sent: find-coordinator must hash the same one,
    padding and all (Kafka does not trim it either)."""
    key = "  group1 :AAAAAAAAAAAAAAAAAAAAAQ:0"
    assert parse_coordinator_key(key) == ("  group1 ", "AAAAAAAAAAAAAAAAAAAAAQ", 0)
    assert partition_for_key(key, 50) == partition_for("  group1 ", "AAAAAAAAAAAAAAAAAAAAAQ", 0, 50)
    assert partition_for_key(key, 50) != partition_for("group1", "AAAAAAAAAAAAAAAAAAAAAQ", 0, 50)


def test_1_2_key_parsing_reads_from_the_right_so_a_group_id_may_hold_colons():
    topic = "AAAAAAAAAAAAAAAAAAAAAQ"
    assert parse_coordinator_key(f"a:b::{topic}:3") == ("a:b:", topic, 3)
    assert parse_coordinator_key(f":g:{topic}:3") == (":g", topic, 3)
    assert parse_coordinator_key(f"::{topic}:3") == (":", topic, 3)


@given(
    st.text(min_size=1, max_size=20).filter(lambda g: g.strip("".join(map(chr, range(33))))),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(1, 200),
)
def test_1_2_the_key_of_any_group_routes_where_its_rpcs_do(group, partition, n):
    topic = "AAAAAAAAAAAAAAAAAAAAAQ"
    key = coordinator_key(group, topic, partition)
    assert parse_coordinator_key(key) == (group, topic, partition)
    assert partition_for_key(key, n) == partition_for(group, topic, partition, n)


@pytest.mark.parametrize("group", ["", " ", "\t \n", "\x00\x1f "])
def test_1_2_a_blank_group_id_is_refused_as_kafka_refuses_it(group):
    with pytest.raises(ValueError, match="group id part of the key is empty or blank"):
        parse_coordinator_key(f"{group}:AAAAAAAAAAAAAAAAAAAAAQ:0")


@pytest.mark.parametrize(
    "bad",
    [
        "g:AAAAAAAAAAAAAAAAAAAAAQ",  # two tokens
        "g:AAAAAAAAAAAAAAAAAAAAAQ:1:x",  # four tokens
        " :AAAAAAAAAAAAAAAAAAAAAQ:1",  # a blank group id
        "g:not-a-topic-id:1",
        "g:AAAAAAAAAAAAAAAAAAAAAQ:1.5",
        "g:AAAAAAAAAAAAAAAAAAAAAQ:2147483648",  # past int32
        "g:AAAAAAAAAAAAAAAAAAAAAQ: 1",  # Java's parseInt refuses spaces
        "g:AAAAAAAAAAAAAAAAAAAAAQ:1_0",
        "",
    ],
)
def test_1_2_malformed_keys_are_refused(bad):
    with pytest.raises(ValueError, match=r"key|topic id"):
        parse_coordinator_key(bad)


def test_1_2_key_of_negative_partition_parses_like_java():
    assert parse_coordinator_key("g:AAAAAAAAAAAAAAAAAAAAAQ:-3")[2] == -3


def test_1_2_coordinator_key_format():
    assert coordinator_key("g", "AAAAAAAAAAAAAAAAAAAAAQ", 7) == "g:AAAAAAAAAAAAAAAAAAAAAQ:7"


@given(st.text(max_size=20), st.integers(-(2**31), 2**31 - 1), st.integers(1, 200))
def test_1_3_partition_for_equals_the_hash_of_the_whole_key(group, partition, n):
    # partition_for hashes the "group:topic:" prefix once and extends it; the result
    # must be exactly Kafka's hash of the whole coordinator key.
    topic = "AAAAAAAAAAAAAAAAAAAAAQ"
    key = coordinator_key(group, topic, partition)
    assert partition_for(group, topic, partition, n) == kafka_abs(java_string_hash(key)) % n


@pytest.mark.parametrize("group", ["", "group1", "polygenelubricants", "\U0001f600 orders"])
def test_1_3_partition_numbers_hashed_ahead_route_as_the_whole_key(group):
    # partition_for_prefix keeps the digits' hashes of the usual partition numbers;
    # each, and the first numbers past them, must route as Kafka's hash of the key.
    topic = "AAAAAAAAAAAAAAAAAAAAAQ"
    for partition in range(4200):
        key = coordinator_key(group, topic, partition)
        assert partition_for(group, topic, partition, 50) == kafka_abs(java_string_hash(key)) % 50


def test_the_hash_multiplies_as_its_mode_runs_fastest():
    """The product in 16-bit halves is for compiled code only; the tests above check
    whichever form this mode runs against the hash of the whole key."""
    assert _INTERPRETED is not ("protocol/routing.py" in compiled_modules())
