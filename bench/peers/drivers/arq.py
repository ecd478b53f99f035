"""arq's driver (arq 0.28, redis-py 5): ``enqueue_job``, a ``Worker`` with ``max_jobs``, and
``after_job_end`` as the completion hook.

arq calls ``after_job_end`` once the result is recorded, for failed and retried jobs too: the
handler marks the job IDs it ran to the end, and only those count. The worker polls its queue
every ``poll_delay`` (0.5 s, its default, set here explicitly); other defaults kept (pickle,
results kept an hour, ``max_tries`` 5).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from arq import Worker, create_pool
from arq.connections import RedisSettings
from arq.worker import func

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto

POLL_DELAY = 0.5


@asynccontextmanager
async def adding(args: _proto.Args) -> AsyncIterator[_proto.Add]:
    pool = await create_pool(RedisSettings.from_dsn(args.url), default_queue_name=_proto.QUEUE)
    try:

        async def add(session: int, number: int) -> None:
            await pool.enqueue_job(_proto.TASK, session, number)

        yield add
    finally:
        await pool.aclose()


@asynccontextmanager
async def working(args: _proto.Args, tracker: _proto.Tracker) -> AsyncIterator[None]:
    ran: set[str] = set()

    async def noop(ctx: dict[str, Any], session: int, number: int) -> None:
        await _proto.handle(tracker, session, number)
        ran.add(ctx["job_id"])

    async def after_job_end(ctx: dict[str, Any]) -> None:
        if ctx["job_id"] in ran:
            tracker.completed()

    worker = Worker(
        functions=[func(noop, name=_proto.TASK)],
        queue_name=_proto.QUEUE,
        redis_settings=RedisSettings.from_dsn(args.url),
        max_jobs=args.concurrency,
        poll_delay=POLL_DELAY,
        after_job_end=after_job_end,
        handle_signals=False,
    )
    running = asyncio.create_task(worker.async_run())
    try:
        yield
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await worker.close()


if __name__ == "__main__":
    _proto.main(adding, working)
