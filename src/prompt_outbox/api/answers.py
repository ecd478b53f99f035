"""What answers hold for their clients: bytes counted per token and per process, each with a
clear refusal, so that clients that do not read cannot make serve hold unbounded memory.

A session's list and an event stream's messages (its opening ``queue.reset`` is the whole
queue: up to ``cap`` entries near the text limit, 5 MB on the wire) are written to the
server in pieces, an entry at a time (``core/entry.list_pieces``), and the server's flow
control stops the writer while the client does not read. What the answer holds meanwhile
(the entries not yet written, the piece in flight, the transport's buffer) is counted here,
from when its entries are read until the transport has taken the last piece, and released
as they go out. A client that stops reading thus holds at most its answer's charge until
``serve``'s send timeout (``cli/stalls.py``) aborts its connection; before this, each held
the whole answer formatted as one string, on top of the snapshot it came from (+10.7 MB per
stalled stream in the red team's run, 5 GB for one token's 500 streams).

Budgets, as ``api/streams.py``'s for open streams: past ``per_token`` a new answer is a 429
(this caller's answers hold too much its clients have not taken: read them, or close those
connections), past ``per_process`` a 503 (this replica holds its most: retry later, or on
another one), both ``answers_buffer_full`` with ``Retry-After``, before the answer is built.
An event stream already open that cannot take a message's charge ends instead, cleanly: its
client resumes after the last event it got (as after the feed's ``FellBehind``). An answer
larger than a budget on its own is let through when its caller (or the process) holds
nothing else, so a session raised past the defaults (``Tunables.cap``) is still answered,
one such answer at a time.

The charge of an answer: each entry's memory (``held_size``: its strings and the object),
plus ``RESERVE`` for what is in flight (the piece handed to the server, its copy in the
transport, and the transport's own buffer up to ``TRANSPORT_HIGH_WATER``, which
``cli/heads.py`` sets). Each entry's part is released once its pieces are written; the
reserve once the transport took the last piece (an empty write waits for that: uvicorn's
``send`` waits while the transport is over its high-water mark). An open stream that is
quiet holds nothing.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request

from ..admin import SLICE_BYTES
from ..core.entry import Entry, list_pieces
from ..core.events import QueueEvent, QueueReset
from ..core.metrics import Metrics
from .auth import Principal
from .errors import ApiError
from .streams import Bounds

MIB = 1024 * 1024
DEFAULT_PER_PROCESS = 64 * MIB
"""The bytes all answers of a process may hold: the same as the event streams' buffers
(``FeedLimits.max_buffered_bytes``), four tokens at their own bound."""
DEFAULT_PER_TOKEN = 16 * MIB
"""The bytes one token's answers may hold: three whole sessions at the defaults' worst (25
entries near the text limit, about 5 MB), or about 200 answers in flight at once."""
RETRY_AFTER_S = "5"
"""What a refused caller waits: answers to reading clients go out in milliseconds, and a
stalled one is cut at the send timeout (30 s)."""

SLICE = 2 * 1024
"""Characters of an entry's text or model per piece (escaped: at most 6 x, 12 KiB)."""
PIECE_BYTES = 16 * 1024
"""Pieces are gathered up to this many bytes before they are handed to the server (one write
each: a 5 MB answer is about 300)."""
MAX_PIECE_BYTES = PIECE_BYTES + 7 * SLICE
"""A gathered piece's bound: under ``PIECE_BYTES``, plus one slice at its largest (a slice
of raw line breaks in a model, each framed as ``\\ndata: `` in an event stream)."""
TRANSPORT_HIGH_WATER = 16 * 1024
"""The write buffer over which a connection's transport stops the writer (``cli/heads.py``
sets it on every connection: asyncio's default is 64 KiB). Below it, what the transport
holds is counted nowhere: a connection's own cost, bounded by the connection cap."""
RESERVE = TRANSPORT_HIGH_WATER + 2 * MAX_PIECE_BYTES
"""Charged to every answer in flight: the transport's buffer and one piece, held by the
writer and copied into the transport (76 KiB)."""
ONE_ENTRY = RESERVE + 2 * MIB
"""Charged while an action on one entry (retry, dismiss, edit) runs: the entry read (the
largest one can be, a text of 100 KiB escaped and a model of 16 KiB, is under a MiB) and its
new string."""
ONE_SLICE = RESERVE + 2 * SLICE_BYTES
"""Charged while an action on many entries (retry or dismiss a session's or a workspace's
errors) runs: it reads and rewrites a slice of ``SLICE_BYTES`` at a time."""
_NOW = datetime.now(UTC)
_ENTRY_FIXED = sys.getsizeof(Entry("", "", "", "", _NOW)) + 3 * sys.getsizeof(_NOW)
"""An entry's object and its three times (the numbers and the status are shared)."""


