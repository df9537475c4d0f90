"""The sweep (protocol/sweep.py): exactly Kafka's walk, batch for batch, at a cost that
grows linearly with the batches whatever their shape."""

from __future__ import annotations

import heapq
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.batches
from protocol.batches import combine_state_batches, is_clean, merge_batches
from protocol.state_batch import StateBatch
from protocol.sweep import Entry, sweep, sweep_grouped, sweep_plain
from tests.protocol.batch_shapes import SHAPES, staircase, stored_alternating
from tests.protocol.kafka_reference_combiner import reference_combine


def entries(batches: list[StateBatch]) -> list[Entry]:
    return sorted(
        (b.first_offset, b.last_offset, b.delivery_count, b.delivery_state) for b in batches
    )


def as_batches(out: list[Entry]) -> list[StateBatch]:
    return [StateBatch(f, last, s, c) for f, last, c, s in out]


def the_walks_answer(batches: list[StateBatch]) -> list[StateBatch]:
    return reference_combine(batches, [], -1)


def encoded(batches: list[StateBatch]) -> bytes:
    return msgspec.msgpack.encode(batches)


# Small spans and few infos make overlaps, touching neighbours and duplicates common.
tight_batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 12),
    st.integers(0, 8),
    st.sampled_from([0, 2]),
    st.integers(0, 2),
)


@settings(max_examples=1500, deadline=None)
@given(batches=st.lists(tight_batch, min_size=2, max_size=14))
def test_both_sweeps_give_the_walks_output_batch_for_batch(batches):
    expected = encoded(the_walks_answer(batches))
    plain, _ = sweep_plain(entries(batches))
    assert plain is not None
    assert encoded(as_batches(plain)) == expected
    assert encoded(as_batches(sweep_grouped(entries(batches))[0])) == expected
    assert encoded(as_batches(sweep(entries(batches))[0])) == expected


def random_batches(rng: random.Random) -> list[StateBatch]:
    span, longest = rng.choice([3, 5, 10, 30]), rng.choice([1, 3, 8, 20])
    infos = [(rng.randrange(3), rng.choice([0, 1, 2, 4])) for _ in range(rng.randrange(1, 4))]
    out = []
    for _ in range(rng.randrange(2, 14)):
        first = rng.randrange(span)
        count, state = rng.choice(infos)
        out.append(StateBatch(first, first + rng.randrange(longest), state, count))
    return out


def a_b_random(cases: int, seed: int) -> int:
    rng = random.Random(seed)
    for _ in range(cases):
        batches = random_batches(rng)
        expected = encoded(the_walks_answer(batches))
        assert encoded(as_batches(sweep_grouped(entries(batches))[0])) == expected, batches
        assert encoded(combine_state_batches(batches, [], -1)) == expected, batches
    return cases


def test_a_b_against_the_walk_on_random_input():
    a_b_random(3_000, seed=11)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("n", [2, 3, 7, 40, 150])
def test_adversarial_shapes_give_the_walks_output(shape, n):
    batches = SHAPES[shape](n)
    expected = encoded(the_walks_answer(batches))
    assert encoded(as_batches(sweep_grouped(entries(batches))[0])) == expected
    assert encoded(as_batches(sweep(entries(batches))[0])) == expected
    assert encoded(combine_state_batches(batches, [], -1)) == expected


# Work per batch the grouped sweep may take. Measured: at most 4 on these shapes at any
# size, and at most 5.4 in a hill-climbing search for the costliest input of 30 to 120
# batches; the list walk needs N/2 per batch on the staircase.
WORK_PER_BATCH = 8


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_work_grows_linearly_with_the_batches_for_every_shape(shape):
    for n in (1_000, 4_000):
        batches = SHAPES[shape](n)
        out, work = sweep(entries(batches))
        assert work <= WORK_PER_BATCH * len(batches) + 64, (shape, n, work)
        assert out == sweep_grouped(entries(batches))[0]


def test_the_plain_sweep_alone_is_quadratic_on_the_staircase():
    # Why the grouped sweep exists: the budget must cut the plain one short here.
    n = 400
    out, steps = sweep_plain(entries(staircase(n)))
    assert out is not None
    assert steps > n * n // 4
    assert sweep_plain(entries(staircase(n)), budget=3 * n)[0] is None


def test_a_staircase_of_ten_thousand_batches_takes_linear_work():
    batches = staircase(10_000)
    out, work = sweep(entries(batches))
    assert work <= WORK_PER_BATCH * len(batches)
    # [0, N] at count N, then each offset N+k alone at count N-k: N batches in all.
    assert len(out) == 10_000
    assert out[0] == (0, 10_000, 10_000, 0)
    assert out[-1] == (19_999, 19_999, 1, 0)


