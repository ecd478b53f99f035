"""BullMQ's driver (the ``bullmq`` Python package, 3.4): ``Queue.add``, a ``Worker`` with
``concurrency``, and ``worker.on("completed")`` as the completion hook.

The worker emits "completed" after ``moveToCompleted`` has returned (bullmq/worker.py,
``processJob``). Defaults kept: completed jobs stay in Redis (``removeOnComplete`` unset), and
each Queue / Worker talks over its own single connection (plus the worker's blocking one).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bullmq import Job, Queue, Worker

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto


@asynccontextmanager
async def adding(args: _proto.Args) -> AsyncIterator[_proto.Add]:
    queue = Queue(_proto.QUEUE, {"connection": args.url})
    try:

        async def add(session: int, number: int) -> None:
            await queue.add(_proto.TASK, {"session": session, "number": number})

        yield add
    finally:
        await queue.close()


@asynccontextmanager
async def working(args: _proto.Args, tracker: _proto.Tracker) -> AsyncIterator[None]:
    async def noop(job: Job, token: str) -> None:
        await _proto.handle(tracker, job.data["session"], job.data["number"])

    def completed(job: Job, result: Any) -> None:
        tracker.completed()

    # The worker starts its run loop as it is constructed (autorun): wire the hook at once.
    worker = Worker(_proto.QUEUE, noop, {"connection": args.url, "concurrency": args.concurrency})
    worker.on("completed", completed)
    try:
        yield
    finally:
        await worker.close()


if __name__ == "__main__":
    _proto.main(adding, working)
