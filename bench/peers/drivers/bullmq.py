"""BullMQ's driver (the ``bullmq`` Python package, 3.4): ``Queue.add``, a ``Worker`` with
``concurrency``, and ``worker.on("completed")`` as the completion hook.

The worker emits "completed" after ``moveToCompleted`` has returned (bullmq/worker.py,
``processJob``). Defaults kept: completed jobs stay in Redis (``removeOnComplete`` unset), and
each Queue / Worker talks over its own single connection (plus the worker's blocking one).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bullmq import Job, Queue, Worker

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto


async def enqueue(args: _proto.Args) -> None:
    queue = Queue(_proto.QUEUE, {"connection": args.url})
    try:

        async def add(session: int, number: int) -> None:
            await queue.add(_proto.TASK, {"session": session, "number": number})

        await _proto.enqueue_all(args, add)
    finally:
        await queue.close()


async def work(args: _proto.Args) -> None:
    tracker = _proto.Tracker(args.jobs)

    async def noop(job: Job, token: str) -> None:
        await _proto.handle(tracker, job.data["session"], job.data["number"])

    def completed(job: Job, result: Any) -> None:
        tracker.completed()

    # The worker starts its run loop as it is constructed (autorun): wire the hook at once.
    worker = Worker(_proto.QUEUE, noop, {"connection": args.url, "concurrency": args.concurrency})
    worker.on("completed", completed)
    finished = await tracker.wait(args.timeout)
    tracker.report(timed_out=not finished)
    await worker.close()


if __name__ == "__main__":
    _proto.main(enqueue, work)
