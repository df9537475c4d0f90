"""When the client retries, how long it waits, and what an attempt that failed looks like.

The persister (client side) treats 14, 15, 16 and 3 as retriable (docs/semantics.md §12), and so do
we; so are transport failures (connection refused or reset, the server disconnecting,
a request timing out, HTTP 5xx). Everything else is final at once. The wait between
two attempts is exponential backoff with full jitter (AWS Architecture Blog,
"Exponential Backoff And Jitter"): ``uniform(0, min(max, base * 2**retry))``, which
spreads the retries of many callers that failed together.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp

from protocol import errors

# docs/semantics.md §12: the codes Kafka's persister retries (after re-discovering the coordinator).
RETRIABLE_CODES = frozenset(
    {
        errors.UNKNOWN_TOPIC_OR_PARTITION,
        errors.COORDINATOR_LOAD_IN_PROGRESS,
        errors.COORDINATOR_NOT_AVAILABLE,
        errors.NOT_COORDINATOR,
    }
)

# 2**62 seconds is past any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 62


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call retries.

    ``deadline_s`` bounds a whole call, retries included; ``max_retries`` (None: no
    bound but the deadline) bounds how many times failed entries are sent again.
    """

    deadline_s: float = 60.0
    max_retries: int | None = None
    backoff_s: float = 0.05
    backoff_max_s: float = 2.0

    def __post_init__(self) -> None:
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0 or None, got {self.max_retries}")
        if self.backoff_s < 0 or self.backoff_max_s < self.backoff_s:
            raise ValueError(
                "retry backoff must satisfy 0 <= backoff <= backoff max, got "
                f"{self.backoff_s} and {self.backoff_max_s}"
            )


def backoff_delay(retry: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first): full jitter,
    uniform in ``[0, min(backoff_max_s, backoff_s * 2**retry)]``."""
    ceiling = min(policy.backoff_max_s, policy.backoff_s * 2.0 ** min(retry, _MAX_EXPONENT))
    return rng.uniform(0.0, ceiling)


@dataclass(frozen=True)
class Failure:
    """An attempt that produced no result from the coordinator for an entry: the
    transport failed, or the whole request was refused. ``code`` is the Kafka code the
    entry ends with if nothing better comes; ``cause`` the exception behind it."""

    code: int
    message: str
    retriable: bool
    cause: BaseException | None = None
    # The deadline cut the attempt: no answer came, which says less than an earlier one.
    unanswered: bool = False

    def error(self) -> errors.ShareCoordinatorError:
        """The typed Kafka error to raise for this failure."""
        exc = errors.for_code(self.code)(self.message)
        exc.__cause__ = self.cause
        return exc


class DeadlineExceeded(TimeoutError):
    """A call did not succeed within its deadline; ``last_error`` is what the last
    answered attempt ended with (the last attempt's own when none was answered, or
    when it failed without the deadline cutting it). A write that timed out may or may
    not have been applied."""

    def __init__(self, what: str, deadline_s: float, attempts: int, last_error: BaseException):
        self.deadline_s = deadline_s
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(
            f"{what} did not succeed within its deadline of {deadline_s:g}s "
            f"({attempts} attempt{'s' if attempts != 1 else ''}); last error: {last_error}"
        )


def is_retriable_exception(exc: BaseException) -> bool:
    """Transport failures worth another attempt: refused, reset, disconnected, timed out.

    TLS failures are not: a certificate that does not verify, or a server that does not
    speak TLS, gives the same answer next time.
    """
    if isinstance(exc, aiohttp.ClientSSLError):
        return False
    return isinstance(
        exc,
        (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError),
    )


def transport_failure(url: str, exc: BaseException) -> Failure:
    """The failure of an entry whose request to ``url`` raised the retriable ``exc``;
    it ends as 15 COORDINATOR_NOT_AVAILABLE if no later attempt succeeds."""
    what = type(exc).__name__
    detail = str(exc)
    message = f"request to {url} failed: {what}" + (f": {detail}" if detail else "")
    return Failure(errors.COORDINATOR_NOT_AVAILABLE, message, True, exc)


T = TypeVar("T")


async def call_with_retries(
    what: str,
    attempt: Callable[[float], Awaitable[T | Failure]],
    policy: RetryPolicy,
    rng: random.Random,
) -> T:
    """Run ``attempt(seconds left)`` until it returns something other than a
    ``Failure``, retrying retriable failures with backoff within ``policy``.

    A final failure raises its typed Kafka error; running out of time raises
    ``DeadlineExceeded``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.deadline_s
    attempts = 0
    answered: Failure | None = None  # the last failure an answer gave
    while True:
        attempts += 1
        remaining = deadline - loop.time()
        try:
            outcome = await asyncio.wait_for(attempt(remaining), max(remaining, 0.0))
        except asyncio.TimeoutError:
            outcome = Failure(
                errors.COORDINATOR_NOT_AVAILABLE,
                "no answer within the deadline",
                True,
                unanswered=True,
            )
        if not isinstance(outcome, Failure):
            return outcome
        if not outcome.unanswered:
            answered = outcome
        if not outcome.retriable or (
            policy.max_retries is not None and attempts > policy.max_retries
        ):
            raise outcome.error()
        delay = backoff_delay(attempts - 1, policy, rng)
        if loop.time() + delay >= deadline:
            # An attempt the deadline cut says less than the answer before it (say, 3:
            # the topic is not in the catalog yet), so that one is the error told.
            last = (answered if outcome.unanswered and answered else outcome).error()
            raise DeadlineExceeded(what, policy.deadline_s, attempts, last) from last
        await asyncio.sleep(delay)
