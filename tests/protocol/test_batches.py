"""combine_state_batches: docs/semantics.md §7 step by step, its worked examples, and a
per-offset model."""

from __future__ import annotations

from bisect import bisect_left
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.batches import (
    _INTERPRETED,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    combine_state_batches,
    is_clean,
    merge_batches,
)
from protocol.batches import _first_offset_at as first_offset_at
from protocol.state_batch import StateBatch
from server.native import compiled_modules
from tests.protocol.kafka_reference_combiner import reference_combine

AV, ACQ, ACK, ARC = AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED


def b(first: int, last: int, state: int, count: int) -> StateBatch:
    return StateBatch(first, last, state, count)


# --- the worked examples of §7 ----------------------------------------------------------

WORKED_EXAMPLES = [
    pytest.param(
        [b(100, 110, AV, 1)], [b(105, 108, AV, 1)], -1, [b(100, 110, AV, 1)], id="containment"
    ),
    pytest.param(
        [b(100, 110, AV, 1)], [b(111, 115, AV, 1)], -1, [b(100, 115, AV, 1)], id="contiguous"
    ),
    pytest.param(
        [b(100, 115, AV, 1)],
        [b(105, 110, ACQ, 1)],
        -1,
        [b(100, 104, AV, 1), b(105, 110, ACQ, 1), b(111, 115, AV, 1)],
        id="split-by-higher-state",
    ),
    pytest.param(
        [b(100, 110, AV, 3)],
        [b(100, 115, AV, 1)],
        -1,
        [b(100, 110, AV, 3), b(111, 115, AV, 1)],
        id="newer-but-lower-priority-loses",
    ),
    pytest.param(
        [b(100, 110, AV, 1), b(121, 130, AV, 1)],
        [b(111, 119, ACK, 2), b(116, 123, ACK, 2)],
        -1,
        [b(100, 110, AV, 1), b(111, 123, ACK, 2), b(124, 130, AV, 1)],
        id="bridge",
    ),
    pytest.param(
        [b(100, 110, AV, 1), b(121, 130, AV, 1)],
        [b(111, 119, ACK, 2), b(116, 123, ACK, 2)],
        120,
        [b(120, 123, ACK, 2), b(124, 130, AV, 1)],
        id="bridge-pruned-at-120",
    ),
]


@pytest.mark.parametrize(("current", "new", "start", "expected"), WORKED_EXAMPLES)
def test_7_worked_examples(current, new, start, expected):
    assert combine_state_batches(current, new, start) == expected


def test_7_partial_coalescing_is_kept():
    # The exactness trap: [0..9] was final before [10..19] was upgraded to its info.
    current = [b(0, 9, ACK, 3), b(10, 19, AV, 1)]
    assert combine_state_batches(current, [b(10, 19, ACK, 3)], -1) == [
        b(0, 9, ACK, 3),
        b(10, 19, ACK, 3),
    ]


def test_7_a_later_pass_merges_partially_coalesced_neighbours():
    left_unmerged = [b(0, 9, ACK, 3), b(10, 19, ACK, 3)]
    assert combine_state_batches(left_unmerged, [], -1) == [b(0, 19, ACK, 3)]


# --- step 2: prune ----------------------------------------------------------------------


def test_7_step2_batch_ending_below_start_offset_is_dropped():
    assert combine_state_batches([b(0, 9, AV, 1)], [], 10) == []


def test_7_step2_batch_starting_at_or_after_start_offset_is_kept():
    assert combine_state_batches([b(10, 19, AV, 1)], [], 10) == [b(10, 19, AV, 1)]


def test_7_step2_straddling_batch_is_trimmed_to_start_offset():
    assert combine_state_batches([b(5, 19, ACQ, 2)], [], 10) == [b(10, 19, ACQ, 2)]


def test_7_step2_start_offset_minus_one_disables_pruning():
    assert combine_state_batches([b(0, 9, AV, 1)], [], -1) == [b(0, 9, AV, 1)]


# --- step 3: short-circuit ----------------------------------------------------------------


def test_7_step3_single_batch_is_returned_unchanged_even_inverted():
    assert combine_state_batches([], [b(9, 3, AV, 1)], -1) == [b(9, 3, AV, 1)]