def held_size(entry: Entry) -> int:
    """The memory ``entry`` holds: its strings (``sys.getsizeof``: 1, 2 or 4 bytes a
    character, as Python stores them) and the rest of the object."""
    size = _ENTRY_FIXED
    for value in (entry.id, entry.client_message_id, entry.user_id, entry.text, entry.last_error):
        size += sys.getsizeof(value)
    if entry.model is not None:
        size += sys.getsizeof(entry.model)
    return size


def read_charge(stored: int) -> int:
    """What an answer is charged before its entries are read, from the bytes they take in
    Valkey (``Overview.session_bytes``): the read is refused (429 / 503) before it costs the
    process anything; ``Hold.settle`` then makes it the exact ``charge``. Decoded, an entry
    holds about what it took there (its text as Python keeps it: a byte a character for most
    texts, up to four beside a wide character), hence one for one. Not ``RESERVE`` yet, which
    the writing needs, not the read: a burst of streams opening on empty sessions (phones
    reconnecting after a restart) is charged as each one's reset is read, through the feed's
    bounded reads, not all at once."""
    return stored


def charge(item: QueueReset | QueueEvent | list[Entry]) -> int:
    """What an answer (a list, or an event stream's message) is charged as it starts."""
    if isinstance(item, QueueEvent):
        return RESERVE + (0 if item.entry is None else held_size(item.entry))
    entries = item.entries if isinstance(item, QueueReset) else item
    return RESERVE + sum(held_size(e) for e in entries)


@dataclass(frozen=True, slots=True)
class AnswerLimits(Bounds):
    """The bytes answers may hold for their clients: all of a process's, and one token's."""

    per_process: int = DEFAULT_PER_PROCESS
    per_token: int = DEFAULT_PER_TOKEN


class AnswerBuffers:
    """The bytes one app's answers hold, in all and by caller (see the module docstring).
    ``metrics``: where the refusals are counted and the bytes held shown."""

    def __init__(self, limits: AnswerLimits, metrics: Metrics | None = None) -> None:
        self.limits = limits
        self.held = 0
        self._by_caller: Counter[Principal] = Counter()
        self._metrics = metrics
        if metrics is not None:
            metrics.answer_buffer_bytes.set_function(lambda: self.held)

    def holding(self, caller: Principal) -> int:
        """The bytes ``caller``'s answers hold."""
        return self._by_caller[caller]

    def purse(self, caller: Principal) -> Purse:
        """``caller``'s side of the account."""
        return Purse(self, caller)

    def admit(self, caller: Principal) -> None:
        """Refuse (429 / 503) a caller, or a process, already at its bound: checked before
        anything is read for its answer."""
        self.take(caller, 1).close()

    def take(self, caller: Principal, size: int, own: int = 0) -> Hold:
        """A hold of ``size`` bytes for ``caller``'s answer about to start, or its refusal:
        429 past the token's bound, 503 past the process's (``answers_buffer_full``).
        ``own``: bytes of the caller's holds that belong to this same answer (it grows)."""
        hold = self.try_take(caller, size, own)
        if hold is not None:
            return hold
        bound = self._over(caller, size, own)
        if self._metrics is not None:
            self._metrics.answers_refused.labels(bound=bound).inc()
        headers = {"Retry-After": RETRY_AFTER_S}
        if bound == "token":
            detail = (
                f"this token's answers hold {self._by_caller[caller]} bytes their clients have "
                f"not taken, its limit: {self.limits.per_token}; read them, or close those "
                "connections"
            )
            raise ApiError(429, "answers_buffer_full", detail, headers=headers)
        detail = (
            f"this replica's answers hold {self.held} bytes their clients have not taken, its "
            f"limit: {self.limits.per_process}; retry later"
        )
        raise ApiError(503, "answers_buffer_full", detail, headers=headers)

    def try_take(self, caller: Principal, size: int, own: int = 0) -> Hold | None:
        """A hold of ``size`` bytes for ``caller``, or None past a bound."""
        if self._over(caller, size, own) is not None:
            return None
        self.held += size
        self._by_caller[caller] += size
        return Hold(self, caller, size)

    def _over(self, caller: Principal, size: int, own: int = 0) -> str | None:
        """The bound taking ``size`` more for ``caller`` would pass (None: it fits). A caller
        (or a process) holding nothing but this answer's ``own`` may take one answer of any
        size."""
        mine = self._by_caller[caller]
        if mine > own and mine + size > self.limits.per_token:
            return "token"
        if self.held > own and self.held + size > self.limits.per_process:
            return "process"
        return None

    def give_back(self, caller: Principal, size: int) -> None:
        """``size`` bytes of ``caller``'s answers were written (``Hold.release``)."""
        self.held -= size
        self._by_caller[caller] -= size
        if not self._by_caller[caller]:
            del self._by_caller[caller]


