"""The one model of acknowledged state: what a store must show after a crash.

A writer tells the model what each key holds once a write of it was acknowledged
(``acknowledge``). A write whose answer never came (the process was killed under it)
may or may not have been applied: the model then holds every state the key may be in
(``unanswered``). After a restart the test shows the model what the store holds
(``reconcile`` one key, ``mismatches`` or ``verify`` all of them): it must be one of the
possible states, which from then on is the state. Nothing acknowledged may be lost and
nothing never written may appear.

The model does not know what a state is. The reliability suite keeps share-group state
(tests/reliability/model.py predicts each RPC's outcome), the end-to-end tests keep the
parts of it that ``next_write`` changes (``AcknowledgedGroup`` below), the client's
tests a leader's last offset, the log's tests a record's digest per offset. ``matches``
says whether what the store shows is a given state; equality unless told.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tests.harness.api import TOPIC, Api, batch, body, init_entry

K = TypeVar("K")
V = TypeVar("V")


def _equal(state: Any, shown: Any) -> bool:
    return bool(state == shown)


class Acknowledged(Generic[K, V]):
    """For each key, the states it may be in: one while every answer came."""

    def __init__(
        self, initial: Mapping[K, V], *, matches: Callable[[V, Any], bool] = _equal
    ) -> None:
        self.possible: dict[K, list[V]] = {key: [state] for key, state in initial.items()}
        self.matches = matches

    @property
    def keys(self) -> list[K]:
        return list(self.possible)

    def exact(self, key: K) -> V:
        """The state of ``key``, which must be known (no answer of it is missing)."""
        states = self.possible[key]
        assert len(states) == 1, (key, states)
        return states[0]

    def acknowledge(self, key: K, state: V) -> None:
        """A write was acknowledged: ``key`` is in ``state`` (a new key joins)."""
        self.possible[key] = [state]

    def unanswered(self, key: K, *states: V) -> None:
        """A write's answer never came: ``key`` may also be in any of ``states`` (a key
        the model did not know may also be absent, shown as None)."""
        possible = self.possible.setdefault(key, [None])  # type: ignore[list-item]
        for state in states:
            if state not in possible:
                possible.append(state)

    def uncertain(self) -> list[K]:
        """The keys whose state is not known exactly."""
        return [key for key, states in self.possible.items() if len(states) > 1]

    def reconcile(self, key: K, shown: Any) -> bool:
        """True if what the store shows of ``key`` is a state it may be in (that state
        is then the state); False if an acknowledged write was lost or something never
        acknowledged appeared."""
        for state in self.possible[key]:
            if self.matches(state, shown):
                self.possible[key] = [state]
                return True
        return False

    def mismatches(self, shown: Mapping[K, Any]) -> list[str]:
        """``reconcile`` every key with what the store shows (None where it shows
        nothing); one line per key that matched no state it may be in."""
        return [
            f"{key!r}: shows {shown.get(key)!r}, may be in {self.possible[key]!r}"
            for key in self.possible
            if not self.reconcile(key, shown.get(key))
        ]

    def strangers(self, shown: Iterable[K]) -> list[K]:
        """The keys the store shows that no write ever named."""
        return [key for key in shown if key not in self.possible]

    def verify(self, shown: Mapping[K, Any]) -> None:
        """Every key shows a state it may be in, and nothing else shows at all."""
        wrong = self.mismatches(shown)
        strangers = self.strangers(k for k, v in shown.items() if v is not None)
        assert not wrong, f"{len(wrong)} keys lost or changed:\n" + "\n".join(wrong[:20])
        assert not strangers, f"never written: {strangers[:20]}"


# --- share-group state: writes whose outcome is known without the merge rules ------------

DELIVERY_STATES = (0, 1, 2, 4)


@dataclass(frozen=True)
class Expected:
    """What admin state must show for one key (the parts ``next_write`` changes)."""

    start_offset: int
    state_batches: tuple[tuple[int, int, int, int], ...]
    delivery_complete_count: int

    def matches(self, state: dict[str, Any] | None) -> bool:
        return state is not None and (
            state["start_offset"],
            tuple(tuple(b.values()) for b in state["state_batches"]),
            state["delivery_complete_count"],
        ) == (self.start_offset, self.state_batches, self.delivery_complete_count)


# After initialize with start_offset 0 (docs/semantics.md §A.1 point 7: delivery_complete_count 0).
INITIAL = Expected(0, (), 0)


def next_write(
    rng: random.Random, partition: int, current: Expected
) -> tuple[dict[str, Any], Expected]:
    """A random write entry and the state it leaves. Its start offset is past every
    stored batch, so the state is exactly its one batch (docs/semantics.md §7 step 2), whether the
    write becomes an update or a snapshot."""
    last = current.state_batches[-1][1] if current.state_batches else current.start_offset
    start = last + 1 + rng.randrange(10)
    first, end = start + rng.randrange(3), start + 3 + rng.randrange(40)
    state, count = rng.choice(DELIVERY_STATES), rng.randrange(6)
    complete = rng.randrange(1000)
    entry = {
        "partition": partition,
        "state_epoch": -1,
        "leader_epoch": -1,
        "start_offset": start,
        "delivery_complete_count": complete,
        "state_batches": [batch(first, end, state, count)],
    }
    return entry, Expected(start, ((first, end, state, count),), complete)


def _shows(expected: Expected, state: dict[str, Any] | None) -> bool:
    return expected.matches(state)


class AcknowledgedGroup(Acknowledged[int, Expected]):
    """The acknowledged state of some share-partitions of one group and topic, each
    initialized (``init_body``) and then written with ``next_write``."""

    def __init__(self, group_id: str, partitions: Iterable[int], topic_id: str = TOPIC) -> None:
        super().__init__(dict.fromkeys(partitions, INITIAL), matches=_shows)
        self.group_id = group_id
        self.topic_id = topic_id

    def init_body(self) -> dict[str, Any]:
        return body(self.group_id, (self.topic_id, [init_entry(p, 1, 0) for p in self.keys]))

    async def check(self, api: Api) -> None:
        """Admin state shows what was acknowledged, for every key; a write whose answer
        was lost may be there (and then counts as acknowledged)."""
        shown = {p: await api.state(self.group_id, self.topic_id, p) for p in self.keys}
        wrong = self.mismatches(shown)
        assert not wrong, "\n".join(wrong)
