"""Server-sent events for one session: ``queue.reset`` (the whole queue) first, then a
``queue.update`` per change, each with the event log's ID so ``Last-Event-ID`` resumes.

A stream also ends, cleanly, when its client falls too far behind (the feed's ``FellBehind``)
or the process shuts down: the client's EventSource reconnects after ``RETRY_MS`` with the
last ID it got, and resumes exactly after it (or gets a reset if the capped log moved on).

Framing: no payload can split a message. The data is JSON whose only possible line breaks are
whitespace inside a caller's raw ``model`` (JSON strings escape theirs); each line goes on a
``data:`` line of its own, which the client joins back with LF (a CR or CRLF in that
whitespace arrives as LF: the same JSON). ``id`` and ``event`` never hold one.

Backpressure: a message goes to the server in pieces of at most ``CHUNK`` characters. Starlette
awaits each ``send``, and uvicorn's ``send`` waits while its transport holds over 64 KiB
(flow control), so a client that does not read stops this generator, and the feed's bounds
take over; what waits in the process per such stream is one message (the one being sent)
and at most 64 KiB + one piece in the transport, whatever the message's size."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from ..core.entry import encode_list
from ..core.events import QueueEvent, QueueReset
from ..storage.feed import StreamEnded
from ..storage.store import TRANSIENT_ERRORS

log = logging.getLogger("prompt_outbox.api")

RETRY_MS = 2000  # how soon EventSource reconnects after the stream ends
KEEPALIVE_POLLS = 15  # quiet polls (about a second each) between keepalive comments

CHUNK = 64 * 1024  # characters per piece handed to the server (see "Backpressure" above)

Item = QueueEvent | QueueReset | None

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the SSE spec's three line endings


def format_item(item: QueueEvent | QueueReset) -> str:
    """One SSE message. Entry JSON is spliced raw, so a caller's ``model`` stays byte for byte
    (but for its line breaks: see the module docstring)."""
    if isinstance(item, QueueReset):
        return message(item.event_id, "queue.reset", encode_list(item.entries))
    entry = item.entry.to_json() if item.entry is not None else "null"
    data = f'{{"kind":{json.dumps(item.kind)},"id":{json.dumps(item.entry_id)},"entry":{entry}}}'
    return message(item.event_id, "queue.update", data)


def message(event_id: str, event: str, data: str) -> str:
    """An SSE message whose framing no value can break: ``data`` is split into one ``data:``
    line per line it holds; an ``id`` or ``event`` holding a line break is a ValueError (they
    come from the event log and the code, never from a client: one would be a bug)."""
    for name, value in (("id", event_id), ("event", event)):
        if "\n" in value or "\r" in value:
            raise ValueError(f"an SSE {name} must not hold a line break: {value!r}")
    if "\n" in data or "\r" in data:
        lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    else:
        lines = f"data: {data}\n"
    return f"id: {event_id}\nevent: {event}\n{lines}\n"


def pieces(text: str) -> Iterator[str]:
    """``text`` in slices of at most CHUNK characters (so the server's flow control applies
    within a large message, not only between messages)."""
    if len(text) <= CHUNK:
        yield text
        return
    for start in range(0, len(text), CHUNK):
        yield text[start : start + CHUNK]


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
        # Held only while it is sent: a reset is the whole queue, and a stream lives for hours.
        message, first = format_item(first), None
        for piece in pieces(message):
            yield piece
        message = ""
    quiet = 0
    try:
        async for item in items:
            if item is not None:
                quiet = 0
                for piece in pieces(format_item(item)):
                    yield piece
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
