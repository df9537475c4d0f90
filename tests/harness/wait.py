"""Waiting for a condition: the one poll loop of the suite.

``wait_until`` asks ``condition`` again and again, pausing a little longer each time (a
few milliseconds at first, at most ``max_pause``), until ``until`` holds for what it
returned; then it returns that value. After ``timeout`` seconds it fails the test with
``what`` (the thing awaited, worded to follow "waited for") and the last value seen. The
timeout is a safety net against a hung test, never a timing assertion: the default is
generous, and a busy machine only makes the wait longer.

``wait_until`` is for coroutines (its condition may be a plain function or return an
awaitable); ``wait_until_blocking`` is the same loop for threads and plain tests.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar, overload

T = TypeVar("T")

# A safety net against a hung test, never a timing assertion.
WAIT_TIMEOUT_S = 120.0
FIRST_PAUSE_S = 0.005
MAX_PAUSE_S = 0.25
GROWTH = 1.5


class WaitTimeout(AssertionError):
    """What was awaited never came; says what, for how long, and what was seen last."""

    def __init__(self, what: str, timeout: float, last: object) -> None:
        shown = repr(last)
        if len(shown) > 3000:
            shown = "..." + shown[-3000:]
        super().__init__(f"waited {timeout:g}s for {what}; last seen: {shown}")


def _truthy(value: object) -> bool:
    return bool(value)


def _pauses(timeout: float, max_pause: float) -> Iterator[float]:
    """The pauses between two tries, growing, until ``timeout`` seconds from now (the
    clock starts here, not at the first pause)."""
    deadline = time.monotonic() + timeout

    def pauses() -> Iterator[float]:
        pause = min(FIRST_PAUSE_S, max_pause)
        while (left := deadline - time.monotonic()) > 0:
            yield min(pause, left)
            pause = min(pause * GROWTH, max_pause)

    return pauses()


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T]],
    what: str,
    *,
    until: Callable[[T], bool] = ...,
    timeout: float = ...,
    max_pause: float = ...,
) -> T: ...


@overload
async def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    until: Callable[[T], bool] = ...,
    timeout: float = ...,
    max_pause: float = ...,
) -> T: ...


async def wait_until(
    condition: Callable[[], Any],
    what: str,
    *,
    until: Callable[[Any], bool] = _truthy,
    timeout: float = WAIT_TIMEOUT_S,
    max_pause: float = MAX_PAUSE_S,
) -> Any:
    """``condition()`` (awaited if it returns an awaitable) until ``until`` holds for its
    value; the value then. Exceptions from ``condition`` end the wait at once."""
    pauses = _pauses(timeout, max_pause)
    while True:
        value: Any = condition()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        pause = next(pauses, None)
        if pause is None:
            raise WaitTimeout(what, timeout, value)
        await asyncio.sleep(pause)


def wait_until_blocking(
    condition: Callable[[], T],
    what: str,
    *,
    until: Callable[[T], bool] = _truthy,
    timeout: float = WAIT_TIMEOUT_S,
    max_pause: float = MAX_PAUSE_S,
) -> T:
    """``wait_until`` for a thread or a test without an event loop: it blocks."""
    pauses = _pauses(timeout, max_pause)
    while True:
        value = condition()
        if until(value):
            return value
        pause = next(pauses, None)
        if pause is None:
            raise WaitTimeout(what, timeout, value)
        time.sleep(pause)
