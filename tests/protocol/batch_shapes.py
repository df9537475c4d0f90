"""Adversarial shapes of state batches: the inputs on which a combiner's cost can blow up.

Each shape is a function of N giving N batches (roughly) as StateBatch, all valid
(first <= last), every delivery state one the edge accepts. The staircase is the one an
adversarial review found (N²/2 steps in the list walk: 10,000 batches took 240 s and
5 GiB); the others are the nestings and chains that a proof of the sweep's cost has to
cover, plus dense random ones. Shared by the sweep's tests, the reliability suite and
the bench.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from protocol.state_batch import StateBatch

_STATES = (0, 1, 2, 4)


def _b(first: int, last: int, count: int, state: int = 0) -> StateBatch:
    return StateBatch(first, last, state, count)


def staircase(n: int) -> list[StateBatch]:
    """[i, i+N] with delivery counts falling from N: each piece is trimmed N times."""
    return [_b(i, i + n, (n - i) % 32768) for i in range(n)]


def staircase_rising(n: int) -> list[StateBatch]:
    return [_b(i, i + n, i % 32768) for i in range(n)]


def staircase_spread(n: int) -> list[StateBatch]:
    return [_b(2 * i, 2 * i + n, (n - i) % 32768) for i in range(n)]


def staircase_mixed_states(n: int) -> list[StateBatch]:
    return [_b(i, i + n, (n - i if i % 2 else i) % 32768, _STATES[i % 4]) for i in range(n)]


def nested_rising(n: int) -> list[StateBatch]:
    """Each batch inside the previous one, each higher: N splits."""
    return [_b(i, 2 * n - i, i % 32768) for i in range(n)]


def nested_falling(n: int) -> list[StateBatch]:
    return [_b(i, 2 * n - i, (n - i) % 32768) for i in range(n)]


def same_first_falling(n: int) -> list[StateBatch]:
    return [_b(0, i, (n - i) % 32768) for i in range(n)]


def same_first_rising(n: int) -> list[StateBatch]:
    return [_b(0, i, i % 32768) for i in range(n)]


def same_last_rising(n: int) -> list[StateBatch]:
    return [_b(i, n, i % 32768) for i in range(n)]


def same_last_falling(n: int) -> list[StateBatch]:
    return [_b(i, n, (n - i) % 32768) for i in range(n)]


def interleaved_stairs(n: int) -> list[StateBatch]:
    """Two staircases through each other, one falling, one rising."""
    out = []
    for i in range(n // 2):
        out.append(_b(i, n + i, (n // 2 - i) % 32768))
        out.append(_b(i, 2 * n - i, i % 32768, 2))
    return out


def low_cover_high_chain(n: int) -> list[StateBatch]:
    """Long low batches under a chain of short high ones that keep splitting them."""
    low = [_b(0, 10 * n, 1)] + [_b(1, 5 * n + i, 0) for i in range(n // 2 - 1)]
    high = [_b(1 + 3 * i, 3 * i + 3, 5 + i % 3) for i in range(n // 2)]
    return low + high


def dense_random(n: int, seed: int = 1) -> list[StateBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        first = rng.randrange(n)
        out.append(_b(first, first + rng.randrange(n), rng.randrange(30), rng.choice(_STATES)))
    return out


def dense_random_two_infos(n: int, seed: int = 2) -> list[StateBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        first = rng.randrange(n)
        out.append(_b(first, first + rng.randrange(n), rng.randrange(2)))
    return out


def disjoint_over_stored(n: int) -> list[StateBatch]:
    """What a share-partition leader sends: disjoint batches (here half of them
    overlapping the stored ones of ``stored_alternating``)."""
    return [_b(20 * i + 5, 20 * i + 14, 2, 0) for i in range(n)]


def stored_alternating(n: int) -> list[StateBatch]:
    return [_b(20 * i, 20 * i + 9, 1, 2) for i in range(n)]


SHAPES: dict[str, Callable[[int], list[StateBatch]]] = {
    shape.__name__: shape
    for shape in (
        staircase,
        staircase_rising,
        staircase_spread,
        staircase_mixed_states,
        nested_rising,
        nested_falling,
        same_first_falling,
        same_first_rising,
        same_last_rising,
        same_last_falling,
        interleaved_stairs,
        low_cover_high_chain,
        dense_random,
        dense_random_two_infos,
    )
}
