"""Work that must outlive whoever started it (a delivery and its bookkeeping), and joining it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


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

    def __len__(self) -> int:
        return len(self._tasks)


async def join(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Wait for every task, even if the caller is cancelled again meanwhile."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            continue
