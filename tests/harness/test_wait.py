"""wait_until: returns the value that passed, fails with what was awaited and the last
value seen, backs off between tries, and stops at the first error."""

from __future__ import annotations

import itertools

import pytest

from tests.harness.wait import MAX_PAUSE_S, WaitTimeout, _pauses, wait_until, wait_until_blocking


async def test_it_returns_the_first_value_that_passes() -> None:
    counter = itertools.count()
    assert await wait_until(lambda: next(counter), "three tries", until=lambda n: n >= 3) == 3


async def test_an_async_condition_is_awaited() -> None:
    counter = itertools.count()

    async def tries() -> int:
        return next(counter)

    assert await wait_until(tries, "a truthy try") == 1


async def test_it_fails_with_what_it_awaited_and_what_it_saw_last() -> None:
    with pytest.raises(WaitTimeout) as info:
        await wait_until(
            lambda: "loading", "the daemon to be ready", until=lambda s: s == "ready", timeout=0.05
        )
    assert isinstance(info.value, AssertionError)  # a failed test, not an error
    assert str(info.value) == "waited 0.05s for the daemon to be ready; last seen: 'loading'"


def test_the_blocking_face_waits_the_same_way() -> None:
    counter = itertools.count()
    assert wait_until_blocking(lambda: next(counter), "two tries", until=lambda n: n == 2) == 2
    with pytest.raises(WaitTimeout, match="for nothing"):
        wait_until_blocking(lambda: False, "nothing", timeout=0.05)


async def test_an_error_of_the_condition_ends_the_wait_at_once() -> None:
    def broken() -> bool:
        raise RuntimeError("the daemon exited")

    with pytest.raises(RuntimeError, match="the daemon exited"):
        await wait_until(broken, "anything")


def test_the_pauses_grow_to_the_cap_and_end_at_the_timeout() -> None:
    pauses = list(itertools.islice(_pauses(60, MAX_PAUSE_S), 30))
    assert pauses[0] < pauses[1] < pauses[2]
    assert max(pauses) == MAX_PAUSE_S
    assert list(_pauses(0, MAX_PAUSE_S)) == []
