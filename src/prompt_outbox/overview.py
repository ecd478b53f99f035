"""What the queue page shows first: workspaces and their sessions, each with its entries by
status and how long its work has waited, in pages.

A page costs what it shows, whatever the number of workspaces and whatever their entries
hold: no entry is read. The counts, the oldest pending entry and the send start of the entry
in flight are the tally the session scripts keep (``lua/lib.lua``). The workspaces come from
the due index's registry by HSCAN (``Walk.workspace_page``), then each shown workspace's
tally in one pipelined read (``Walk.workspace_tallies``). A workspace's sessions are ranked
busiest first by their lengths (two LLEN a session), then the shown ones' tallies and locks
are read in one script (``Store.tally``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from .core.entry import Status
from .core.errors import InvalidInput
from .core.keys import check_id, workspace_keys
from .core.settings import Tunables
from .core.timeutil import Clock, to_ms
from .delivery.lease import hold_times
from .storage.replies import SessionTally, Tally
from .storage.store import Store

T = TypeVar("T")

MAX_PAGE = 200
"""The most items one page may ask for."""
SESSION_CURSOR = r"^[0-9]{0,9}$"
"""A sessions page's cursor: an offset into the busiest-first ranking ('' to start)."""
WORKSPACE_CURSOR = r"^(|[0-7]:[0-9]{1,19}:[0-9]{1,9})$"
"""A workspaces page's cursor: ``bucket:hscan-cursor:skip`` (``Walk.workspace_page``;
``BUCKETS`` is 8 and 19 digits stay below HSCAN's 2**64), or '' to start; for a token's own
workspaces, an offset."""


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, and the cursor of the next ('' after the last)."""

    items: list[T]
    next: str


@dataclass(frozen=True, slots=True)
class Counts:
    """Entries by status, and how long the oldest pending one has waited (seconds; None when
    there is none)."""

    by_status: dict[str, int]
    oldest_pending_for: float | None

    @property
    def entries(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True, slots=True)
class WorkspaceSummary:
    """A workspace: how many sessions hold entries, and its entries' counts."""

    id: str
    sessions: int
    counts: Counts


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session: its entries' counts; ``delivering_for``, seconds since its entry in flight
    was handed to the agent; ``blocked_for``, seconds its pending entries have waited behind
    the holder of its lock (None when not); ``in_turn_for``, seconds the session has been in
    turn, the agent working on a delivered prompt (None when not in turn)."""

    id: str
    counts: Counts
    delivering_for: float | None
    blocked_for: float | None
    in_turn_for: float | None = None


def _counts(tally: Tally, now: datetime) -> Counts:
    return Counts(tally.by_status, _since(tally.oldest_pending_ms, now))


def _since(then_ms: int | None, now: datetime) -> float | None:
    return None if then_ms is None else max(0.0, (to_ms(now) - then_ms) / 1000)


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be 1 to {MAX_PAGE}, got {limit}")
    return limit


def _offset(cursor: str) -> int:
    if cursor and not (cursor.isdigit() and len(cursor) <= 9):
        raise InvalidInput(f"not a page cursor: {cursor!r}")
    return int(cursor or 0)


class Overview:
    """The overview reads of one Outbox (``Outbox.overview``)."""

    def __init__(self, store: Store, tunables: Tunables, clock: Clock) -> None:
        self._store = store
        self._tunables = tunables
        self._clock = clock

    async def workspaces(
        self, cursor: str = "", limit: int = 20, *, only: Sequence[str] | None = None
    ) -> Page[WorkspaceSummary]:
        """A page of workspaces with their counts: every registered one (in the server's
        order), or, with ``only``, those named (sorted; a token's own list)."""
        limit = _limit(limit)
        if not re.fullmatch(WORKSPACE_CURSOR, cursor):
            raise InvalidInput(f"not a workspace page cursor: {cursor!r}")
        if only is None:
            names, after = await self._store.walk.workspace_page(cursor, limit)
        else:  # the same cursor's form: its skip is the offset into the sorted list
            start = int(cursor.rpartition(":")[2] or 0)
            ordered = sorted({check_id("workspace", ws) for ws in only})
            names = ordered[start : start + limit]
            after = f"0:0:{start + limit}" if start + limit < len(ordered) else ""
        tallies = await self._store.walk.workspace_tallies(names)
        now = self._clock()
        items = [WorkspaceSummary(t.ws, t.sessions, _counts(t.tally, now)) for t in tallies]
        return Page(items, after)

    async def sessions(self, ws: str, cursor: str = "", limit: int = 20) -> Page[SessionSummary]:
        """A page of the workspace's sessions holding entries, busiest (most entries) first,
        then by ID."""
        limit, start = _limit(limit), _offset(cursor)
        w = workspace_keys(ws)
        sizes = await self._store.walk.session_sizes(w)
        ranked = sorted(sizes, key=lambda ks: (-ks[1], ks[0].ses))
        shown = [k.ses for k, _ in ranked[start : start + limit]]
        tallies = await self._store.tally(w, shown)
        now = self._clock()
        items = [self._session(t, now) for t in tallies]
        return Page(items, str(start + limit) if start + limit < len(ranked) else "")

    def _session(self, t: SessionTally, now: datetime) -> SessionSummary:
        counts = _counts(t.tally, now)
        blocked = in_turn = None
        if t.lock_value:
            lock_ttl = self._tunables.lock_ttl
            held, in_turn, _ = hold_times(t.lock_value, t.lock_pttl_ms, now, lock_ttl)
            blocked = held if counts.by_status[Status.PENDING] > 0 else None
        return SessionSummary(t.ses, counts, _since(t.sent_ms, now), blocked, in_turn)
