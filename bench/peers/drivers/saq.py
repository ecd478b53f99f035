"""SAQ's driver (saq 0.26, Redis backend): ``Queue.enqueue``, a ``Worker`` of the given
concurrency, and its ``after_process`` hook as the completion hook.

SAQ calls ``after_process`` after ``job.finish`` has written the result, and also after a
failure or a retry: only jobs whose status is ``complete`` count.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from saq import Queue, Worker
from saq.job import Status

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto


@asynccontextmanager
async def adding(args: _proto.Args) -> AsyncIterator[_proto.Add]:
    queue = Queue.from_url(args.url, name=_proto.QUEUE)
    await queue.connect()
    try:

        async def add(session: int, number: int) -> None:
            # SAQ's default job key is a fresh uuid1: each job is new, as in the other drivers.
            await queue.enqueue(_proto.TASK, session=session, number=number)

        yield add
    finally:
        await queue.disconnect()


@asynccontextmanager
async def working(args: _proto.Args, tracker: _proto.Tracker) -> AsyncIterator[None]:
    queue = Queue.from_url(args.url, name=_proto.QUEUE)
    await queue.connect()

    async def noop(ctx: dict[str, Any], *, session: int, number: int) -> None:
        await _proto.handle(tracker, session, number)

    async def after_process(ctx: dict[str, Any]) -> None:
        job = ctx.get("job")
        if job is not None and job.status == Status.COMPLETE:
            tracker.completed()

    worker = Worker(
        queue,
        functions=[(_proto.TASK, noop)],
        concurrency=args.concurrency,
        after_process=after_process,
    )
    running = asyncio.create_task(worker.start())
    try:
        yield
    finally:
        await worker.stop()
        await running
        await queue.disconnect()


if __name__ == "__main__":
    _proto.main(adding, working)
