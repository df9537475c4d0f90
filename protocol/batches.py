"""State batches and the rule that merges them (docs/semantics.md §7).

A state batch says that every offset in ``[first_offset, last_offset]`` has one
delivery state and one delivery count. A share-partition's stored state holds a list of
them; every write brings new ones that must be merged into that list.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from operator import attrgetter
from types import FunctionType
from typing import Final

import msgspec

from protocol.state_batch import BatchFields, StateBatch
from protocol.sweep import sweep

# Delivery states of a record (docs/semantics.md §1.5). Archiving (3) exists in Kafka's enum but is
# never persisted by KIP-932; the edge checks accept only the four below.
AVAILABLE: Final = 0
ACQUIRED: Final = 1
ACKNOWLEDGED: Final = 2
ARCHIVED: Final = 4
DELIVERY_STATES: Final = frozenset({AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED})
# Kafka's names (RecordState), as `sharecoord log dump` and the audit's page print them.
STATE_NAMES = {0: "Available", 1: "Acquired", 2: "Acknowledged", 3: "Archiving", 4: "Archived"}


def state_name(state: int) -> str:
    """A delivery state's name; the number itself for one Kafka does not define."""
    return STATE_NAMES.get(state, str(state))


def combine_state_batches(
    current: Sequence[StateBatch], new: list[StateBatch], start_offset: int
) -> list[StateBatch]:
    """Merge ``new`` into ``current`` and drop what lies below ``start_offset``.

    Kafka's PersisterStateBatchCombiner, step for step (docs/semantics.md §7):

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
    contiguous piece with the same info (docs/semantics.md §7, "exactness trap").

    Raises ``ValueError`` when inverted batches (``first > last``) make the procedure
    cycle, where Kafka's would loop forever (docs/semantics.md §A.1 point 15).
    """
    return merge_batches(current, is_clean(current), new, start_offset)[0]


def merge_batches(
    current: Sequence[StateBatch], current_clean: bool, new: list[StateBatch], start_offset: int
) -> tuple[list[StateBatch], bool]:
    """``combine_state_batches``, told whether ``current`` is clean (see ``is_clean``),
    and saying whether its output is, so a caller that keeps the flag with the stored
    batches never pays for finding out.

    A clean ``current`` is what the combiner almost always returns, and it makes the
    work depend on what the new batches touch, not on how much is stored, without
    changing a single step of the walk: its batches never merge with one another, so
    every batch that ends before the new ones begin is final at once, and so is every
    batch that starts after they end (but the first of them, which a piece may reach
    with the same info). Only that stretch is walked: by the list walk when it is a few
    batches, by the sweep (``protocol.sweep``) otherwise.
    """
    if len(new) == 1:
        valid = new[0].first_offset <= new[0].last_offset
        if valid and current_clean:
            return merge_one(current, new[0], start_offset)
    else:
        valid = all(b.first_offset <= b.last_offset for b in new)
    if not current_clean or not valid:
        merged = _combine(current, new, start_offset)
        return merged, is_clean(merged)
    if start_offset != -1:
        current = _prune_clean(current, start_offset)
        new = prune_batches(new, start_offset)
    if not new:
        return list(current), True
    if len(current) + len(new) < 2:
        return [*current, *new], True
    # The stretch of current the new batches can reach: from the batch before the first
    # that ends at or after (lowest first - 1), to the batch after the last that starts
    # at or before (highest last + 1).
    lowest = min(b.first_offset for b in new)
    highest = max(b.last_offset for b in new)
    lo = max(bisect_left(current, lowest - 1, key=_last_offset) - 1, 0)
    hi = min(bisect_right(current, highest + 1, key=_first_offset) + 1, len(current))
    if hi - lo + len(new) > _LIST_WALK_MAX:
        swept = _swept([*current[lo:hi], *new])
        merged = [*current[:lo], *swept, *current[hi:]]
        return merged, is_clean(merged, max(lo - 1, 0), lo + len(swept) + 1)
    remaining = list(current)
    first_at, last_at = len(remaining), -1
    for batch in new:
        at = bisect_left(remaining, _set_order(batch), lo=lo, key=_set_order)
        remaining.insert(at, batch)
        if at <= last_at:
            last_at += 1
        last_at = max(last_at, at)
        first_at = min(first_at, at)
    # Batches of current below the first new one never merge with one another, nor the
    # last of them with the next current batch: final. The walk starts at the one just
    # before the first new batch, which may merge with it.
    head = first_at - 1 if first_at else 0
    return _walk(remaining, head, len(remaining) - 1 - last_at)


