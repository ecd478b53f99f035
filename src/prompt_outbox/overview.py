"""What the queue page shows first: workspaces and their sessions, each with its entries by
status and how long its work has waited, in pages.

A page costs what it shows, whatever the number of workspaces: the workspaces come from the
due index's registry by HSCAN (``Walk.workspace_page``), then each shown workspace's entries
in one pipelined read. A workspace's sessions are ranked busiest first by their lengths (two
LLEN a session), then only the shown ones are read whole (``snapshot.lua``, with the lock).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from .core.entry import Entry, Status, decode_entry
from .core.errors import InvalidInput
from .core.keys import SessionKeys, check_id, workspace_keys
from .core.settings import Tunables
from .core.timeutil import Clock
from .delivery.lease import held_for
from .storage.replies import Snapshot
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
    the holder of its lock (None when not)."""

    id: str
    counts: Counts
    delivering_for: float | None
    blocked_for: float | None


def _counts(entries: Iterable[Entry], now: datetime) -> Counts:
    by_status = {str(s): 0 for s in Status}
    oldest: datetime | None = None
    for e in entries:
        by_status[str(e.status)] += 1
        if e.status is Status.PENDING and (oldest is None or e.accepted_at < oldest):
            oldest = e.accepted_at
    return Counts(by_status, None if oldest is None else _since(oldest, now))


def _since(then: datetime, now: datetime) -> float:
    return max(0.0, (now - then).total_seconds())


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
        summaries = await asyncio.gather(*(self._workspace(ws) for ws in names))
        return Page(list(summaries), after)

    async def _workspace(self, ws: str) -> WorkspaceSummary:
        sessions = await self._store.walk.sessions_of(workspace_keys(ws))
        raws = await self._store.walk.session_entries(sessions)
        now = self._clock()
        entries = (decode_entry(raw) for session in raws for raw in session)
        return WorkspaceSummary(ws, len(sessions), _counts(entries, now))

    async def sessions(self, ws: str, cursor: str = "", limit: int = 20) -> Page[SessionSummary]:
        """A page of the workspace's sessions holding entries, busiest (most entries) first,
        then by ID."""
        limit, start = _limit(limit), _offset(cursor)
        sizes = await self._store.walk.session_sizes(workspace_keys(ws))
        ranked = sorted(sizes, key=lambda ks: (-ks[1], ks[0].ses))
        shown = [k for k, _ in ranked[start : start + limit]]
        snaps = await asyncio.gather(*(self._store.snapshot(k) for k in shown))
        now = self._clock()
        items = [self._session(k, snap, now) for k, snap in zip(shown, snaps, strict=True)]
        return Page(items, str(start + limit) if start + limit < len(ranked) else "")

    def _session(self, k: SessionKeys, snap: Snapshot, now: datetime) -> SessionSummary:
        staged = [decode_entry(raw) for raw in snap.staging]
        queued = [decode_entry(raw) for raw in snap.queue]
        counts = _counts([*staged, *queued], now)
        sent = [e.last_attempt_at for e in staged if e.last_attempt_at is not None]
        delivering = _since(min(sent), now) if sent else None
        blocked = None
        if snap.locked and counts.by_status[Status.PENDING] > 0:
            lock_ttl = self._tunables.lock_ttl
            blocked = held_for(snap.lock_value, snap.lock_pttl_ms, now, lock_ttl)
        return SessionSummary(k.ses, counts, delivering, blocked)
