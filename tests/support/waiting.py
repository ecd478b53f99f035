"""Waiting in tests: poll a condition until it holds, or give up (or fail) after a bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def within(check: Callable[[], bool], seconds: float, interval: float = 0.05) -> bool:
    """Poll a plain condition until it holds (True), or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


async def holds(value: bool) -> bool:
    """Wrap a plain condition for ``eventually``: ``eventually(lambda: holds(x == y))``."""
    return value


async def eventually(
    predicate: Callable[[], Awaitable[T]], within: float = 5.0, interval: float = 0.01
) -> T:
    """Poll an async predicate until it is truthy (returns its value); fail after ``within``."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last value {value!r})")
        await asyncio.sleep(interval)
