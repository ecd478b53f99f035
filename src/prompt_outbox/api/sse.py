"""Server-sent events for one session: ``queue.reset`` (the whole queue) first, then a
``queue.update`` per change, each with the event log's ID so ``Last-Event-ID`` resumes.

A stream also ends, cleanly, when its client falls too far behind (the feed's ``FellBehind``)
or the process shuts down: the client's EventSource reconnects after ``RETRY_MS`` with the
last ID it got, and resumes exactly after it (or gets a reset if the capped log moved on)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from ..core.entry import encode_list
from ..core.events import QueueEvent, QueueReset
from ..storage.feed import StreamEnded
from ..storage.store import TRANSIENT_ERRORS

log = logging.getLogger("prompt_outbox.api")

RETRY_MS = 2000  # how soon EventSource reconnects after the stream ends
KEEPALIVE_POLLS = 15  # quiet polls (about a second each) between keepalive comments

Item = QueueEvent | QueueReset | None


def format_item(item: QueueEvent | QueueReset) -> str:
    """One SSE message. Entry JSON is spliced raw, so a caller's ``model`` stays byte for byte."""
    if isinstance(item, QueueReset):
        return f"id: {item.event_id}\nevent: queue.reset\ndata: {encode_list(item.entries)}\n\n"
    entry = item.entry.to_json() if item.entry is not None else "null"
    data = f'{{"kind":{json.dumps(item.kind)},"id":{json.dumps(item.entry_id)},"entry":{entry}}}'
    return f"id: {item.event_id}\nevent: queue.update\ndata: {data}\n\n"


async def event_stream(
    first: QueueEvent | QueueReset | None,
    items: AsyncIterator[Item],
    disconnected: Callable[[], Awaitable[bool]],
) -> AsyncIterator[str]:
    """The response body: ``first`` (already read, so a dead Valkey was a 503), then the rest
    until the client leaves. A Valkey error, a client too slow to keep up, or a shutdown ends
    the stream; the client resumes by its ID."""
    yield f"retry: {RETRY_MS}\n\n"
    if first is not None:
        yield format_item(first)
    quiet = 0
    try:
        async for item in items:
            if item is not None:
                quiet = 0
                yield format_item(item)
                continue
            if await disconnected():
                return
            quiet += 1
            if quiet % KEEPALIVE_POLLS == 0:
                yield ": keepalive\n\n"
    except TRANSIENT_ERRORS as exc:
        log.warning("event stream ended: Valkey is unreachable: %s", exc)
    except StreamEnded as exc:  # a slow client frees its buffer; it resumes where it was
        log.info("event stream ended: %s", exc)
    finally:
        await items.aclose()  # type: ignore[attr-defined]