def merge_one(
    current: Sequence[StateBatch], batch: StateBatch, start_offset: int
) -> tuple[list[StateBatch], bool]:
    """``merge_batches`` of one valid batch into a clean ``current``: what nearly every
    write brings. The same steps, but only the stretch the batch can reach is copied
    and swept (``_sweep_one``); the rest of ``current`` is final as it is
    (``merge_batches``), and goes around the swept stretch in one concatenation."""
    if start_offset != -1:
        # A clean list prunes nothing unless its first batch starts below the start.
        if current and current[0].first_offset < start_offset:
            current = _prune_clean(current, start_offset)
        if batch.last_offset < start_offset:
            return list(current), True
        if batch.first_offset < start_offset:
            batch = msgspec.structs.replace(batch, first_offset=start_offset)
    # As a tuple (what the replay stores), which compiled code indexes directly; a
    # Sequence it would index through the generic protocol.
    stored = current if isinstance(current, tuple) else tuple(current)
    n = len(stored)
    if not n:
        return [batch], True
    first, last = batch.first_offset, batch.last_offset
    # Where the batch sorts: current's batches are disjoint, so only one can share its
    # first offset, and the set order decides on the rest of the key for that one.
    at = (
        bisect_left(stored, first, key=_first_offset)
        if _INTERPRETED
        else _first_offset_at(stored, first)
    )
    if at < n and stored[at].first_offset == first and _set_order(stored[at]) < _set_order(batch):
        at += 1
    # Half the writes touch no neighbour they would merge with: the walk would pass
    # every pair, so the output is current with the batch inserted, still clean.
    after = stored[at] if at < n else None
    before = stored[at - 1] if at else None
    if (
        after is None
        or last + 1 < after.first_offset
        or (
            last + 1 == after.first_offset
            and (
                after.delivery_count != batch.delivery_count
                or after.delivery_state != batch.delivery_state
            )
        )
    ) and (
        before is None
        or before.last_offset + 1 < first
        or (
            before.last_offset + 1 == first
            and (
                before.delivery_count != batch.delivery_count
                or before.delivery_state != batch.delivery_state
            )
        )
    ):
        merged = list(stored)
        merged.insert(at, batch)
        return merged, True
    # The stretch the batch reaches: from the first batch of current that ends at or
    # after first - 1 to the last that starts at or before last + 1, where it sorts.
    # Current's batches are disjoint, so those are neighbours of `at`, found by stepping
    # out from it; the batches around the stretch stay final, and clean against it
    # (``_sweep_one``).
    lo = at
    while lo and stored[lo - 1].last_offset >= first - 1:
        lo -= 1
    hi = at
    while hi < n and stored[hi].first_offset <= last + 1:
        hi += 1
    if hi - lo == 1:
        # One stored batch reached (a third of all writes): one step of the walk
        # resolves the pair, and its pieces neither merge with one another (they touch
        # only where their infos differ) nor reach past the stretch: final and clean.
        # (Two calls, not one of a pair unpacked: a call with * goes through the generic
        # protocol from compiled code.)
        walked = _resolve(stored[lo], batch) if lo < at else _resolve(batch, stored[lo])
        clean = True
    else:
        walked, clean = _sweep_one([*stored[lo:at], batch, *stored[at:hi]])
    if lo == 0 and hi == n:
        return walked, clean
    # One copy of current and one move of its tail, where slicing around the stretch
    # built two tuples and a list grown by three extends.
    merged = list(stored)
    merged[lo:hi] = walked
    return merged, clean


def _first_offset_at(stored: tuple[StateBatch, ...], first: int) -> int:
    """``bisect_left(stored, first, key=_first_offset)`` written out: compiled, a step
    is a field read and a compare, where bisect calls the key function for each. Only
    when compiled (``_INTERPRETED``): the interpreter runs the loop slower than bisect.
    (bench.entry_cost, interleaved: compiled, batched 0.94x and single 0.97x with it;
    interpreted, batched 1.07x.)"""
    lo, hi = 0, len(stored)
    while lo < hi:
        mid = (lo + hi) >> 1
        if stored[mid].first_offset < first:
            lo = mid + 1
        else:
            hi = mid
    return lo


