"""Kafka's combiner walk as a sweep of its front: the same output in near-linear time.

``protocol.batches`` states the walk as Kafka runs it (docs/semantics.md §7): a sorted
set, whose first mergeable pair is replaced by its pieces until none is left. Two facts
turn that into a sweep:

* every piece a resolution puts back starts at or after the pair it replaces, and the
  first piece starts exactly where the pair did; so the set's first element, the
  *front* ``F``, only ever moves right, and what the walk passes over is final;
* the walk only compares ``F`` with the smallest remaining batch ``b``.

So, with ``R`` the remaining batches in set order and "info" a batch's
``(delivery_count, delivery_state)``, higher info winning::

    F = pop(R)
    while R:
        b = min(R)
        if b.first > F.last + 1, or b.first == F.last + 1 with other info:
            emit F; F = pop(R)                      # F is final
            continue
        pop(R)
        same info            F = [F.first, max(F.last, b.last)]
        b.first == F.first   b higher, or the same span: F = b
                             b lower: push [F.last+1, b.last] with b's info
        b lower              push [F.last+1, b.last] with b's info, if b.last > F.last
        b higher             emit [F.first, b.first-1] with F's info
                             push [b.last+1, F.last] with F's info, if b.last < F.last
                             F = b
    emit F

Kafka's set drops a piece equal to one it holds; the sweep needs no set, because
meeting the same batch twice changes nothing the second time (the pair is same-info).
tests/protocol/test_sweep.py checks both sweeps below against a literal port of Kafka's
walk, batch for batch, on random and adversarial input.

**Cost.** Each step pops one batch; pushes add pieces. Input from a share-partition
leader (stored batches disjoint, the new ones disjoint too) pushes at most one piece per
batch, so ``sweep_plain`` does a few steps per batch. Batches that overlap one another
deeply do not: a staircase of N batches ``[i, i+N]`` with falling counts leaves N-1
pieces that each following front trims by one offset, N²/2 steps in all (a 10,000-batch
entry took 240 s and 5 GiB in the list walk). ``sweep_grouped`` keeps the pending
batches in groups by first offset; when the front is higher than every batch of the group
it meets (and overlaps its start), the plain sweep would pop them one by one and push each
back at ``F.last + 1``: the group moves there in one step instead, dropping the batches
that end inside ``F``. Every adversarial family and a hill-climbing search over small
inputs stayed within a few units of work per batch (tests/protocol/test_sweep.py counts
it). ``sweep`` runs the plain sweep within a budget of steps and, past it, starts again
grouped: ordinary input never pays for the groups.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import Final

# (first_offset, last_offset, delivery_count, delivery_state): Kafka's set order.
Entry = tuple[int, int, int, int]

# The plain sweep's steps per batch before the grouped one takes over (input from a
# share-partition leader needs at most about two).
PLAIN_STEPS_PER_BATCH: Final = 3
PLAIN_STEPS_SLACK: Final = 16


def sweep(entries: list[Entry]) -> tuple[list[Entry], int]:
    """The walk's output for ``entries`` (set order, every ``first <= last``), and the
    work it took (steps, plus batches moved or dropped by the grouped sweep)."""
    budget = PLAIN_STEPS_PER_BATCH * len(entries) + PLAIN_STEPS_SLACK
    out, steps = sweep_plain(entries, budget)
    if out is not None:
        return out, steps
    grouped, work = sweep_grouped(entries)
    return grouped, steps + work


def sweep_plain(entries: list[Entry], budget: int | None = None) -> tuple[list[Entry] | None, int]:
    """The sweep over a heap; ``None`` as the output once ``budget`` steps are spent."""
    heap = list(entries)
    heapq.heapify(heap)  # a no-op on sorted input, but callers may pass any order
    pop, push = heapq.heappop, heapq.heappush
    out: list[Entry] = []
    f_first, f_last, f_count, f_state = pop(heap)
    steps = 0
    limit = -1 if budget is None else budget
    while heap:
        steps += 1
        if steps == limit:
            return None, steps
        b_first, b_last, b_count, b_state = heap[0]
        same = b_count == f_count and b_state == f_state
        if b_first > f_last + 1 or (b_first == f_last + 1 and not same):
            out.append((f_first, f_last, f_count, f_state))
            f_first, f_last, f_count, f_state = pop(heap)
            continue
        pop(heap)
        if same:
            f_last = max(f_last, b_last)
            continue
        higher = b_count > f_count or (b_count == f_count and b_state > f_state)
        if b_first == f_first:
            if higher or b_last == f_last:
                f_last, f_count, f_state = b_last, b_count, b_state
            else:
                push(heap, (f_last + 1, b_last, b_count, b_state))
        elif not higher:
            if b_last > f_last:
                push(heap, (f_last + 1, b_last, b_count, b_state))
        else:
            out.append((f_first, b_first - 1, f_count, f_state))
            if b_last < f_last:
                push(heap, (b_last + 1, f_last, f_count, f_state))
            f_first, f_last, f_count, f_state = b_first, b_last, b_count, b_state
    out.append((f_first, f_last, f_count, f_state))
    return out, steps


class _Group:
    """The pending batches that start at one offset, and their infos (the maximum says
    whether a front outranks the whole group). Plain lists kept sorted, the head at the
    end so that taking it and dropping a run of them are O(1): ``tails`` holds
    ``(-last, -count, -state)`` ascending, that is the batches in set order backwards;
    ``infos`` holds ``(count, state)`` ascending."""

    __slots__ = ("infos", "tails")

    def __init__(self) -> None:
        self.tails: list[tuple[int, int, int]] = []
        self.infos: list[tuple[int, int]] = []

    def add(self, last: int, count: int, state: int) -> None:
        insort(self.tails, (-last, -count, -state))
        insort(self.infos, (count, state))

    def head(self) -> tuple[int, int, int]:
        last, count, state = self.tails[-1]
        return -last, -count, -state

    def pop_head(self) -> tuple[int, int, int]:
        last, count, state = self.tails.pop()
        self._forget(-count, -state)
        return -last, -count, -state

    def drop_ending_before(self, to: int) -> int:
        """Drop the batches that end before ``to`` (a run at the head); how many."""
        tails = self.tails
        at = bisect_left(tails, (1 - to,))
        for _, count, state in tails[at:]:
            self._forget(-count, -state)
        gone = len(tails) - at
        del tails[at:]
        return gone

    def join(self, other: _Group) -> None:
        """Take ``other``'s batches: one by one into a much larger group, else by a sort
        of the two runs (linear)."""
        if len(other.tails) * 8 < len(self.tails):
            for tail in other.tails:
                insort(self.tails, tail)
            for info in other.infos:
                insort(self.infos, info)
        else:
            self.tails += other.tails
            self.tails.sort()
            self.infos += other.infos
            self.infos.sort()

    def _forget(self, count: int, state: int) -> None:
        infos = self.infos
        del infos[bisect_left(infos, (count, state))]


class _Pending:
    """R of the sweep: the input batches not reached yet, in order, and the pieces put
    back, in groups by first offset (the smallest first offset on a heap). An input
    batch joins the group at its first offset only when it meets one there, or another
    input batch starting with it: a group costs two sorted lists, and a lone batch needs
    none."""

    __slots__ = ("entries", "firsts", "groups", "moved", "next")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.next = 0
        self.groups: dict[int, _Group] = {}
        self.firsts: list[int] = []
        self.moved = 0

    def __bool__(self) -> bool:
        return self.next < len(self.entries) or bool(self.firsts)

    def head(self) -> tuple[int, _Group | None]:
        """The smallest first offset, and the group there, gathering the input batches
        that start at it into one; None when a lone input batch is all that starts
        there (it is ``self.entries[self.next]``)."""
        entries, at, firsts = self.entries, self.next, self.firsts
        first = firsts[0] if firsts else None
        if at < len(entries):
            entry_first = entries[at][0]
            if first is None or entry_first < first:
                if at + 1 == len(entries) or entries[at + 1][0] != entry_first:
                    return entry_first, None
                first = entry_first
            elif entry_first > first:
                return first, self.groups[first]
        else:
            assert first is not None
            return first, self.groups[first]
        # Input batches start at ``first``, and a group or another one too: one group.
        group = self.groups.get(first)
        if group is None:
            group = self.groups[first] = _Group()
            heapq.heappush(firsts, first)
        while at < len(entries) and entries[at][0] == first:
            _, last, count, state = entries[at]
            group.add(last, count, state)
            at += 1
        self.next = at
        return first, group

    def pop_group_head(self, first: int, group: _Group) -> tuple[int, int, int]:
        tail = group.pop_head()
        if not group.tails:
            del self.groups[first]
            heapq.heappop(self.firsts)
        return tail

    def push(self, first: int, last: int, count: int, state: int) -> None:
        group = self.groups.get(first)
        if group is None:
            group = self.groups[first] = _Group()
            heapq.heappush(self.firsts, first)
        group.add(last, count, state)

    def move_group(self, first: int, group: _Group, to: int) -> None:
        """Move the group at the smallest first offset to start at ``to``: what the walk
        does to each of its batches, one by one, when a front ending at ``to - 1``
        outranks them all. Batches ending before ``to`` vanish."""
        heapq.heappop(self.firsts)
        del self.groups[first]
        self.moved += group.drop_ending_before(to)
        if not group.tails:
            return
        other = self.groups.get(to)
        if other is None:
            self.groups[to] = group
            heapq.heappush(self.firsts, to)
            return
        # The smaller group joins the larger: each batch moves O(log n) times at most
        # through joins.
        if len(other.tails) < len(group.tails):
            self.groups[to] = group
            group, other = other, group
        other.join(group)
        self.moved += len(group.tails)


def sweep_grouped(entries: list[Entry]) -> tuple[list[Entry], int]:
    """The sweep with the pending batches in groups (see the module's docstring);
    ``entries`` in set order."""
    pending = _Pending(entries)
    out: list[Entry] = []
    f_first, f_last, f_count, f_state = entries[0]
    pending.next = 1
    steps = 0
    while pending:
        steps += 1
        b_first, group = pending.head()
        if group is None:
            _, b_last, b_count, b_state = entries[pending.next]
        else:
            b_last, b_count, b_state = group.head()
        same = b_count == f_count and b_state == f_state
        if b_first > f_last + 1 or (b_first == f_last + 1 and not same):
            out.append((f_first, f_last, f_count, f_state))
            if group is None:
                pending.next += 1
            else:
                pending.pop_group_head(b_first, group)
            f_first, f_last, f_count, f_state = b_first, b_last, b_count, b_state
            continue
        if group is None:
            pending.next += 1
        elif b_first <= f_last and group.infos[-1] < (f_count, f_state):
            pending.move_group(b_first, group, f_last + 1)
            continue
        else:
            pending.pop_group_head(b_first, group)
        if same:
            f_last = max(f_last, b_last)
            continue
        higher = b_count > f_count or (b_count == f_count and b_state > f_state)
        if b_first == f_first:
            if higher or b_last == f_last:
                f_last, f_count, f_state = b_last, b_count, b_state
            else:
                pending.push(f_last + 1, b_last, b_count, b_state)
        elif not higher:
            if b_last > f_last:
                pending.push(f_last + 1, b_last, b_count, b_state)
        else:
            out.append((f_first, b_first - 1, f_count, f_state))
            if b_last < f_last:
                pending.push(b_last + 1, f_last, f_count, f_state)
            f_first, f_last, f_count, f_state = b_first, b_last, b_count, b_state
    out.append((f_first, f_last, f_count, f_state))
    return out, steps + pending.moved
