"""prompt-outbox's driver: a job is an accepted prompt, the worker is ``Outbox.running``.

Runs in the project's own ``.venv``. Every session lives in one workspace; the completion hook
is OnDelivered (``set_on_delivered``), which fires after the claim is written.
"""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from prompt_outbox import Entry, Outbox, Tunables
from prompt_outbox.storage.connect import connect

sys.path.append(str(Path(__file__).resolve().parent))  # last: shadows no installed package
import _proto

WORKSPACE = "bench"


def tunables(args: _proto.Args) -> Tunables:
    # cap: every job of a session is queued before the worker starts.
    cap = max(25, math.ceil(args.jobs / args.sessions))
    return Tunables(
        concurrency=args.concurrency,
        cap=cap,
        workspace_cap=max(args.jobs, 10_000),  # every job in one workspace, queued at once
        accept_durability=args.durability,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def outbox_of(args: _proto.Args) -> AsyncIterator[Outbox]:
    client = connect(args.url)
    outbox = Outbox(client, tunables(args))
    try:
        await outbox.check_durability()
        yield outbox
    finally:
        await outbox.aclose()
        await client.aclose()


@asynccontextmanager
async def adding(args: _proto.Args) -> AsyncIterator[_proto.Add]:
    async with outbox_of(args) as outbox:

        async def add(session: int, number: int) -> None:
            name = _proto.session_name(session)
            await outbox.accept(WORKSPACE, name, "bench", f"{name}-{number}", str(number))

        yield add


@asynccontextmanager
async def working(args: _proto.Args, tracker: _proto.Tracker) -> AsyncIterator[None]:
    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        await _proto.handle(tracker, int(ses[1:]), int(entry.text))

    async def delivered(ws: str, ses: str, entry: Entry) -> None:
        tracker.completed()

    async with outbox_of(args) as outbox:
        outbox.set_on_delivered(delivered)
        async with outbox.running(deliver):
            yield


if __name__ == "__main__":
    _proto.main(adding, working)