def test_7_step3_empty_inputs_give_empty_output():
    assert combine_state_batches([], [], -1) == []
    assert combine_state_batches([], [], 5) == []


def test_7_step3_fewer_than_two_after_pruning_are_not_sorted_or_merged():
    # One survivor of pruning comes back as it is, even an odd one.
    assert combine_state_batches([b(0, 4, AV, 1)], [b(20, 12, AV, 1)], 10) == [b(20, 12, AV, 1)]


# --- step 4: the sorted set -----------------------------------------------------------------


def test_7_step4_identical_batches_collapse():
    assert combine_state_batches([b(0, 9, AV, 1)], [b(0, 9, AV, 1)], -1) == [b(0, 9, AV, 1)]


def test_7_step4_set_orders_by_first_last_count_then_state():
    # Same span: the one sorting last wins (higher count beats higher state).
    out = combine_state_batches([b(0, 9, ARC, 1)], [b(0, 9, AV, 2)], -1)
    assert out == [b(0, 9, AV, 2)]


def test_7_output_is_sorted_by_first_offset():
    out = combine_state_batches([b(50, 59, AV, 1)], [b(0, 9, ACK, 1), b(20, 29, AV, 2)], -1)
    assert out == [b(0, 9, ACK, 1), b(20, 29, AV, 2), b(50, 59, AV, 1)]


# --- step 5: which neighbours are mergeable ---------------------------------------------------


def test_7_step5_contiguous_same_info_merges():
    assert combine_state_batches([b(0, 4, AV, 1)], [b(5, 9, AV, 1)], -1) == [b(0, 9, AV, 1)]


def test_7_step5_contiguous_different_info_does_not_merge():
    assert combine_state_batches([b(0, 4, AV, 1)], [b(5, 9, AV, 2)], -1) == [
        b(0, 4, AV, 1),
        b(5, 9, AV, 2),
    ]


def test_7_step5_gap_never_merges():
    assert combine_state_batches([b(0, 4, AV, 1)], [b(6, 9, AV, 1)], -1) == [
        b(0, 4, AV, 1),
        b(6, 9, AV, 1),
    ]


# --- step 6: each overlap case, both priorities -------------------------------------------------

STEP6_CASES = [
    # (prev, cand, expected) with prev sorting before cand.
    pytest.param(b(0, 9, AV, 1), b(5, 14, AV, 1), [b(0, 14, AV, 1)], id="same-info-overlap"),
    pytest.param(b(0, 9, AV, 1), b(2, 5, AV, 1), [b(0, 9, AV, 1)], id="same-info-containment"),
    pytest.param(b(0, 9, AV, 1), b(0, 9, AV, 2), [b(0, 9, AV, 2)], id="same-span-keeps-cand"),
    pytest.param(
        b(0, 9, AV, 2),
        b(0, 14, AV, 1),
        [b(0, 9, AV, 2), b(10, 14, AV, 1)],
        id="same-first-cand-lower",
    ),
    pytest.param(b(0, 9, AV, 1), b(0, 14, AV, 2), [b(0, 14, AV, 2)], id="same-first-cand-higher"),
    pytest.param(b(0, 9, AV, 2), b(3, 5, AV, 1), [b(0, 9, AV, 2)], id="inside-cand-lower"),
    pytest.param(
        b(0, 9, AV, 1),
        b(3, 5, ACK, 1),
        [b(0, 2, AV, 1), b(3, 5, ACK, 1), b(6, 9, AV, 1)],
        id="inside-cand-higher",
    ),
    pytest.param(b(0, 9, ACK, 1), b(5, 9, AV, 1), [b(0, 9, ACK, 1)], id="same-last-cand-lower"),
    pytest.param(
        b(0, 9, AV, 1),
        b(5, 9, ACK, 1),
        [b(0, 4, AV, 1), b(5, 9, ACK, 1)],
        id="same-last-cand-higher",
    ),
    pytest.param(
        b(0, 9, AV, 3),
        b(5, 14, AV, 1),
        [b(0, 9, AV, 3), b(10, 14, AV, 1)],
        id="partial-overlap-cand-lower",
    ),
    pytest.param(
        b(0, 9, AV, 1),
        b(5, 14, AV, 3),
        [b(0, 4, AV, 1), b(5, 14, AV, 3)],
        id="partial-overlap-cand-higher",
    ),
]