class Purse:
    """One caller's side of ``AnswerBuffers`` (None: ``UNMETERED``), for the writer of its
    answer: it need not know who the caller is."""

    __slots__ = ("_account", "_caller")

    def __init__(self, account: AnswerBuffers | None, caller: Principal) -> None:
        self._account, self._caller = account, caller

    def admit(self) -> None:
        """``AnswerBuffers.admit``."""
        if self._account is not None:
            self._account.admit(self._caller)

    def take(self, size: int) -> Hold:
        """``AnswerBuffers.take``."""
        if self._account is None:
            return Hold(None, self._caller, size)
        return self._account.take(self._caller, size)

    def try_take(self, size: int) -> Hold | None:
        """``AnswerBuffers.try_take``."""
        if self._account is None:
            return Hold(None, self._caller, size)
        return self._account.try_take(self._caller, size)


async def get_answers(request: Request) -> AnswerBuffers:
    """The app's account (``create_app`` puts it on ``app.state``)."""
    answers: AnswerBuffers = request.app.state.answers
    return answers


AnswersDep = Annotated[AnswerBuffers, Depends(get_answers)]

UNMETERED = Purse(None, Principal("", frozenset()))
"""A purse that never refuses and counts nothing (an answer's writer used on its own)."""


class Hold:
    """One answer's charge: released in parts as its entries go out, the rest at ``close``."""

    __slots__ = ("_account", "_caller", "left")

    def __init__(self, account: AnswerBuffers | None, caller: Principal, size: int) -> None:
        self._account, self._caller = account, caller
        self.left = size

    def release(self, size: int) -> None:
        """``size`` bytes of the answer were written (never more than is left)."""
        size = min(size, self.left)
        self.left -= size
        if self._account is not None:
            self._account.give_back(self._caller, size)

    def close(self) -> None:
        """The answer ended, however: all it still holds is released (idempotent)."""
        self.release(self.left)

    def settle(self, size: int) -> None:
        """Hold exactly ``size`` bytes from now: what is over it is released, what is under
        it taken (429 / 503 ``answers_buffer_full`` past a bound, the hold as it was)."""
        if size <= self.left:
            self.release(self.left - size)
        elif self._account is not None:
            more = self._account.take(self._caller, size - self.left, own=self.left)
            self.left, more.left = self.left + more.left, 0
        else:
            self.left = size

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def consumed(entries: list[Entry], hold: Hold) -> Iterator[Entry]:
    """``entries`` in order, each taken out of the list as it is given, and its part of
    ``hold`` released once the next is asked for (its pieces are written by then): what is
    written is freed, not kept for the answer's life."""
    entries.reverse()
    while entries:
        size = held_size(entries[-1])
        yield entries.pop()  # the only reference left is the caller's
        hold.release(size)


def gathered(pieces: Iterable[str], size: int = PIECE_BYTES) -> Iterator[bytes]:
    """``pieces`` encoded, joined into writes of at least ``size`` bytes (the last one
    shorter), each under ``MAX_PIECE_BYTES`` when the pieces are ``SLICE``-sized."""
    parts: list[bytes] = []
    length = 0
    for piece in pieces:
        data = piece.encode()
        parts.append(data)
        length += len(data)
        if length >= size:
            yield b"".join(parts)
            parts, length = [], 0
    if parts:
        yield b"".join(parts)


async def list_body(entries: list[Entry], hold: Hold) -> AsyncIterator[bytes]:
    """A list answer's body, ``{"entries":[...]}``: written an entry at a time, each freed and
    released as it goes, the rest of ``hold`` once the transport took the last piece."""
    try:
        for data in gathered(list_pieces(consumed(entries, hold), SLICE)):
            yield data
        yield b""  # an empty write: uvicorn's send returns once the transport took the rest
    finally:
        hold.close()
