"""State batches and the rule that merges them (SPEC.md §7).

A state batch says that every offset in ``[first_offset, last_offset]`` has one
delivery state and one delivery count. A share-partition's stored state holds a list of
them; every write brings new ones that must be merged into that list.
"""

from __future__ import annotations

from typing import NamedTuple

from sortedcontainers import SortedList

# Delivery states of a record (SPEC §1.5). Archiving (3) exists in Kafka's enum but is
# never persisted by KIP-932; the edge checks accept only the four below.
AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4
DELIVERY_STATES = frozenset({AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED})


class StateBatch(NamedTuple):
    """``[first_offset, last_offset]`` in one delivery state with one delivery count.

    Validates nothing (SPEC §A.1 point 9): the pure combiner passes odd input through
    exactly as Kafka does; validation belongs to the HTTP edge.
    """

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


# Inside the combiner a batch is the plain tuple (first, last, count, state): tuple order
# is then exactly Kafka's PersisterStateBatch.compareTo (count before state), so the
# sorted set needs no key function.
_Entry = tuple[int, int, int, int]


def combine_state_batches(
    current: list[StateBatch], new: list[StateBatch], start_offset: int
) -> list[StateBatch]:
    """Merge ``new`` into ``current`` and drop what lies below ``start_offset``.

    Kafka's PersisterStateBatchCombiner, step for step (SPEC §7):

    1. Concatenate ``current + new``.
    2. Prune, unless ``start_offset == -1``: drop a batch that ends below it, trim one
       that straddles it to start at it, keep the rest.
    3. Fewer than two batches left: return them unchanged (no sort, no validation).
    4. Put the batches in a sorted set keyed ``(first, last, count, state)``; exact
       duplicates collapse.
    5. Walk the set: the first ``prev``/``cand`` neighbours that overlap
       (``cand.first <= prev.last``), or touch with the same (count, state), form the
       mergeable pair. Every ``prev`` passed over is final: it moves to the output.
    6. Replace the pair by the pieces below (priority: higher delivery count wins, then
       higher delivery state; the origin of a batch, current or new, never matters).
    7. Repeat from 5 until no pair is left; the set's remainder ends the output.

    Step 6, drawn as offset ranges (``P`` = prev, ``C`` = cand, ``p``/``c`` = their
    (count, state)). Same info merges into one batch whatever the overlap::

        P  [=======]             P  [=======]            P [=====]
        C      [========]        C    [===]              C        [====]
        => [============] p      => [=======] p          => [==========] p

    Different info (so they overlap; ``C`` sorts after ``P``)::

        same span        C higher or equal set order: keep C only
            P [=====]    => [=====] c
            C [=====]

        same first       C lower:  P, then the part of C past P
            P [====]     => [====] p [====] c
            C [========] C higher: C only
                         => [========] c

        C inside P       C lower:  P only
            P [==========]  => [==========] p
            C    [====]     C higher: P before C, C, P after C
                            => [==] p [====] c [====] p

        same last        C lower:  P only
            P [==========]  C higher: P before C, then C
            C      [=====]  => [====] p [=====] c

        partial overlap  C lower:  P, then the part of C past P
            P [=======]      => [=======] p [====] c
            C     [=========] C higher: P before C, then C
                             => [==] p [=========] c

    Partial coalescing is kept on purpose: a batch is final as soon as its current right
    neighbour does not merge with it, even if that neighbour is later replaced by a
    contiguous piece with the same info (SPEC §7, "exactness trap").

    Raises ``ValueError`` when inverted batches (``first > last``) make the procedure
    cycle, where Kafka's would loop forever (SPEC §A.1 point 15).
    """
    batches = list(current) + list(new) if current else list(new)
    if start_offset != -1:
        batches = _prune(batches, start_offset)
    if len(batches) < 2:
        return batches
    return _merge(batches)