# Whether this module runs interpreted: a compiled module's functions are builtins.
_INTERPRETED: Final = isinstance(_first_offset_at, FunctionType)


def is_clean(batches: Sequence[StateBatch], lo: int = 0, hi: int | None = None) -> bool:
    """Whether ``batches[lo:hi]`` is in the combiner's tidy shape: each batch valid
    (first <= last), sorted, and no two neighbours overlapping or touching with the same
    info. Combiner output always is, but for what partial coalescing leaves behind."""
    end = len(batches) if hi is None else min(hi, len(batches))
    if end - lo < 1:
        return True
    prev = batches[lo]
    if prev.first_offset > prev.last_offset:
        return False
    for i in range(lo + 1, end):
        cand = batches[i]
        if cand.first_offset > cand.last_offset or cand.first_offset <= prev.last_offset:
            return False
        if (
            cand.first_offset == prev.last_offset + 1
            and cand.delivery_count == prev.delivery_count
            and cand.delivery_state == prev.delivery_state
        ):
            return False
        prev = cand
    return True


def _combine(
    current: Sequence[StateBatch], new: list[StateBatch], start_offset: int
) -> list[StateBatch]:
    """The general case: any input at all, inverted batches included."""
    batches = [*current, *new]
    if start_offset != -1:
        for batch in batches:
            if batch.first_offset < start_offset:
                batches = _prune(batches, start_offset)
                break
    if len(batches) < 2:
        return batches
    if all(b.first_offset <= b.last_offset for b in batches):
        return _swept(batches)
    # Inverted batches (the edge refuses them; only a library caller or a hand-made log
    # brings them): the list walk, which can tell when Kafka's would loop forever. No
    # set(): duplicates sort next to each other, and the walk's same-info merge of an
    # identical pair drops one copy, which is what the set would have done.
    remaining = sorted(batches, key=_set_order)
    return _walk(remaining, 0, 0, True)[0]


def _swept(batches: list[StateBatch]) -> list[StateBatch]:
    """Steps 4 to 7 for valid batches, by the sweep; the batches as StateBatch again."""
    entries = sorted(map(_set_order, batches))
    out = sweep(entries)[0] if len(entries) > 1 else entries
    return [StateBatch(first, last, state, count) for first, last, count, state in out]


def prune_batches(batches: list[StateBatch], start_offset: int) -> list[StateBatch]:
    """Step 2 alone: ``batches`` without what lies below ``start_offset`` (the same
    list when nothing does). For batches already in the combiner's shape, this is
    all that combining them with nothing would do."""
    for batch in batches:
        if batch.first_offset < start_offset:
            return _prune(batches, start_offset)
    return batches


def _prune(batches: list[StateBatch], start_offset: int) -> list[StateBatch]:
    pruned: list[StateBatch] = []
    for batch in batches:
        if batch.last_offset < start_offset:
            continue
        if batch.first_offset >= start_offset:
            pruned.append(batch)
        else:
            pruned.append(msgspec.structs.replace(batch, first_offset=start_offset))
    return pruned


def _prune_clean(batches: Sequence[StateBatch], start_offset: int) -> Sequence[StateBatch]:
    """``_prune`` of a clean list: its last offsets ascend, so the batches that end
    below the start are a prefix, and only the first batch left can straddle it."""
    at = bisect_left(batches, start_offset, key=_last_offset)
    if at == len(batches):
        return []
    first = batches[at]
    if first.first_offset >= start_offset:
        return batches[at:] if at else batches
    return [msgspec.structs.replace(first, first_offset=start_offset), *batches[at + 1 :]]


# Kafka's set order (PersisterStateBatch.compareTo): first, last, count, then state.
_set_order: Final = attrgetter("first_offset", "last_offset", "delivery_count", "delivery_state")
_last_offset: Final = attrgetter("last_offset")
_first_offset: Final = attrgetter("first_offset")
# A static of the compiled module for the class the walk and the sweep make pieces of:
# from compiled code, a class imported from a module Python runs is a lookup in this
# module's dict at each use. (heappush stays a module name: a test counts its calls.)
_STATE_BATCH: Final = StateBatch
# A batch's four fields in one C call (protocol/state_batch.py, BatchFields), where each
# field read from compiled code is a generic attribute lookup.
_BATCH_FIELDS: Final[Callable[[StateBatch], BatchFields]] = msgspec.structs.astuple

