"""The acknowledged state of a small key space (the harness's model,
tests/harness/acknowledged.py), with the share-group rules that predict each answer, for
writers that may lose answers (SIGKILL) or get 15 for some entries (disk faults).

Each key (group, partition of one topic) maps to the list of states it may be in. While
the daemon answers, that list has one element: the state is known exactly, and every
answer is checked against what the model predicts (codes, read results, summaries), so
the model and the daemon agree on docs/semantics.md §5 before anything is killed. When an answer is
lost, each key of that request may be in the state after any prefix of its entries (the
log makes a prefix of a partition's records durable). After a restart ``reconcile`` looks
at what the daemon shows: it must be one of the possible states, which then is the state.

The random operations keep the state computable without docs/semantics.md §7's merge: a write either
moves the start offset past every stored batch and brings its own batches (which are then
the state's batches), or keeps the start offset and appends batches past the last one,
with gaps so nothing coalesces. Both give the same result whether the write becomes a
ShareUpdate or a ShareSnapshot, so the snapshot cadence (a daemon flag) may change between
restarts. ``snapshot_epoch`` is bookkeeping of that cadence and is not compared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from protocol.routing import partition_for
from tests.harness import TOPIC, TOPIC_RFC4122, Acknowledged

Key = tuple[str, int]  # (group_id, partition) of TOPIC
Batch = tuple[int, int, int, int]
DELIVERY_STATES = (0, 1, 2, 4)
NOT_AVAILABLE = 15
MSG_NOT_AVAILABLE = "Share coordinator is not available."
RPCS = ("initialize", "write", "read", "read-summary", "delete")


@dataclass(frozen=True)
class State:
    """What GET /v1/admin/state shows of a key, less snapshot_epoch."""

    state_epoch: int
    leader_epoch: int
    start_offset: int
    delivery_complete_count: int
    state_batches: tuple[Batch, ...]
    fence_state: int | None
    fence_leader: int

    @classmethod
    def from_admin(cls, body: dict[str, Any] | None) -> State | None:
        if body is None:
            return None
        return cls(
            body["state_epoch"],
            body["leader_epoch"],
            body["start_offset"],
            body["delivery_complete_count"],
            tuple(
                (b["first_offset"], b["last_offset"], b["delivery_state"], b["delivery_count"])
                for b in body["state_batches"]
            ),
            body["fencing"]["state_epoch"],
            body["fencing"]["leader_epoch"],
        )

    @property
    def last_offset(self) -> int:
        """The highest offset the state mentions (start offset or a batch's end)."""
        ends = [b[1] for b in self.state_batches]
        return max([self.start_offset, *ends])


@dataclass(frozen=True)
class Planned:
    """One partition entry of a request and what it must do."""

    key: Key
    entry: dict[str, Any]
    code: int
    after: State | None  # the key's state once this entry is applied
    answer: dict[str, Any]  # result fields a success must carry (read, read-summary)
    writes: bool  # whether a success appends a record


@dataclass
class Request:
    rpc: str
    group_id: str
    planned: list[Planned]
    topics: list[tuple[str, list[int]]]  # topic spelling -> indexes into planned

    def body(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "topics": [
                {"topic_id": spelling, "partitions": [self.planned[i].entry for i in indexes]}
                for spelling, indexes in self.topics
            ],
        }

    def touched(self) -> set[Key]:
        return {p.key for p in self.planned}


class Mismatch(AssertionError):
    pass


def _shows(state: State | None, shown: dict[str, Any] | None) -> bool:
    """Whether admin state ``shown`` (None: 404) is ``state``."""
    return State.from_admin(shown) == state


class Model(Acknowledged[Key, State | None]):
    def __init__(self, groups: list[str], partitions: int, num_state_partitions: int) -> None:
        keys = [(g, p) for g in groups for p in range(partitions)]
        super().__init__(dict.fromkeys(keys), matches=_shows)
        self.num_state_partitions = num_state_partitions

    def state_partition(self, key: Key) -> int:
        return partition_for(key[0], TOPIC, key[1], self.num_state_partitions)

    # --- planning -------------------------------------------------------------------

    def plan(self, rng: random.Random, rpc: str, keys: list[Key]) -> Request:
        """A request of ``rpc`` over ``keys`` (one group), some entries repeated, split
        over both spellings of the topic id; each entry's outcome predicted in order."""
        group_id = keys[0][0]
        order = list(keys)
        if rng.random() < 0.15:
            order.insert(rng.randrange(len(order) + 1), rng.choice(keys))  # a duplicate
        current = {k: self.exact(k) for k in keys}
        planned = []
        for key in order:
            step = _PLANNERS[rpc](rng, key, current[key])
            current[key] = step.after
            planned.append(step)
        spellings = [TOPIC, TOPIC_RFC4122]
        if rng.random() < 0.3 and len(planned) > 1:
            cut = rng.randrange(1, len(planned))
            topics = [
                (spellings[0], list(range(cut))),
                (spellings[1], list(range(cut, len(planned)))),
            ]
        else:
            topics = [(rng.choice(spellings), list(range(len(planned))))]
        return Request(rpc, group_id, planned, topics)

    # --- outcomes -------------------------------------------------------------------

    def settle(self, request: Request, answer: dict[str, Any], *, faults: bool = False) -> int:
        """An answered request: check each result against its prediction and apply the
        successful ones. With ``faults``, entries may answer 15 (not applied); within
        one state partition a 15 is followed only by 15s. Returns how many entries were
        answered 15."""
        results = _flatten(request, answer)
        failed_partitions: set[int] = set()
        unavailable = 0
        state = {k: self.exact(k) for k in request.touched()}
        for step, result in zip(request.planned, results, strict=True):
            where = (request.rpc, step.key, step.entry, result)
            if result["partition"] != step.key[1]:
                raise Mismatch(f"results out of order: {where}")
            state_partition = self.state_partition(step.key)
            if result["error_code"] == NOT_AVAILABLE and faults:
                if result["error_message"] != MSG_NOT_AVAILABLE:
                    raise Mismatch(f"15 with another message: {where}")
                failed_partitions.add(state_partition)
                unavailable += 1
                continue
            if state_partition in failed_partitions:
                raise Mismatch(f"an entry after a 15 on its state partition succeeded: {where}")
            # The prediction was made assuming every earlier entry applied; an earlier
            # entry of this key that failed would have failed this one too (above).
            expected = outcome(request.rpc, step, state[step.key])
            if result["error_code"] != expected.code:
                raise Mismatch(f"code {result['error_code']} != {expected.code}: {where}")
            for name, value in expected.answer.items():
                if result.get(name) != value:
                    raise Mismatch(f"{name}: {result.get(name)!r} != {value!r}: {where}")
            state[step.key] = expected.after
        for key, value in state.items():
            self.acknowledge(key, value)
        return unavailable

    def lost(self, request: Request) -> None:
        """The answer never came: each key may be after any prefix of its entries."""
        for key in request.touched():
            current = self.exact(key)
            after: list[State | None] = []
            for step in request.planned:
                if step.key != key:
                    continue
                current = outcome(request.rpc, step, current).after
                after.append(current)
            self.unanswered(key, *after)


def _flatten(request: Request, answer: dict[str, Any]) -> list[dict[str, Any]]:
    topics = answer["results"]
    if [t["topic_id"] for t in topics] != [spelling for spelling, _ in request.topics]:
        raise Mismatch(f"topics out of order: {answer}")
    return [r for t in topics for r in t["partitions"]]


# --- one planner per RPC: the entry, and its outcome on a given state --------------------


def _batches_from(rng: random.Random, first: int) -> list[Batch]:
    """0 to 2 batches starting at or after ``first``, gapped so that none coalesce."""
    out = []
    at = first
    for _ in range(rng.choice((0, 1, 1, 1, 2))):
        start = at + rng.randrange(3)
        end = start + rng.randrange(30)
        out.append((start, end, rng.choice(DELIVERY_STATES), rng.randrange(6)))
        at = end + 2
    return out


def _batch_maps(batches: list[Batch] | tuple[Batch, ...]) -> list[dict[str, int]]:
    return [
        {"first_offset": first, "last_offset": last, "delivery_state": s, "delivery_count": c}
        for first, last, s, c in batches
    ]


def _epoch_choice(rng: random.Random, fence: int | None, *, exempt: bool = True) -> int:
    """An epoch around ``fence``: -1, equal, higher, or lower (to be fenced)."""
    base = 0 if fence is None else fence
    choices = [base, base, base + rng.randrange(1, 3)]
    if exempt:
        choices.append(-1)
    if base >= 1:
        choices.append(base - 1)
    return rng.choice(choices)


def plan_initialize(rng: random.Random, key: Key, state: State | None) -> Planned:
    fence = state.fence_state if state is not None else None
    state_epoch = _epoch_choice(rng, fence) if state is not None else rng.choice((-1, 0, 1, 5))
    start_offset = rng.choice((-1, 0, rng.randrange(1000)))
    entry = {"partition": key[1], "state_epoch": state_epoch, "start_offset": start_offset}
    return _initialize_outcome(key, entry, state)


def _initialize_outcome(key: Key, entry: dict[str, Any], state: State | None) -> Planned:
    epoch, start = entry["state_epoch"], entry["start_offset"]
    fence = state.fence_state if state is not None else None
    if epoch != -1 and fence is not None and fence > epoch:
        return Planned(key, entry, 124, state, {}, False)
    if state is None:
        fence_state, fence_leader = epoch, 0
    else:
        fs = state.fence_state
        fence_state = epoch if fs is None or fs < epoch else fs
        fence_leader = max(state.fence_leader, 0)
    after = State(epoch, 0, start, -1 if start == -1 else 0, (), fence_state, fence_leader)
    return Planned(key, entry, 0, after, {}, True)


def plan_write(rng: random.Random, key: Key, state: State | None) -> Planned:
    leader = _epoch_choice(rng, state.fence_leader if state else None)
    epoch = _epoch_choice(rng, state.fence_state if state else None)
    if state is None or rng.random() < 0.6:
        floor = state.last_offset if state is not None else 0
        start = max(floor, -1) + 1 + rng.randrange(10)
        batches = _batches_from(rng, start)
    else:
        start = -1
        batches = _batches_from(rng, state.last_offset + 2)
    entry: dict[str, Any] = {
        "partition": key[1],
        "state_epoch": epoch,
        "leader_epoch": leader,
        "start_offset": start,
        "state_batches": _batch_maps(batches),
    }
    choice = rng.random()
    if choice < 0.4:
        entry["delivery_complete_count"] = rng.randrange(1000)
    elif choice < 0.6:
        entry["delivery_complete_count"] = -1
    return _write_outcome(key, entry, state)


def _write_outcome(key: Key, entry: dict[str, Any], state: State | None) -> Planned:
    if state is None:
        return Planned(key, entry, 42, None, {}, False)
    leader, epoch = entry["leader_epoch"], entry["state_epoch"]
    if leader != -1 and state.fence_leader > leader:
        return Planned(key, entry, 74, state, {}, False)
    if epoch != -1 and state.fence_state is not None and state.fence_state > epoch:
        return Planned(key, entry, 124, state, {}, False)
    new = tuple(
        (b["first_offset"], b["last_offset"], b["delivery_state"], b["delivery_count"])
        for b in entry["state_batches"]
    )
    start = entry["start_offset"]
    complete = entry.get("delivery_complete_count", -1)
    after = replace(
        state,
        start_offset=state.start_offset if start == -1 else start,
        state_batches=state.state_batches + new if start == -1 else new,
        delivery_complete_count=state.delivery_complete_count if complete == -1 else complete,
    )
    return Planned(key, entry, 0, after, {}, True)


def plan_read(rng: random.Random, key: Key, state: State | None) -> Planned:
    leader = _epoch_choice(rng, state.fence_leader if state else None)
    return _read_outcome(key, {"partition": key[1], "leader_epoch": leader}, state)


def _read_outcome(key: Key, entry: dict[str, Any], state: State | None) -> Planned:
    if state is None:
        return Planned(key, entry, 42, None, {}, False)
    leader = entry["leader_epoch"]
    if state.fence_leader > leader:
        return Planned(key, entry, 74, state, {}, False)
    answer = {
        "state_epoch": state.state_epoch,
        "start_offset": state.start_offset,
        "state_batches": _batch_maps(state.state_batches),
    }
    if leader in (-1, state.fence_leader):
        return Planned(key, entry, 0, state, answer, False)
    after = replace(state, leader_epoch=leader, fence_leader=leader)
    return Planned(key, entry, 0, after, answer, True)


def plan_read_summary(rng: random.Random, key: Key, state: State | None) -> Planned:
    entry: dict[str, Any] = {"partition": key[1]}
    if rng.random() < 0.5:
        entry["leader_epoch"] = rng.choice((-1, 0, 3))
    return _read_summary_outcome(key, entry, state)


def _read_summary_outcome(key: Key, entry: dict[str, Any], state: State | None) -> Planned:
    if state is None:
        answer = {"state_epoch": 0, "leader_epoch": 0, "start_offset": -1}
        answer["delivery_complete_count"] = -1
    else:
        answer = {
            "state_epoch": state.state_epoch,
            "leader_epoch": state.leader_epoch,
            "start_offset": state.start_offset,
            "delivery_complete_count": state.delivery_complete_count,
        }
    return Planned(key, entry, 0, state, answer, False)


def plan_delete(rng: random.Random, key: Key, state: State | None) -> Planned:
    return _delete_outcome(key, {"partition": key[1]}, state)


_PLANNERS = {
    "initialize": plan_initialize,
    "write": plan_write,
    "read": plan_read,
    "read-summary": plan_read_summary,
    "delete": plan_delete,
}


def _delete_outcome(key: Key, entry: dict[str, Any], state: State | None) -> Planned:
    return Planned(key, entry, 0, None, {}, state is not None)


_OUTCOMES = {
    "initialize": _initialize_outcome,
    "write": _write_outcome,
    "read": _read_outcome,
    "read-summary": _read_summary_outcome,
    "delete": _delete_outcome,
}


def outcome(rpc: str, step: Planned, state: State | None) -> Planned:
    """What ``step``'s entry does to ``state``."""
    return _OUTCOMES[rpc](step.key, step.entry, state)