@pytest.mark.parametrize(("prev", "cand", "expected"), STEP6_CASES)
def test_7_step6_overlap_cases(prev, cand, expected):
    assert combine_state_batches([prev], [cand], -1) == expected
    # Priority, not recency: the origin of each batch does not matter.
    assert combine_state_batches([cand], [prev], -1) == expected


# --- §A.1 point 15 -------------------------------------------------------------------------------


def test_a1_15_inverted_batches_that_would_loop_raise_value_error():
    with pytest.raises(ValueError, match="inverted"):
        combine_state_batches([b(5, 10, AV, 1)], [b(8, 3, AV, 2)], -1)


def test_a1_15_inverted_batches_that_do_not_loop_follow_kafka():
    out = combine_state_batches([b(5, 3, AV, 1)], [b(10, 20, AV, 1)], -1)
    assert out == [b(5, 3, AV, 1), b(10, 20, AV, 1)]


def test_7_does_not_modify_its_inputs():
    current = [b(0, 9, AV, 1)]
    new = [b(5, 14, ACK, 1)]
    combine_state_batches(current, new, 3)
    assert current == [b(0, 9, AV, 1)]
    assert new == [b(5, 14, ACK, 1)]


# --- the per-offset model ----------------------------------------------------------------------


def _priority(batch: StateBatch) -> tuple[int, int]:
    return (batch.delivery_count, batch.delivery_state)


def model_per_offset(batches: list[StateBatch], start_offset: int) -> dict[int, tuple[int, int]]:
    """offset -> (count, state) of the highest-priority batch covering it, at or after
    start_offset. The naive definition the combiner must agree with."""
    best: dict[int, tuple[int, int]] = {}
    for batch in batches:
        for offset in range(batch.first_offset, batch.last_offset + 1):
            if start_offset != -1 and offset < start_offset:
                continue
            if offset not in best or _priority(batch) > best[offset]:
                best[offset] = _priority(batch)
    return best


batch_strategy = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 40),
    st.integers(0, 12),
    st.sampled_from([AV, ACQ, ACK, ARC]),
    st.integers(0, 3),
)


@settings(max_examples=3000, deadline=None)
@given(
    current=st.lists(batch_strategy, max_size=6),
    new=st.lists(batch_strategy, max_size=6),
    start_offset=st.one_of(st.just(-1), st.integers(0, 50)),
)
def test_7_property_matches_per_offset_model(current, new, start_offset):
    out = combine_state_batches(current, new, start_offset)
    # Sorted and strictly disjoint.
    for left, right in pairwise(out):
        assert left.last_offset < right.first_offset
    for batch in out:
        assert batch.first_offset <= batch.last_offset
    # Every covered offset at or after start_offset gets the highest-priority info;
    # nothing else is covered.
    got: dict[int, tuple[int, int]] = {}
    for batch in out:
        for offset in range(batch.first_offset, batch.last_offset + 1):
            got[offset] = _priority(batch)
    assert got == model_per_offset(current + new, start_offset)


@settings(max_examples=1000, deadline=None)
@given(batches=st.lists(batch_strategy, max_size=8))
def test_7_property_second_pass_fully_coalesces(batches):
    once = combine_state_batches(batches, [], -1)
    twice = combine_state_batches(once, [], -1)
    # The first pass's output is disjoint, so a second pass only joins same-info
    # neighbours left apart by partial coalescing: coverage is unchanged, no such pair
    # remains, and the result is a fixed point.
    assert model_per_offset(twice, -1) == model_per_offset(once, -1)
    for left, right in pairwise(twice):
        assert not (
            left.last_offset + 1 == right.first_offset and _priority(left) == _priority(right)
        )
    assert combine_state_batches(twice, [], -1) == twice


# --- exactly Kafka's walk ------------------------------------------------------------------

wide_batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 60),
    st.integers(0, 20),
    st.sampled_from([AV, ACQ, ACK, ARC]),
    st.integers(0, 3),
)


