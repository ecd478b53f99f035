"""streaq's driver (streaq 7.2, coredis): ``task.enqueue``, ``Worker(concurrency=...)``
with ``run_async``, and a completion hook on ``finish_task``.

streaq has no after-job hook: its middleware wraps only the task call, which returns before
the result is written. So the worker here overrides ``Worker.finish_task`` (the method that
acknowledges the stream entry and stores the result, in one pipeline) and counts after it
returns, for finished, successful tasks only. Defaults kept otherwise (pickle, results kept
5 minutes, a log line per task at INFO, which no handler prints).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from streaq import Worker

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto


class HookedWorker(Worker[Any]):
    """A streaq Worker that reports each task it has finished successfully."""

    tracker: _proto.Tracker | None = None

    async def finish_task(self, msg: Any, **kwargs: Any) -> None:
        # streaq 7.2 passes everything but ``msg`` by keyword (worker.py, ``run_task``).
        await super().finish_task(msg, **kwargs)
        if kwargs["finish"] and kwargs["success"] and self.tracker is not None:
            self.tracker.completed()


def worker_for(args: _proto.Args) -> HookedWorker:
    # handle_signals=False: the harness stops the worker by cancelling it, not by a signal.
    return HookedWorker(
        redis_url=args.url,
        queue_name=_proto.QUEUE,
        concurrency=args.concurrency,
        handle_signals=False,
    )


@asynccontextmanager
async def adding(args: _proto.Args) -> AsyncIterator[_proto.Add]:
    # A Worker is also streaq's client: this one only enqueues (it never runs).
    worker = worker_for(args)

    @worker.task(name=_proto.TASK)
    async def noop(session: int, number: int) -> None:
        return None

    async with worker:

        async def add(session: int, number: int) -> None:
            await noop.enqueue(session, number)

        yield add


@asynccontextmanager
async def working(args: _proto.Args, tracker: _proto.Tracker) -> AsyncIterator[None]:
    worker = worker_for(args)
    worker.tracker = tracker

    @worker.task(name=_proto.TASK)
    async def noop(session: int, number: int) -> None:
        await _proto.handle(tracker, session, number)

    running = asyncio.create_task(worker.run_async())
    try:
        yield
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


if __name__ == "__main__":
    _proto.main(adding, working)