def test_merge_batches_sweeps_long_stretches(monkeypatch):
    """The sweep's steps are counted through heapq, which it reaches as a module in
    either mode (a compiled merge calls the compiled sweep directly, so patching the
    name ``sweep`` would see nothing there)."""
    pops: list[int] = []
    real = heapq.heappop

    def counting(heap: list[Entry]) -> Entry:
        pops.append(1)
        return real(heap)

    monkeypatch.setattr(heapq, "heappop", counting)
    merged, clean = merge_batches([], True, staircase(2_000), -1)
    monkeypatch.undo()
    assert pops
    assert len(pops) <= WORK_PER_BATCH * 2_000
    assert merged == as_batches(sweep_grouped(entries(staircase(2_000)))[0])
    assert clean == is_clean(merged)


# --- merge_batches on long stored states: the stretch the new batches reach -------------

stored_batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 200),
    st.integers(0, 15),
    st.sampled_from([0, 1, 2, 4]),
    st.integers(0, 3),
)


@settings(max_examples=500, deadline=None)
@given(
    stored=st.lists(stored_batch, max_size=60),
    new=st.lists(stored_batch, min_size=1, max_size=40),
    start_offset=st.one_of(st.just(-1), st.integers(0, 220)),
)
def test_a_clean_state_merges_long_writes_exactly_as_kafkas_walk(stored, new, start_offset):
    state = reference_combine(stored, [], -1)
    expected = reference_combine(state, new, start_offset)
    merged, clean = merge_batches(state, is_clean(state), new, start_offset)
    assert encoded(merged) == encoded(expected)
    assert clean == is_clean(merged)


def test_a_leaders_write_over_a_long_state_is_exact():
    state = stored_alternating(3_000)
    rng = random.Random(7)
    for _ in range(20):
        lo = rng.randrange(0, 60_000)
        new = [
            StateBatch(lo + 7 * i, lo + 7 * i + rng.randrange(6), rng.choice([0, 2, 4]), 1)
            for i in range(rng.randrange(1, 300))
        ]
        expected = reference_combine(state, new, -1)
        merged, clean = merge_batches(state, True, new, -1)
        assert merged == expected
        assert clean == is_clean(merged)
        state = merged if clean else state


def _touching_alternating(n: int) -> list[StateBatch]:
    """A clean state whose batches touch, in two infos by turns: every neighbour is a
    joint a new batch can split or fill."""
    return [
        StateBatch(10 * i, 10 * i + 9, *((0, 1) if i % 2 else (2, 2))) for i in range(n)
    ]


@pytest.mark.parametrize("shape", [stored_alternating, _touching_alternating])
@pytest.mark.parametrize(
    "info",
    [(0, 0), (0, 1), (2, 1), (4, 2), (4, 32767)],  # (state, count): below, between, above
)
def test_one_batch_over_a_long_clean_state_is_exact_in_linear_steps(monkeypatch, shape, info):
    """A write of one batch sweeps only the stretch it reaches, putting back at most one
    piece per stored batch there: over 3,000 stored batches it must come out as Kafka's
    walk, flag included, without work that grows faster than the stretch."""
    state = shape(3_000)
    assert is_clean(state)
    pushes: list[tuple[int, int, int, int]] = []
    real_push = protocol.batches.heappush

    def counting(heap: list[tuple[int, int, int, int]], item: tuple[int, int, int, int]) -> None:
        pushes.append(item)
        real_push(heap, item)

    monkeypatch.setattr(protocol.batches, "heappush", counting)
    for first, last in ((0, state[-1].last_offset + 5), (15, 20_015), (3, 4)):
        pushes.clear()
        new = [StateBatch(first, last, *info)]
        merged, clean = merge_batches(state, True, new, -1)
        assert merged == reference_combine(state, new, -1), (first, last)
        assert clean == is_clean(merged)
        assert len(pushes) <= len(state) + 1


def test_one_batch_reaching_one_stored_batch_is_exact_for_every_placement():
    """merge_one resolves a write that reaches a single stored batch as one step of the
    walk: every placement of a batch against a stored one (inside, around, across either
    end, touching, apart), in every order of their infos, on either side of others."""
    infos = [(0, 1), (2, 1), (4, 1), (2, 2), (0, 3)]
    checked = 0
    for stored_info in infos:
        stored = StateBatch(10, 14, *stored_info)
        around = [StateBatch(0, 4, 4, 3), stored, StateBatch(21, 25, 0, 1)]
        for state in ([stored], around):
            for first in range(6, 19):
                for last in range(first, 19):
                    for info in infos:
                        for start_offset in (-1, 11):
                            new = [StateBatch(first, last, *info)]
                            merged, clean = merge_batches(state, True, new, start_offset)
                            expected = reference_combine(state, new, start_offset)
                            assert merged == expected, (state, new, start_offset)
                            assert clean == is_clean(merged), (state, new, start_offset)
                            checked += 1
    assert checked == 5 * 2 * 91 * 5 * 2