def _prune(batches: list[StateBatch], start_offset: int) -> list[StateBatch]:
    pruned: list[StateBatch] = []
    for batch in batches:
        if batch.last_offset < start_offset:
            continue
        if batch.first_offset >= start_offset:
            pruned.append(batch)
        else:
            pruned.append(batch._replace(first_offset=start_offset))
    return pruned


def _merge(batches: list[StateBatch]) -> list[StateBatch]:
    entries = sorted({(b[0], b[1], b[3], b[2]) for b in batches})
    inverted = any(first > last for first, last, _, _ in entries)
    if not inverted and _already_merged(entries):
        # The walk would finalise every batch in set order without one merge.
        return [StateBatch(first, last, state, count) for first, last, count, state in entries]
    return [
        StateBatch(first, last, state, count)
        for first, last, count, state in _merge_slow(entries, inverted)
    ]


def _already_merged(entries: list[_Entry]) -> bool:
    prev = entries[0]
    for cand in entries[1:]:
        if cand[0] <= prev[1] or (cand[0] == prev[1] + 1 and cand[2:] == prev[2:]):
            return False
        prev = cand
    return True


# Inverted input may wander through ever new sets without repeating one; past this many
# steps it is declared cyclic. Valid input never looks at the bound.
_INVERTED_STEP_LIMIT = 100_000


def _merge_slow(entries: list[_Entry], inverted: bool) -> list[_Entry]:
    remaining: SortedList[_Entry] = SortedList(entries)
    final: list[_Entry] = []
    seen: set[tuple[_Entry, ...]] = set()
    while True:
        pair = _first_mergeable_pair(remaining, final)
        if pair is None:
            break
        prev, cand = pair
        remaining.remove(prev)
        remaining.remove(cand)
        for piece in _resolve(prev, cand):
            if piece not in remaining:
                remaining.add(piece)
        if inverted:
            # What happens next depends only on the remaining set: seeing one again
            # means the walk would repeat forever. Valid input always makes progress,
            # so it never pays for this bookkeeping.
            state = tuple(remaining)
            if state in seen or len(seen) >= _INVERTED_STEP_LIMIT:
                raise ValueError(
                    "combine_state_batches: inverted batches (first_offset > last_offset) "
                    "make the merge cycle"
                )
            seen.add(state)
    final.extend(remaining)
    return final


def _first_mergeable_pair(
    remaining: SortedList[_Entry], final: list[_Entry]
) -> tuple[_Entry, _Entry] | None:
    """Step 5: finalise the non-mergeable prefix, return the first mergeable pair."""
    while len(remaining) >= 2:
        prev: _Entry = remaining[0]
        cand: _Entry = remaining[1]
        if cand[0] <= prev[1] or (cand[0] == prev[1] + 1 and cand[2:] == prev[2:]):
            return prev, cand
        final.append(prev)
        del remaining[0]
    return None


def _resolve(prev: _Entry, cand: _Entry) -> list[_Entry]:
    """Step 6: the pieces that replace an overlapping or contiguous pair."""
    p_first, p_last, p_count, p_state = prev
    c_first, c_last, c_count, c_state = cand
    if (p_count, p_state) == (c_count, c_state):
        return [(p_first, max(p_last, c_last), p_count, p_state)]
    cand_higher = (c_count, c_state) > (p_count, p_state)
    if c_first == p_first:
        if c_last == p_last:
            return [cand]
        # The set order puts the longer batch second when both start together.
        if cand_higher:
            return [cand]
        return [prev, (p_last + 1, c_last, c_count, c_state)]
    if c_last < p_last:
        if not cand_higher:
            return [prev]
        return [
            (p_first, c_first - 1, p_count, p_state),
            cand,
            (c_last + 1, p_last, p_count, p_state),
        ]
    if c_last == p_last:
        if not cand_higher:
            return [prev]
        return [(p_first, c_first - 1, p_count, p_state), cand]
    if not cand_higher:
        return [prev, (p_last + 1, c_last, c_count, c_state)]
    return [(p_first, c_first - 1, p_count, p_state), cand]
