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
from collections.abc import Iterable

from sortedcontainers import SortedList

# (first_offset, last_offset, delivery_count, delivery_state): Kafka's set order.
Entry = tuple[int, int, int, int]

# The plain sweep's steps per batch before the grouped one takes over (input from a
# share-partition leader needs at most about two).
PLAIN_STEPS_PER_BATCH = 3
PLAIN_STEPS_SLACK = 16


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
    """The pending batches that start at one offset: (last, count, state) in set order,
    and their infos, whose maximum says whether a front outranks the whole group."""

    __slots__ = ("infos", "tails")

    def __init__(self) -> None:
        self.tails: SortedList[tuple[int, int, int]] = SortedList()
        self.infos: SortedList[tuple[int, int]] = SortedList()

    def add(self, last: int, count: int, state: int) -> None:
        self.tails.add((last, count, state))
        self.infos.add((count, state))


class _Pending:
    """R of the sweep, as groups by first offset, the smallest first offset on a heap."""

    __slots__ = ("firsts", "groups", "moved")

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.groups: dict[int, _Group] = {}
        for first, last, count, state in entries:
            group = self.groups.get(first)
            if group is None:
                group = self.groups[first] = _Group()
            group.add(last, count, state)
        self.firsts = list(self.groups)
        heapq.heapify(self.firsts)
        self.moved = 0

    def pop(self) -> Entry:
        first = self.firsts[0]
        group = self.groups[first]
        last, count, state = group.tails.pop(0)
        group.infos.remove((count, state))
        if not group.tails:
            del self.groups[first]
            heapq.heappop(self.firsts)
        return first, last, count, state

    def push(self, first: int, last: int, count: int, state: int) -> None:
        group = self.groups.get(first)
        if group is None:
            group = self.groups[first] = _Group()
            heapq.heappush(self.firsts, first)
        group.add(last, count, state)

    def move_first_group(self, to: int) -> None:
        """Move the group with the smallest first offset to start at ``to``: what the
        walk does to each of its batches, one by one, when a front ending at ``to - 1``
        outranks them all. Batches ending before ``to`` vanish."""
        first = heapq.heappop(self.firsts)
        group = self.groups.pop(first)
        tails, infos = group.tails, group.infos
        gone = tails.bisect_left((to,))
        for index in range(gone):
            _, count, state = tails[index]
            infos.remove((count, state))
        del tails[:gone]
        self.moved += gone
        if not tails:
            return
        other = self.groups.get(to)
        if other is None:
            self.groups[to] = group
            heapq.heappush(self.firsts, to)
            return
        # The smaller group joins the larger: each batch moves O(log n) times at most
        # through joins.
        if len(other.tails) < len(tails):
            self.groups[to] = group
            group, other = other, group
        other.tails.update(group.tails)
        other.infos.update(group.infos)
        self.moved += len(group.tails)


def sweep_grouped(entries: list[Entry]) -> tuple[list[Entry], int]:
    """The sweep with the pending batches in groups (see the module's docstring)."""
    pending = _Pending(entries)
    groups, firsts = pending.groups, pending.firsts
    out: list[Entry] = []
    f_first, f_last, f_count, f_state = pending.pop()
    steps = 0
    while firsts:
        steps += 1
        b_first = firsts[0]
        group = groups[b_first]
        b_last, b_count, b_state = group.tails[0]
        same = b_count == f_count and b_state == f_state
        if b_first > f_last + 1 or (b_first == f_last + 1 and not same):
            out.append((f_first, f_last, f_count, f_state))
            f_first, f_last, f_count, f_state = pending.pop()
            continue
        if b_first <= f_last and group.infos[-1] < (f_count, f_state):
            pending.move_first_group(f_last + 1)
            continue
        pending.pop()
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
