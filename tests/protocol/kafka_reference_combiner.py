"""A literal port of Kafka's PersisterStateBatchCombiner walk, kept only as a test oracle.

A TreeSet keyed (first, last, count, state); each round finalises the non-mergeable
prefix and resolves the first mergeable pair. Slow and plain on purpose: the daemon's
combine_state_batches is optimised, and must give exactly this output, batch for batch
(partial coalescing included), which a per-offset model cannot check.
"""

from __future__ import annotations

import msgspec
from sortedcontainers import SortedList

from protocol.state_batch import StateBatch

_Entry = tuple[int, int, int, int]  # (first, last, count, state): Kafka's set order


def reference_combine(
    current: list[StateBatch], new: list[StateBatch], start_offset: int
) -> list[StateBatch]:
    batches = list(current) + list(new)
    if start_offset != -1:
        pruned = []
        for b in batches:
            if b.last_offset < start_offset:
                continue
            pruned.append(
                b
                if b.first_offset >= start_offset
                else msgspec.structs.replace(b, first_offset=start_offset)
            )
        batches = pruned
    if len(batches) < 2:
        return batches
    remaining: SortedList[_Entry] = SortedList(
        {(b.first_offset, b.last_offset, b.delivery_count, b.delivery_state) for b in batches}
    )
    final: list[_Entry] = []
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
    final.extend(remaining)
    return [StateBatch(first, last, s, c) for first, last, c, s in final]


def _first_mergeable_pair(
    remaining: SortedList[_Entry], final: list[_Entry]
) -> tuple[_Entry, _Entry] | None:
    while len(remaining) >= 2:
        prev, cand = remaining[0], remaining[1]
        if cand[0] <= prev[1] or (cand[0] == prev[1] + 1 and cand[2:] == prev[2:]):
            return prev, cand
        final.append(prev)
        del remaining[0]
    return None


def _resolve(prev: _Entry, cand: _Entry) -> list[_Entry]:
    p_first, p_last, p_count, p_state = prev
    c_first, c_last, c_count, c_state = cand
    if (p_count, p_state) == (c_count, c_state):
        return [(p_first, max(p_last, c_last), p_count, p_state)]
    cand_higher = (c_count, c_state) > (p_count, p_state)
    if c_first == p_first:
        if c_last == p_last:
            return [cand]
        return [cand] if cand_higher else [prev, (p_last + 1, c_last, c_count, c_state)]
    if c_last < p_last:
        if not cand_higher:
            return [prev]
        return [
            (p_first, c_first - 1, p_count, p_state),
            cand,
            (c_last + 1, p_last, p_count, p_state),
        ]
    if c_last == p_last:
        return [(p_first, c_first - 1, p_count, p_state), cand] if cand_higher else [prev]
    if not cand_higher:
        return [prev, (p_last + 1, c_last, c_count, c_state)]
    return [(p_first, c_first - 1, p_count, p_state), cand]