# Stretches of up to this many batches (stored ones the new batches can reach, and the
# new ones) are walked as a list, Kafka's way; longer ones are swept (protocol.sweep).
# The list walk inserts each piece into a list and may resolve a stretch's batches
# against one another pairwise, which costs more than the sweep's heap past a dozen.
_LIST_WALK_MAX: Final = 16

# Inverted input may wander through ever new sets without repeating one; past this many
# steps it is declared cyclic. Valid input never looks at the bound.
_INVERTED_STEP_LIMIT: Final = 100_000


def _walk(
    remaining: list[StateBatch], head: int, tail: int, check_cycles: bool = False
) -> tuple[list[StateBatch], bool]:
    """Steps 5 to 7 over ``remaining``, a list in set order whose first ``head``
    batches are already final and whose last ``tail`` batches are an untouched clean
    run (they never merge with one another). Returns the output, and whether it is
    clean given that the input was (see ``merge_batches``).

    The walk only ever looks at the first two elements of the set, and every piece it
    inserts sorts at or after the pair it replaces, so the set is a sorted list with a
    moving head: batches passed over are final and leave by one slice; a piece goes in
    by bisection behind the head. Same steps as Kafka's TreeSet walk.

    Every two neighbours of the output were compared by the walk, but at a joint: the
    last final batch before a pair was resolved, and whatever came out next. Partial
    coalescing can leave two same-info batches touching there, and only there.
    """
    final = remaining[:head]
    joints: list[int] = []
    seen: set[tuple[StateBatch, ...]] | None = set() if check_cycles else None
    while True:
        # Step 5: walk to the first mergeable pair; everything before it is final.
        i = head
        prev = remaining[i]
        last = len(remaining) - 1
        into_tail = last - tail  # from here on, cand lies in the clean run
        while i < last:
            cand = remaining[i + 1]
            if cand.first_offset <= prev.last_offset or (
                cand.first_offset == prev.last_offset + 1
                and cand.delivery_count == prev.delivery_count
                and cand.delivery_state == prev.delivery_state
            ):
                break
            if i >= into_tail:
                final += remaining[head:]
                return final, _joints_clean(final, joints)
            prev = cand
            i += 1
        else:
            final += remaining[head:]
            return final, _joints_clean(final, joints)
        final += remaining[head:i]
        joints.append(len(final))
        # Step 6: replace the pair by its pieces (a set: no duplicates).
        head = i + 2
        tail = min(tail, len(remaining) - head)
        lo = head
        for piece in _resolve(prev, cand):
            # Pieces of valid batches come out in order, and mostly land right where the
            # pair was (inverted ones go by bisection, as every piece once did).
            if seen is None and (
                lo == len(remaining) or piece.first_offset < remaining[lo].first_offset
            ):
                remaining.insert(lo, piece)
            else:
                lo = bisect_left(
                    remaining, _set_order(piece), lo=lo if seen is None else head, key=_set_order
                )
                if lo < len(remaining) and remaining[lo] == piece:
                    lo += 1
                    tail = min(tail, len(remaining) - lo)
                    continue
                remaining.insert(lo, piece)
            lo += 1
            tail = min(tail, len(remaining) - lo)
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


def _joints_clean(final: list[StateBatch], joints: list[int]) -> bool:
    for j in joints:
        if 0 < j < len(final):
            left, right = final[j - 1], final[j]
            if (
                right.first_offset == left.last_offset + 1
                and right.delivery_count == left.delivery_count
                and right.delivery_state == left.delivery_state
            ):
                return False
    return True


