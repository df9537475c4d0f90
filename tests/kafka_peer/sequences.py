"""Random share-group state RPC sequences, as a share-partition leader and its mistakes
would send them, for the differential test: one sequence per seed, reproducible from it.

A sequence works on a handful of share-partitions of one group, over two real topics
(their ids come from the broker) and one topic the broker does not know. Each step is one
RPC over one to four distinct share-partitions. ``Hints`` follows what the answers say
(epochs, start offset, where the batches end) so that the values land near the edges
that matter rather than anywhere:

* initialize at the current state epoch (re-initialize), above it, below it (fenced),
  or -1; start offsets -1, 0 or near the current one;
* reads at the current leader epoch, the next (a new leader), a stale one, or -1;
* writes with stale, current, future and -1 state and leader epochs; start offsets that
  stay (-1), move forward, move backward; batches that overlap, touch with the same or
  another delivery state and count (partial coalescing), leave gaps, start below the
  start offset; delivery-complete counts -1 and small;
* share-partitions never initialized, deleted ones, a partition past the topic's count,
  a topic the broker does not know, versions 0 and 1;
* rarely, an entry that fails sharecoord's edge checks (docs/semantics.md §A, "entry
  checks"): a documented difference, after which the runner deletes the key on both
  sides to bring them back together.

No request names one share-partition twice: Kafka collapses such entries and sharecoord
runs each (§A, "result order"), which ``test_duplicate_entries_differ_as_documented``
checks on its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

RPC_WEIGHTS = {"write": 40, "read": 18, "initialize": 14, "read-summary": 16, "delete": 6}
DELIVERY_STATES = (0, 1, 2, 4)
EDGE_RATE = 0.02
MINUS_ONE_RATE = 0.03


@dataclass(frozen=True)
class Topics:
    """The topics of a run: two the broker knows (id, partition count), one it does not."""

    known: tuple[tuple[str, int], ...]
    unknown: str


@dataclass
class Hint:
    """What the answers said about one share-partition, to aim the next values."""

    exists: bool = False
    state_epoch: int = 0
    leader_epoch: int = 0
    start_offset: int = 0
    end: int = 0  # one past the highest offset written so far


@dataclass
class Step:
    rpc: str
    version: int
    body: dict[str, Any]
    edge: bool  # some entry fails sharecoord's edge checks on purpose

    def keys(self) -> list[tuple[str, int]]:
        return [
            (topic["topic_id"], entry["partition"])
            for topic in self.body["topics"]
            for entry in topic["partitions"]
        ]


@dataclass
class Sequence:
    """The steps of one seed, produced one at a time so each can follow the answers."""

    seed: int
    topics: Topics
    rng: random.Random = field(init=False)
    group: str = field(init=False)
    keys: list[tuple[str, int]] = field(init=False)
    hints: dict[tuple[str, int], Hint] = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.group = f"diff-{self.seed}"
        (t1, count1), (t2, _) = self.topics.known
        self.keys = [(t1, p) for p in range(min(count1, 5))] + [(t2, p) for p in range(2)]
        self.keys += [(t1, count1), (self.topics.unknown, 0)]  # both answer 3
        self.hints = {key: Hint() for key in self.keys}

    def next_step(self) -> Step:
        rng = self.rng
        rpc = rng.choices(list(RPC_WEIGHTS), weights=list(RPC_WEIGHTS.values()))[0]
        # Mostly the first keys, so that one share-partition sees many writes in a row.
        weights = [8, 6, 4, 3, 2, 2, 2, 1, 1][: len(self.keys)]
        count = rng.choice([1, 1, 1, 2, 2, 3, 4])
        chosen: list[tuple[str, int]] = []
        while len(chosen) < count:
            key = rng.choices(self.keys, weights=weights)[0]
            if key not in chosen:
                chosen.append(key)
        version = 0 if rpc in ("write", "read-summary") and rng.random() < 0.25 else 1
        if rpc not in ("write", "read-summary"):
            version = 0
        edge = False
        topics: dict[str, list[dict[str, Any]]] = {}
        for key in chosen:
            entry = getattr(self, "_" + rpc.replace("-", "_"))(key)
            if rpc in ("write", "initialize", "read") and rng.random() < EDGE_RATE:
                entry = self._break(entry)
                edge = True
            topics.setdefault(key[0], []).append(entry)
        body = {
            "group_id": self.group,
            "topics": [{"topic_id": t, "partitions": entries} for t, entries in topics.items()],
        }
        return Step(rpc, version, body, edge)

    # --- one entry per RPC -----------------------------------------------------------------

    def _epoch_near(self, current: int) -> int:
        """Mostly the current epoch; stale, future, and now and then -1 (which Kafka 4.4
        refuses and sharecoord takes: docs/semantics.md §A.2)."""
        choice = self.rng.choice([current, current, current, current + 1, current - 1])
        return -1 if self.rng.random() < MINUS_ONE_RATE else max(choice, 0)

    def _initialize(self, key: tuple[str, int]) -> dict[str, Any]:
        h = self.hints[key]
        start = self.rng.choice([-1, 0, h.start_offset, h.start_offset + 7, h.end])
        epoch = self.rng.choice([h.state_epoch, h.state_epoch + 1, h.state_epoch - 1])
        epoch = -1 if self.rng.random() < MINUS_ONE_RATE else max(epoch, 0)
        return {"partition": key[1], "state_epoch": epoch, "start_offset": start}

    def _read(self, key: tuple[str, int]) -> dict[str, Any]:
        h = self.hints[key]
        epoch = self.rng.choice([h.leader_epoch, h.leader_epoch + 1, h.leader_epoch - 1])
        epoch = -1 if self.rng.random() < MINUS_ONE_RATE else max(epoch, 0)
        return {"partition": key[1], "leader_epoch": epoch}

    def _read_summary(self, key: tuple[str, int]) -> dict[str, Any]:
        return {"partition": key[1], "leader_epoch": self.rng.choice([-1, 0, 3])}

    def _delete(self, key: tuple[str, int]) -> dict[str, Any]:
        return {"partition": key[1]}

    def _write(self, key: tuple[str, int]) -> dict[str, Any]:
        rng, h = self.rng, self.hints[key]
        base = max(h.start_offset, 0)
        start = rng.choice(
            [-1, -1, h.start_offset, base + rng.randint(1, 12), max(base - rng.randint(1, 8), 0)]
        )
        return {
            "partition": key[1],
            "state_epoch": self._epoch_near(h.state_epoch),
            "leader_epoch": self._epoch_near(h.leader_epoch),
            "start_offset": start,
            "delivery_complete_count": rng.choice([-1, -1, 0, rng.randint(1, 20)]),
            "state_batches": self._batches(base, h.end),
        }

    def _batches(self, start: int, end: int) -> list[dict[str, int]]:
        """Zero to four batches around [start, end + 20]: overlapping, touching and
        separate, sometimes sharing delivery state and count with a neighbour."""
        rng = self.rng
        batches: list[dict[str, int]] = []
        cursor = max(start - rng.randint(0, 4), 0)
        for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4])):
            if batches and rng.random() < 0.5:
                prev = batches[-1]
                shape = rng.choice(["touch", "overlap", "inside", "gap"])
                if shape == "touch":
                    first = prev["last_offset"] + 1
                elif shape == "overlap":
                    first = max(prev["first_offset"], prev["last_offset"] - rng.randint(0, 3))
                elif shape == "inside":
                    first = prev["first_offset"] + rng.randint(0, 2)
                else:
                    first = prev["last_offset"] + 2 + rng.randint(0, 3)
            else:
                first = cursor + rng.randint(0, max(end - cursor, 0) + 10)
            last = first + rng.randint(0, 9)
            if batches and rng.random() < 0.4:  # same info as the neighbour
                state, count = batches[-1]["delivery_state"], batches[-1]["delivery_count"]
            else:
                state, count = rng.choice(DELIVERY_STATES), rng.randint(0, 5)
            batches.append(
                {
                    "first_offset": first,
                    "last_offset": last,
                    "delivery_state": state,
                    "delivery_count": count,
                }
            )
            cursor = last + 1
        return batches

    def _break(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The entry with one value sharecoord's edge checks refuse and Kafka takes."""
        entry = dict(entry)
        epochs = ("state_epoch", "leader_epoch", "start_offset")
        choices = [name for name in epochs if name in entry]
        if entry.get("state_batches"):
            choices += ["delivery_state", "delivery_count", "inverted"]
        if "delivery_complete_count" in entry:
            choices.append("delivery_complete_count")
        what = self.rng.choice(choices)
        if what in ("delivery_state", "delivery_count", "inverted"):
            batches = [dict(b) for b in entry["state_batches"]]
            target = batches[self.rng.randrange(len(batches))]
            if what == "delivery_state":
                target["delivery_state"] = 3
            elif what == "delivery_count":
                target["delivery_count"] = -1
            else:
                target["first_offset"], target["last_offset"] = (
                    target["last_offset"] + 1,
                    target["first_offset"],
                )
            entry["state_batches"] = batches
        else:
            entry[what] = -2 - self.rng.randint(0, 3)
        return entry

    # --- following the answers -------------------------------------------------------------

    def observe(self, step: Step, answer: dict[str, Any]) -> None:
        """Update the hints from the (agreed) answer to ``step``."""
        entries = {
            (topic["topic_id"], entry["partition"]): entry
            for topic in step.body["topics"]
            for entry in topic["partitions"]
        }
        for topic in answer["results"]:
            for result in topic["partitions"]:
                key = (topic["topic_id"], result["partition"])
                if key not in self.hints or result["error_code"] != 0:
                    continue
                self._learn(step.rpc, self.hints[key], entries[key], result)

    def _learn(self, rpc: str, h: Hint, entry: dict[str, Any], result: dict[str, Any]) -> None:
        if rpc == "initialize":
            h.exists = True
            h.state_epoch = max(entry["state_epoch"], h.state_epoch)
            h.start_offset = max(entry["start_offset"], 0)
        elif rpc == "delete":
            self.hints[next(k for k, v in self.hints.items() if v is h)] = Hint()
        elif rpc == "read":
            h.state_epoch = result["state_epoch"]
            h.start_offset = max(result["start_offset"], 0)
            h.leader_epoch = max(h.leader_epoch, entry["leader_epoch"])
            for batch in result["state_batches"]:
                h.end = max(h.end, batch["last_offset"] + 1)
        elif rpc == "write":
            if entry["start_offset"] >= 0:
                h.start_offset = entry["start_offset"]
            for batch in entry["state_batches"]:
                h.end = max(h.end, batch["last_offset"] + 1)
        elif rpc == "read-summary" and result.get("start_offset", -1) >= 0:
            h.start_offset = result["start_offset"]
            h.state_epoch = result["state_epoch"]

    def forget(self, key: tuple[str, int]) -> None:
        """The key was deleted on both sides to bring them together again."""
        self.hints[key] = Hint()
