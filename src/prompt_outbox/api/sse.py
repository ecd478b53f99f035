"""Server-sent events for one session: ``queue.reset`` (the whole queue) first, then a
``queue.update`` per change, each with the event log's ID so ``Last-Event-ID`` resumes.

A stream also ends, cleanly, when its client falls too far behind (the feed's ``FellBehind``)
or the process shuts down: the client's EventSource reconnects after ``RETRY_MS`` with the
last ID it got, and resumes exactly after it (or gets a reset if the capped log moved on).

Framing: no payload can split a message. The data is JSON whose only possible line breaks are
whitespace inside a caller's raw ``model`` (JSON strings escape theirs); each line goes on a
``data:`` line of its own, which the client joins back with LF (a CR or CRLF in that
whitespace arrives as LF: the same JSON). ``id`` and ``event`` never hold one.

Backpressure and memory (a client that stops reading must not make serve hold its answer): a
message is formatted and handed to the server in pieces (``answers.gathered``, about 16 KiB
each) an entry at a time, so the whole reset (the queue, up to 5 MB on the wire) never exists
as one string. Starlette awaits each ``send``, and uvicorn's ``send`` waits while its transport
holds over its high-water mark (flow control), so a client that does not read stops this
generator, and the feed's bounds take over for what comes next. What a message holds meanwhile
(its entries not yet written, the piece in flight) is charged to the caller's and the process's
answer budgets (``answers.py``) from when it is read until the transport took its last piece; a
message that does not fit ends the stream (the client resumes after its last event), and a
client that takes nothing for ``serve --send-timeout`` has its connection aborted
(``cli/heads.py``), which ends the stream and frees all of it."""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator

from ..core.entry import Entry, entry_pieces, list_pieces
from ..core.events import QueueEvent, QueueReset
from ..storage.feed import StreamEnded
from ..storage.store import TRANSIENT_ERRORS
from .answers import SLICE, UNMETERED, Hold, Purse, charge, consumed, gathered

log = logging.getLogger("prompt_outbox.api")

RETRY_MS = 2000  # how soon EventSource reconnects after the stream ends
KEEPALIVE_POLLS = 15  # quiet polls (about a second each) between keepalive comments

Item = QueueEvent | QueueReset | None

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the SSE spec's three line endings


def format_item(item: QueueEvent | QueueReset) -> str:
    """One SSE message, whole (``item_pieces`` joined). Entry JSON is spliced raw, so a
    caller's ``model`` stays byte for byte (but for its line breaks: see the module
    docstring)."""
    return "".join(item_pieces(item, item.entries if isinstance(item, QueueReset) else ()))


def item_pieces(item: QueueEvent | QueueReset, entries: Iterable[Entry]) -> Iterator[str]:
    """One SSE message in pieces, an entry at a time: a reset lists ``entries`` (its own,
    or the same taken out one by one as they are written: ``answers.consumed``)."""
    if isinstance(item, QueueReset):
        return framed(item.event_id, "queue.reset", list_pieces(entries, SLICE))
    head = f'{{"kind":{json.dumps(item.kind)},"id":{json.dumps(item.entry_id)},"entry":'
    if item.turn is not None:
        data: Iterable[str] = (head, f'null,"turn":{item.turn.to_json()}}}')
    elif item.entry is None:
        data = (head, "null}")
    else:
        pieces = entry_pieces(item.entry, with_list_fields=False, size=SLICE)
        data = itertools.chain((head,), pieces, ("}",))
    return framed(item.event_id, "queue.update", data)


def message(event_id: str, event: str, data: str) -> str:
    """An SSE message whose framing no value can break (``framed``, whole)."""
    return "".join(framed(event_id, event, (data,)))


def framed(event_id: str, event: str, data: Iterable[str]) -> Iterator[str]:
    """An SSE message in pieces, ``data`` given in pieces: it goes on one ``data:`` line per
    line it holds (a line break in a piece starts the next ``data:`` line; no piece may end
    in the middle of a CRLF: ``core/entry`` slices keep one whole); an ``id`` or ``event``
    holding a line break is a ValueError (they come from the event log and the code, never
    from a client: one would be a bug)."""
    for name, value in (("id", event_id), ("event", event)):
        if "\n" in value or "\r" in value:
            raise ValueError(f"an SSE {name} must not hold a line break: {value!r}")
    yield f"id: {event_id}\nevent: {event}\ndata: "
    for piece in data:
        yield _LINE_BREAK.sub("\ndata: ", piece) if "\n" in piece or "\r" in piece else piece
    yield "\n\n"


async def event_stream(
    first: QueueEvent | QueueReset | None,
    items: AsyncIterator[Item],
    disconnected: Callable[[], Awaitable[bool]],
    purse: Purse = UNMETERED,
    first_hold: Hold | None = None,
) -> AsyncIterator[str | bytes]:
    """The response body: ``first`` (already read, so a dead Valkey was a 503; charged as
    ``first_hold`` by the route, so that an answer over the budget was a 429 / 503), then
    the rest until the client leaves. A Valkey error, a client too slow to keep up, a
    message over the caller's ``purse``, or a shutdown ends the stream; the client resumes
    by its ID."""
    yield f"retry: {RETRY_MS}\n\n"
    item, hold = first, first_hold
    first = first_hold = None  # a reset is the whole queue, and a stream lives for hours
    quiet = 0
    try:
        while True:
            if item is not None:
                quiet = 0
                if hold is None:
                    hold = purse.try_take(charge(item))
                    if hold is None:
                        log.info("event stream ended: its answers hold their most bytes unread")
                        return
                if isinstance(item, QueueReset):  # out of the reset, freed as they are written
                    entries: Iterable[Entry] = consumed(item.entries, hold)
                else:
                    entries = ()
                pieces, item = item_pieces(item, entries), None
                for data in gathered(pieces):
                    yield data
                del pieces
                yield b""  # an empty write: uvicorn's send returns once the transport took it
                hold.close()
                hold = None
            try:
                item = await anext(items)
            except StopAsyncIteration:
                return
            if item is None:
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
        if hold is not None:
            hold.close()
        await items.aclose()  # type: ignore[attr-defined]