def _resolve(prev: StateBatch, cand: StateBatch) -> list[StateBatch]:
    """Step 6: the pieces that replace an overlapping or contiguous pair."""
    p_first, p_last, p_state, p_count = _BATCH_FIELDS(prev)
    c_first, c_last, c_state, c_count = _BATCH_FIELDS(cand)
    if p_count == c_count and p_state == c_state:
        return [_STATE_BATCH(p_first, max(p_last, c_last), p_state, p_count)]
    cand_higher = c_count > p_count or (c_count == p_count and c_state > p_state)
    if c_first == p_first:
        if c_last == p_last:
            return [cand]
        # The set order puts the longer batch second when both start together.
        if cand_higher:
            return [cand]
        return [prev, _STATE_BATCH(p_last + 1, c_last, c_state, c_count)]
    if c_last < p_last:
        if not cand_higher:
            return [prev]
        return [
            _STATE_BATCH(p_first, c_first - 1, p_state, p_count),
            cand,
            _STATE_BATCH(c_last + 1, p_last, p_state, p_count),
        ]
    if c_last == p_last:
        if not cand_higher:
            return [prev]
        return [_STATE_BATCH(p_first, c_first - 1, p_state, p_count), cand]
    if not cand_higher:
        return [prev, _STATE_BATCH(p_last + 1, c_last, c_state, c_count)]
    return [_STATE_BATCH(p_first, c_first - 1, p_state, p_count), cand]


def _sweep_one(stretch: list[StateBatch]) -> tuple[list[StateBatch], bool]:
    """Steps 4 to 7 for a clean run of batches with one more batch in it (set order):
    ``sweep_plain``'s steps (protocol.sweep), taking the batches in order from the list
    and the pieces from a heap. A clean run puts back at most one piece per batch, so
    the steps are linear in the stretch, and most of the output is the input's own
    batches, kept as they are. Returns the output and whether it is clean."""
    out: list[StateBatch] = []
    append = out.append
    pieces: list[tuple[int, int, int, int]] = []  # (first, last, count, state)
    n = len(stretch)
    front = stretch[0]
    f_first, f_last, f_state, f_count = _BATCH_FIELDS(front)
    # The front as an object while it is one of the stretch's, unchanged: output as is.
    f_obj: StateBatch | None = front
    # The last batch output, for the clean flag: partial coalescing can only leave a
    # same-info pair touching where a front is output after another.
    o_last, o_count, o_state = f_first - 2, -1, -1
    clean = True
    i = 1
    obj: StateBatch | None
    while True:
        if i < n:
            obj = stretch[i]
            b_first, b_last, b_state, b_count = _BATCH_FIELDS(obj)
            if pieces and pieces[0] < (b_first, b_last, b_count, b_state):
                obj = None
                b_first, b_last, b_count, b_state = heappop(pieces)
            else:
                i += 1
        elif pieces:
            obj = None
            b_first, b_last, b_count, b_state = heappop(pieces)
        else:
            break
        same = b_count == f_count and b_state == f_state
        if b_first > f_last + 1 or (b_first == f_last + 1 and not same):
            if f_first == o_last + 1 and f_count == o_count and f_state == o_state:
                clean = False
            append(f_obj or _STATE_BATCH(f_first, f_last, f_state, f_count))
            o_last, o_count, o_state = f_last, f_count, f_state
            f_obj, f_first, f_last, f_count, f_state = obj, b_first, b_last, b_count, b_state
            continue
        if same:
            if b_last > f_last:
                f_obj, f_last = None, b_last
            continue
        higher = b_count > f_count or (b_count == f_count and b_state > f_state)
        if b_first == f_first:
            if higher or b_last == f_last:
                f_obj, f_last, f_count, f_state = obj, b_last, b_count, b_state
            else:
                heappush(pieces, (f_last + 1, b_last, b_count, b_state))
        elif not higher:
            if b_last > f_last:
                heappush(pieces, (f_last + 1, b_last, b_count, b_state))
        else:
            # F's part before b: it touches b, whose info differs.
            if f_first == o_last + 1 and f_count == o_count and f_state == o_state:
                clean = False
            append(_STATE_BATCH(f_first, b_first - 1, f_state, f_count))
            o_last, o_count, o_state = b_first - 1, f_count, f_state
            if b_last < f_last:
                heappush(pieces, (b_last + 1, f_last, f_count, f_state))
            f_obj, f_first, f_last, f_count, f_state = obj, b_first, b_last, b_count, b_state
    if f_first == o_last + 1 and f_count == o_count and f_state == o_state:
        clean = False
    append(f_obj or _STATE_BATCH(f_first, f_last, f_state, f_count))
    return out, clean