@settings(max_examples=5000, deadline=None)
@given(
    current=st.lists(wide_batch, max_size=12),
    new=st.lists(wide_batch, max_size=6),
    start_offset=st.one_of(st.just(-1), st.integers(0, 70)),
)
def test_7_output_is_exactly_kafkas_walk_batch_for_batch(current, new, start_offset):
    """Batch boundaries too, not only per-offset state: partial coalescing must come out
    exactly as the literal TreeSet walk (tests/protocol/kafka_reference_combiner.py)."""
    # Stored state is itself combiner output; feed that shape as well as raw lists.
    stored = combine_state_batches(current, [], -1)
    for base in (current, stored):
        assert combine_state_batches(base, new, start_offset) == reference_combine(
            base, new, start_offset
        )


# --- the clean-state shortcut --------------------------------------------------------------


@settings(max_examples=3000, deadline=None)
@given(
    writes=st.lists(
        st.tuples(
            st.lists(wide_batch, min_size=0, max_size=3),
            st.one_of(st.just(-1), st.just(-1), st.integers(0, 70)),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_7_a_state_kept_with_its_clean_flag_merges_exactly_as_kafkas_walk(writes):
    """The daemon keeps each state's batches with merge_batches' clean flag and lets a
    clean state skip the parts of the walk that cannot change; write after write, the
    batches must still be exactly the literal walk's, and the flag must be true."""
    state: list[StateBatch] = []
    clean = True
    expected: list[StateBatch] = []
    for new, start_offset in writes:
        state, clean = merge_batches(state, clean, new, start_offset)
        expected = reference_combine(expected, new, start_offset)
        assert state == expected
        assert clean == is_clean(state)


@settings(max_examples=2000, deadline=None)
@given(batches=st.lists(wide_batch, max_size=10))
def test_is_clean_means_no_pair_would_merge_and_every_batch_is_valid(batches):
    tidy = all(b.first_offset <= b.last_offset for b in batches) and all(
        left.last_offset < right.first_offset
        and not (left.last_offset + 1 == right.first_offset and _priority(left) == _priority(right))
        for left, right in pairwise(batches)
    )
    assert is_clean(batches) == tidy


# Clean states with gaps, touching neighbours of other info, and a tie on a first offset
# a new batch can share: every single batch over their span, in three infos, goes
# through the one-batch path and must come out as Kafka's walk, flag included. Each
# neighbour case of that path (a gap, touching with the same info or another, overlap,
# the same first offset on either side of the set order) is met deterministically, not
# left to a random search.
ONE_BATCH_STATES = [
    [b(2, 4, AV, 1), b(5, 7, ACK, 1), b(10, 12, AV, 1)],
    [b(0, 3, ACK, 2), b(6, 6, AV, 1), b(7, 9, AV, 2), b(12, 14, ARC, 1)],
    # A batch that takes over a neighbour's first offset with the info of the batch
    # before it, then gives way to a higher one inside it: the piece left before that
    # one touches the earlier batch with the same info (partial coalescing, no clean).
    [b(0, 4, ACK, 1), b(5, 9, AV, 1), b(13, 14, AV, 2)],
]


@pytest.mark.parametrize("state", ONE_BATCH_STATES)
@pytest.mark.parametrize("start_offset", [-1, 3])
def test_7_one_batch_into_a_clean_state_is_kafkas_walk_for_every_span(state, start_offset):
    assert is_clean(state)
    for first in range(16):
        for last in range(first, 16):
            for info in ((AV, 1), (ACK, 1), (AV, 2)):
                new = [b(first, last, *info)]
                merged, clean = merge_batches(tuple(state), True, new, start_offset)
                assert merged == reference_combine(state, new, start_offset), new
                assert clean == is_clean(merged), new


@given(st.lists(st.integers(0, 40), max_size=12, unique=True), st.integers(-1, 42))
def test_the_written_out_search_finds_where_bisect_does(firsts, first):
    stored = tuple(b(f, f, AV, 1) for f in sorted(firsts))
    expected = bisect_left([s.first_offset for s in stored], first)
    assert first_offset_at(stored, first) == expected


def test_the_merge_searches_as_its_mode_runs_fastest():
    """The written-out search is for compiled code only; interpreted, bisect's."""
    compiled = "protocol/batches.py" in compiled_modules()
    assert _INTERPRETED is not compiled
