"""A writer at full speed: random valid RPCs over the model's keys, in both encodings,
from several concurrent workers, each answer checked against the model.

Two requests in flight never share a key (the order of two concurrent requests on one key
is not known to the client, so their outcome would not be either). A request whose answer
never comes (the daemon was killed under it) leaves its keys held until the model is
reconciled with what a restarted daemon shows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.harness import FORMATS, MEDIA, TOPIC, TOPIC_RFC4122, decode, encode, wait_until
from tests.reliability.model import Key, Model, Request

# A safety net against a hung test, never a timing assertion.
REQUEST_TIMEOUT_S = 120.0
RPC_WEIGHTS = {"write": 45, "initialize": 20, "read": 15, "read-summary": 12, "delete": 3}


@dataclass
class Traffic:
    model: Model
    rng: random.Random
    faults: bool = False  # entries may answer 15
    free: set[Key] = field(default_factory=set)
    stopped: bool = False
    acknowledged: int = 0  # requests answered 200
    entries_acknowledged: int = 0  # their entries that succeeded
    entries_unavailable: int = 0  # their entries answered 15
    unanswered: int = 0  # requests whose answer never came
    on_acknowledged: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.release_all()

    def release_all(self) -> None:
        """Every key free again (after the model was reconciled)."""
        self.free = set(self.model.keys)

    def _pick(self) -> Request | None:
        rng = self.rng
        rpc = rng.choices(list(RPC_WEIGHTS), weights=list(RPC_WEIGHTS.values()))[0]
        groups = sorted({g for g, _ in self.free})
        if not groups:
            return None
        group = rng.choice(groups)
        candidates = sorted(k for k in self.free if k[0] == group)
        if rpc in ("write", "read"):
            # Mostly keys that have state, so most entries do something.
            with_state = [k for k in candidates if self.model.exact(k) is not None]
            if with_state and rng.random() < 0.9:
                candidates = with_state
        count = min(len(candidates), rng.choice((1, 1, 2, 3, 4)))
        keys = rng.sample(candidates, count)
        return self.model.plan(rng, rpc, keys)

    async def send(
        self, session: aiohttp.ClientSession, url: str, request: Request
    ) -> tuple[int, Any]:
        rng = self.rng
        fmt = rng.choice(FORMATS)
        headers = {"Content-Type": MEDIA[fmt]}
        if rng.random() < 0.2:
            headers["Accept"] = MEDIA[rng.choice(FORMATS)]
        async with session.post(
            f"{url}/v1/share-group-state/{request.rpc}",
            data=encode(request.body(), fmt),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as response:
            raw = await response.read()
            return response.status, decode(raw, response.content_type)

    async def worker(self, session: aiohttp.ClientSession, url: str) -> None:
        """Send requests until stopped or until the daemon stops answering."""
        while True:
            # True once stopped; None while requests in flight hold every key.
            request = await wait_until(
                lambda: self.stopped or self._pick(),
                "a key no request in flight holds",
                max_pause=0.001,
            )
            if request is True:
                return
            keys = request.touched()
            self.free -= keys
            try:
                status, answer = await self.send(session, url, request)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                self.model.lost(request)
                self.unanswered += 1
                return
            assert status == 200, (status, answer, request.body())
            unavailable = self.model.settle(request, answer, faults=self.faults)
            self.free |= keys
            self.acknowledged += 1
            self.entries_unavailable += unavailable
            self.entries_acknowledged += len(request.planned) - unavailable
            if self.on_acknowledged is not None:
                self.on_acknowledged()

    async def run(self, url: str, workers: int) -> None:
        """``workers`` concurrent workers, each on its own connection."""

        async def one() -> None:
            async with aiohttp.ClientSession() as session:
                await self.worker(session, url)

        await asyncio.gather(*(one() for _ in range(workers)))


async def admin_states(
    session: aiohttp.ClientSession, url: str, model: Model, rng: random.Random
) -> dict[Key, dict[str, Any] | None]:
    """GET /v1/admin/state of every key (either spelling of the topic, either format)."""
    shown: dict[Key, dict[str, Any] | None] = {}
    for key in model.keys:
        fmt = rng.choice(FORMATS)
        params = {
            "group_id": key[0],
            "topic_id": rng.choice((TOPIC, TOPIC_RFC4122)),
            "partition": str(key[1]),
        }
        async with session.get(
            f"{url}/v1/admin/state",
            params=params,
            headers={"Accept": MEDIA[fmt]},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as response:
            raw = await response.read()
            body = decode(raw, response.content_type)
            if response.status == 404:
                assert body["error_code"] == 3, body
                shown[key] = None
                continue
            assert response.status == 200, (response.status, body)
            assert response.content_type == MEDIA[fmt]
            shown[key] = body
    return shown


async def check_exact(
    session: aiohttp.ClientSession, url: str, model: Model, rng: random.Random
) -> None:
    """Every key shows exactly the state the model holds (nothing lost, nothing extra)."""
    wrong = []
    for key, shown in (await admin_states(session, url, model, rng)).items():
        if not model.reconcile(key, shown):
            wrong.append(f"{key}: {shown} not in {model.possible[key]}")
    assert not wrong, "\n".join(wrong)


async def resumed(traffic: Traffic, url: str, requests: int = 30) -> None:
    """With the fault cleared, service is back: a burst of requests with no 15 at all."""
    target = traffic.acknowledged + requests
    done = asyncio.Event()

    def count() -> None:
        if traffic.acknowledged >= target:
            traffic.stopped = True
            done.set()

    traffic.faults, traffic.stopped, traffic.on_acknowledged = False, False, count
    await traffic.run(url, 2)
    assert done.is_set()
    traffic.faults = True
