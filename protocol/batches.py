"""State batches and the rule that merges them (SPEC.md §7).

A state batch says that every offset in ``[first_offset, last_offset]`` has one
delivery state and one delivery count. A share-partition's stored state holds a list of
them; every write brings new ones that must be merged into that list.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import NamedTuple

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
    batches = [*current, *new]
    if start_offset != -1:
        for batch in batches:
            if batch[0] < start_offset:
                batches = _prune(batches, start_offset)
                break
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


# Kafka's set order (PersisterStateBatch.compareTo): first, last, count, then state.
_set_order = itemgetter(0, 1, 3, 2)

# Inverted input may wander through ever new sets without repeating one; past this many
# steps it is declared cyclic. Valid input never looks at the bound.
_INVERTED_STEP_LIMIT = 100_000


def _merge(batches: list[StateBatch]) -> list[StateBatch]:
    """Steps 4 to 7 over a list kept in set order.

    The walk only ever looks at the first two elements of the set, and every piece it
    inserts sorts at or after the pair it replaces, so the set is a sorted list with a
    moving head: batches passed over are final and leave by one slice; a piece goes in
    by bisection behind the head. Same steps as Kafka's TreeSet walk.
    """
    # No set(): duplicates sort next to each other, and the walk's same-info merge of an
    # identical pair drops one copy, which is what the set would have done. The input is
    # mostly sorted already (stored batches, then new ones), so the sort is cheap.
    remaining = sorted(batches, key=_set_order)
    final: list[StateBatch] = []
    seen: set[tuple[StateBatch, ...]] | None = None
    checked_inverted = False
    head = 0
    while True:
        # Step 5: walk to the first mergeable pair; everything before it is final.
        i = head
        prev = remaining[i]
        last = len(remaining) - 1
        while i < last:
            cand = remaining[i + 1]
            if cand[0] <= prev[1] or (
                cand[0] == prev[1] + 1 and cand[3] == prev[3] and cand[2] == prev[2]
            ):
                break
            prev = cand
            i += 1
        else:
            final += remaining[head:]
            return final
        final += remaining[head:i]
        if not checked_inverted:
            # Only inverted input can make the walk cycle; look once, when merging starts.
            checked_inverted = True
            if any(b[0] > b[1] for b in remaining):
                seen = set()
        # Step 6: replace the pair by its pieces (a set: no duplicates).
        head = i + 2
        for piece in _resolve(prev, cand):
            at = bisect_left(remaining, _set_order(piece), lo=head, key=_set_order)
            if at == len(remaining) or remaining[at] != piece:
                remaining.insert(at, piece)
        if seen is not None:
            # What happens next depends only on the remaining set: seeing one again
            # means the walk would repeat forever. Valid input always makes progress,
            # so it never pays for this bookkeeping.
            state = tuple(remaining[head:])
            if state in seen or len(seen) >= _INVERTED_STEP_LIMIT:
                raise ValueError(
                    "combine_state_batches: inverted batches (first_offset > last_offset) "
                    "make the merge cycle"
                )
            seen.add(state)


def _resolve(prev: StateBatch, cand: StateBatch) -> list[StateBatch]:
    """Step 6: the pieces that replace an overlapping or contiguous pair."""
    p_first, p_last, p_state, p_count = prev
    c_first, c_last, c_state, c_count = cand
    if p_count == c_count and p_state == c_state:
        return [StateBatch(p_first, max(p_last, c_last), p_state, p_count)]
    cand_higher = (c_count, c_state) > (p_count, p_state)
    if c_first == p_first:
        if c_last == p_last:
            return [cand]
        # The set order puts the longer batch second when both start together.
        if cand_higher:
            return [cand]
        return [prev, StateBatch(p_last + 1, c_last, c_state, c_count)]
    if c_last < p_last:
        if not cand_higher:
            return [prev]
        return [
            StateBatch(p_first, c_first - 1, p_state, p_count),
            cand,
            StateBatch(c_last + 1, p_last, p_state, p_count),
        ]
    if c_last == p_last:
        if not cand_higher:
            return [prev]
        return [StateBatch(p_first, c_first - 1, p_state, p_count), cand]
    if not cand_higher:
        return [prev, StateBatch(p_last + 1, c_last, c_state, c_count)]
    return [StateBatch(p_first, c_first - 1, p_state, p_count), cand]
