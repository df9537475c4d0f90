"""Backoff between retries: exponential, capped, with full jitter (client.retry)."""

from __future__ import annotations

import asyncio
import random
import ssl

import aiohttp
import pytest

from client import RetryPolicy, backoff_delay
from client.retry import (
    RETRIABLE_CODES,
    DeadlineExceeded,
    Failure,
    call_with_retries,
    is_retriable_exception,
)
from protocol import errors

POLICY = RetryPolicy(backoff_s=0.05, backoff_max_s=2.0)


class Ceiling(random.Random):
    """An RNG that always draws the top of the range: shows the ceiling itself."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_the_ceiling_doubles_from_the_base_up_to_the_cap():
    ceilings = [backoff_delay(retry, POLICY, Ceiling()) for retry in range(8)]
    assert ceilings == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])


def test_the_cap_holds_for_any_retry_number():
    assert backoff_delay(10**6, POLICY, Ceiling()) == 2.0


def test_full_jitter_draws_anywhere_between_zero_and_the_ceiling():
    rng = random.Random(7)
    delays = [backoff_delay(6, POLICY, rng) for _ in range(2000)]
    assert all(0.0 <= d <= 2.0 for d in delays)
    # Spread over the whole range, not clustered at the ceiling (no "equal jitter").
    assert min(delays) < 0.1
    assert max(delays) > 1.9
    assert 0.9 < sum(delays) / len(delays) < 1.1
    assert len(set(delays)) == len(delays)


def test_a_seeded_rng_gives_the_same_delays():
    first = [backoff_delay(r, POLICY, random.Random(42)) for r in range(10)]
    again = [backoff_delay(r, POLICY, random.Random(42)) for r in range(10)]
    assert first == again
    other = [backoff_delay(r, POLICY, random.Random(43)) for r in range(10)]
    assert first != other


def test_callers_that_fail_together_retry_apart():
    rng = random.Random(1)
    delays = {backoff_delay(3, POLICY, rng) for _ in range(100)}
    assert len(delays) == 100


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"deadline_s": 0}, "deadline_s must be > 0"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"backoff_s": -1}, "retry backoff"),
        ({"backoff_s": 3, "backoff_max_s": 2}, "retry backoff"),
    ],
)
def test_a_retry_policy_that_makes_no_sense_is_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        RetryPolicy(**kwargs)


def test_the_retriable_codes_are_the_persisters():
    assert frozenset({3, 14, 15, 16}) == RETRIABLE_CODES  # docs/semantics.md §12


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(104, "Connection reset by peer"),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        asyncio.TimeoutError(),
        ConnectionRefusedError(),
    ],
)
def test_transport_failures_are_retriable(exc):
    assert is_retriable_exception(exc)


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ClientConnectorCertificateError(None, ssl.SSLCertVerificationError(1, "x")),
        aiohttp.ClientConnectorSSLError(None, ssl.SSLError(1, "wrong version number")),
        ValueError("a bug"),
    ],
)
def test_tls_failures_and_bugs_are_not_retriable(exc):
    assert not is_retriable_exception(exc)


async def test_an_attempt_the_deadline_cuts_tells_the_answer_before_it():
    """A call answered 3 (retriable: the topic may just be late), whose next attempt the
    deadline cuts short, ends with the 3, not with "no answer": the answer says why."""
    answer = Failure(errors.UNKNOWN_TOPIC_OR_PARTITION, "not in the topic catalog", True)
    calls = 0

    async def attempt(_: float) -> Failure:
        nonlocal calls
        calls += 1
        if calls > 1:
            await asyncio.Event().wait()  # no answer: the deadline cuts it
        return answer

    policy = RetryPolicy(deadline_s=0.2, backoff_s=0.0, backoff_max_s=0.0)
    with pytest.raises(DeadlineExceeded) as raised:
        await call_with_retries("a call", attempt, policy, random.Random(1))
    assert calls == 2
    assert isinstance(raised.value.last_error, errors.UnknownTopicOrPartition)
    assert "not in the topic catalog" in str(raised.value)
