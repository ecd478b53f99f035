"""Work that must outlive whoever started it (a delivery and its bookkeeping), and joining it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def never() -> bool:
    """The default ``stopping`` of a loop that runs until it is done."""
    return False


class Detached:
    """Tasks started here run to the end even if their starter is cancelled; the set keeps a
    reference to each (asyncio holds tasks weakly) until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


async def settled(call: Awaitable[T], seconds: float) -> tuple[T | None, BaseException | None]:
    """Await a call to a deliverer or an agent within ``seconds``: what it returned, or what
    it raised (a timeout among them)."""
    try:
        async with asyncio.timeout(seconds):
            return await call, None
    except Exception as exc:
        return None, exc


async def join(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Wait for every task, even if the caller is cancelled meanwhile; a cancellation that
    arrived while waiting is raised once they are all done, never swallowed."""
    pending = {t for t in tasks if not t.done()}
    cancelled = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
