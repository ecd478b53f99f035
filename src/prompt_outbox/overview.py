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

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from .core.entry import Status
from .core.errors import InvalidInput
from .core.keys import check_id, session_keys, workspace_keys
from .core.metrics import FleetCounts
from .core.settings import Tunables
from .core.timeutil import Clock, to_ms
from .core.turns import decode_turn
from .delivery.lease import hold_times
from .storage.replies import SessionTally, Tally
from .storage.series import SERIES_SLOTS, LoggedEvent, SeriesMinute
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
MAX_SERIES_MINUTES = SERIES_SLOTS // 2
"""The most minutes a series answer covers: the ring keeps twice that, so the oldest pending
entry as it stood before the first minute shown is known."""
MAX_HISTORY = 200
"""The most events of a session's log that one history read looks at."""


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """What a workspace holds against its byte budget, in bytes: its queued entries (their
    strings, and 64 B each beside), and what its event logs and its dedupe and claim
    markers took in the windows still counted (docs/design.md, "What one tenant may store");
    ``limit``, its budget (``Tunables.workspace_budget_share`` of ``memory``: its node's
    maxmemory, or the machine's memory; 0 when neither is known: no budget)."""

    queued: int
    logs: int
    markers: int
    limit: int
    memory: int

    @property
    def used(self) -> int:
        """What counts against the budget: the three parts together."""
        return self.queued + self.logs + self.markers


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


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One minute of a workspace's series: its start (ms since the epoch), prompts accepted,
    delivered and failed (moved into error) in it, and how long the oldest pending entry had
    waited at its end (seconds; 0 when none was pending; None when not known: nothing
    recorded since two hours before)."""

    start_ms: int
    accepted: int
    delivered: int
    failed: int
    oldest_pending_for: float | None


@dataclass(frozen=True, slots=True)
class Delivered:
    """A delivered prompt of a session's recent history: its entry ID, when it was claimed
    sent (ms, Valkey's clock), and its turn: None (no turn), or the turn's ID, how long it
    took (seconds; None while it runs, or when its end is no longer in the log) and why it
    ended ('' while it runs)."""

    id: str
    sent_ms: int
    turn: str | None = None
    turn_seconds: float | None = None
    turn_why: str = ""


def series_points(
    rows: Sequence[SeriesMinute], oldest_now: int | None, now_ms: int, minutes: int
) -> list[SeriesPoint]:
    """The last ``minutes`` minutes up to ``now_ms`` from the recorded ``rows``: a minute with
    no row counted nothing, and its oldest pending entry is the last recorded one before it
    (only accepts, deliveries and failures record it: a stage, retry or dismiss in between
    shows at the next of those); the current minute's is ``oldest_now``, read now."""
    current = now_ms // 60000
    first = current - minutes + 1
    by_minute = {r.minute: r for r in rows if current - SERIES_SLOTS < r.minute <= current}
    known, oldest = False, None
    for m in sorted(by_minute):
        if m < first:
            known, oldest = True, by_minute[m].oldest_pending_ms
    points = []
    for m in range(first, current + 1):
        row = by_minute.get(m)
        if row is not None:
            known, oldest = True, row.oldest_pending_ms
        if m == current:
            known, oldest = True, oldest_now
        end = min((m + 1) * 60000, now_ms)
        age = None if not known else 0.0 if oldest is None else max(0.0, (end - oldest) / 1000)
        a, d, f = (row.accepted, row.delivered, row.failed) if row else (0, 0, 0)
        points.append(SeriesPoint(m * 60000, a, d, f, age))
    return points


def history(events: Sequence[LoggedEvent]) -> list[Delivered]:
    """The delivered prompts among ``events`` (newest first, as read), newest first, each
    with its turn: the ``sent`` event, its ``turn`` (the claim's) and its ``turn_ended``."""
    ended: dict[str, tuple[float | None, str]] = {}
    turns: dict[str, str] = {}
    out = []
    for ev in events:  # newest first: an end is met before its turn, a turn before its send
        if ev.kind == "turn_ended":
            body = _json(ev.body)
            seconds = body.get("seconds")
            took = float(seconds) if isinstance(seconds, int | float) else None
            ended.setdefault(ev.entry, (took, str(body.get("why", ""))))
        elif ev.kind == "turn":
            hold = decode_turn(ev.body)
            turns.setdefault(ev.entry, hold.turn if hold else "")
        elif ev.kind == "sent":
            turn = turns.get(ev.entry)
            took, why = ended.get(ev.entry, (None, "")) if turn is not None else (None, "")
            out.append(Delivered(ev.entry, ev.at_ms, turn, took, why))
    return out


def _json(raw: str) -> dict[str, object]:
    try:
        got = json.loads(raw)
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


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
        self._series = store.series

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

    async def series(self, ws: str, minutes: int = MAX_SERIES_MINUTES) -> list[SeriesPoint]:
        """The workspace's last ``minutes`` minutes (1 to ``MAX_SERIES_MINUTES``), oldest
        first: prompts accepted, delivered and failed each minute, and the oldest pending
        entry's age at its end. Two small reads, whatever the workspace holds."""
        if not 1 <= minutes <= MAX_SERIES_MINUTES:
            raise InvalidInput(f"minutes must be 1 to {MAX_SERIES_MINUTES}, got {minutes}")
        rows, oldest_now = await self._series.minutes(workspace_keys(ws))
        return series_points(rows, oldest_now, to_ms(self._clock()), minutes)

    async def history(self, ws: str, ses: str, limit: int = MAX_HISTORY) -> list[Delivered]:
        """The session's recently delivered prompts, newest first, with their turns: from
        the newest ``limit`` events of its log (1 to ``MAX_HISTORY``; the log keeps
        ``event_log_len`` events for ``event_log_ttl``)."""
        if not 1 <= limit <= MAX_HISTORY:
            raise InvalidInput(f"limit must be 1 to {MAX_HISTORY}, got {limit}")
        return history(await self._series.recent_events(session_keys(ws, ses), limit))

    async def budget(self, ws: str) -> BudgetUse:
        """What the workspace holds against its byte budget, and that budget: a few fields
        read, no entry (the node's memory from the accept path's cached reading)."""
        w, budgets = workspace_keys(ws), self._store.budgets
        held = await budgets.holding(w)
        reading = await budgets.reading(w.count)
        limit = reading.budget(budgets.share)
        return BudgetUse(held.queued, held.logs, held.markers, limit, reading.basis)

    async def session_bytes(self, ws: str, ses: str) -> int:
        """What the session's entries take in Valkey's memory, in bytes (one field read):
        what reading them costs, before it is read (the API's answer budgets)."""
        return await self._store.budgets.session_bytes(session_keys(ws, ses))

    async def fleet_counts(self) -> FleetCounts:
        """What the /metrics gauges show of every workspace: the entries by status, the
        oldest pending entry and the sessions held in turn, in one walk of O(workspaces)
        small reads (no entry read)."""
        total: dict[str, int] = {}
        oldest: int | None = None
        in_turn = 0
        async for t, held in self._store.walk.all_tallies_and_turns():
            for status, n in t.tally.by_status.items():
                total[status] = total.get(status, 0) + n
            first = t.tally.oldest_pending_ms
            if first is not None and (oldest is None or first < oldest):
                oldest = first
            in_turn += held
        return FleetCounts({s: n for s, n in total.items() if n}, oldest, in_turn)
