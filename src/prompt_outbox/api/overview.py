"""The overview routes the queue page starts from: workspaces, then a workspace's sessions,
each with its entries by status and how long its work has waited, paged by cursor
(``Outbox.overview``: a page costs what it shows, whatever the number of workspaces)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from ..core.timeutil import format_time
from ..overview import (
    MAX_HISTORY,
    MAX_PAGE,
    MAX_SERIES_MINUTES,
    SESSION_CURSOR,
    WORKSPACE_CURSOR,
    Counts,
    Delivered,
    SeriesPoint,
    SessionSummary,
    WorkspaceSummary,
)
from .auth import Anyone, Caller
from .errors import errors
from .models import (
    BudgetOut,
    CountsOut,
    DeliveredOut,
    HistoryOut,
    MeOut,
    MinuteOut,
    SeriesOut,
    SessionOut,
    SessionPage,
    WorkspaceOut,
    WorkspacePage,
)
from .params import OutboxDep, SessionId, WorkspaceId

router = APIRouter()

_FROM_NEXT = "the previous page's next; empty for the first page"
WorkspaceCursor = Annotated[str, Query(pattern=WORKSPACE_CURSOR, description=_FROM_NEXT)]
SessionCursor = Annotated[str, Query(pattern=SESSION_CURSOR, description=_FROM_NEXT)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="items per page")]
Minutes = Annotated[
    int, Query(ge=1, le=MAX_SERIES_MINUTES, description="minutes to cover, up to now")
]
Events = Annotated[int, Query(ge=1, le=MAX_HISTORY, description="newest log events to look at")]


def _nanos(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def _counts(c: Counts) -> CountsOut:
    return CountsOut.model_validate(c.by_status)


def _workspace(w: WorkspaceSummary) -> WorkspaceOut:
    return WorkspaceOut(
        id=w.id,
        sessions=w.sessions,
        entries=w.counts.entries,
        counts=_counts(w.counts),
        oldestPendingFor=_nanos(w.counts.oldest_pending_for),
    )


def _session(s: SessionSummary) -> SessionOut:
    return SessionOut(
        id=s.id,
        entries=s.counts.entries,
        counts=_counts(s.counts),
        oldestPendingFor=_nanos(s.counts.oldest_pending_for),
        deliveringFor=_nanos(s.delivering_for),
        blockedFor=_nanos(s.blocked_for),
        inTurnFor=_nanos(s.in_turn_for),
    )


def _at(ms: int) -> str:
    return format_time(datetime.fromtimestamp(ms / 1000, UTC))


def _minute(p: SeriesPoint) -> MinuteOut:
    return MinuteOut(
        at=_at(p.start_ms),
        accepted=p.accepted,
        delivered=p.delivered,
        failed=p.failed,
        oldestPendingFor=_nanos(p.oldest_pending_for),
    )


def _delivered(d: Delivered) -> DeliveredOut:
    ran = d.turn is not None and d.turn_why
    return DeliveredOut(
        id=d.id,
        sentAt=_at(d.sent_ms),
        turn=d.turn,
        turnFor=_nanos(d.turn_seconds) if ran else None,
        turnEnded=d.turn_why if ran else None,
    )


@router.get("/v1/me", responses=errors())
async def me(caller: Anyone) -> MeOut:
    """Who the token speaks for: its user, whether it is an admin token, its workspaces (a
    page shows or hides the admin actions by it)."""
    return MeOut(user=caller.user_id, admin=caller.admin, workspaces=sorted(caller.workspaces))


@router.get("/v1/workspaces", responses=errors())
async def list_workspaces(
    caller: Anyone, outbox: OutboxDep, cursor: WorkspaceCursor = "", limit: Limit = 20
) -> WorkspacePage:
    """Workspaces with their entries by status: every one that holds work for an admin
    token (in the server's order), the token's own (sorted) for any other."""
    only = None if caller.admin else sorted(caller.workspaces)
    page = await outbox.overview.workspaces(cursor, limit, only=only)
    return WorkspacePage(workspaces=[_workspace(w) for w in page.items], next=page.next or None)


@router.get("/v1/workspaces/{ws}/sessions", responses=errors())
async def list_sessions(
    ws: WorkspaceId,
    caller: Caller,
    outbox: OutboxDep,
    cursor: SessionCursor = "",
    limit: Limit = 20,
) -> SessionPage:
    """The workspace's sessions that hold entries, busiest first, with their counts and how
    long their work has been in flight or blocked."""
    page = await outbox.overview.sessions(ws, cursor, limit)
    return SessionPage(sessions=[_session(s) for s in page.items], next=page.next or None)


@router.get("/v1/workspaces/{ws}/series", responses=errors())
async def workspace_series(
    ws: WorkspaceId, caller: Caller, outbox: OutboxDep, minutes: Minutes = MAX_SERIES_MINUTES
) -> SeriesOut:
    """The workspace's last minutes, oldest first: prompts accepted, delivered and failed
    each minute, and how long its oldest pending entry had waited (the queue page's charts).
    Kept by the transitions in a two-hour ring, so this costs two small reads."""
    points = await outbox.overview.series(ws, minutes)
    return SeriesOut(minutes=[_minute(p) for p in points])


@router.get("/v1/workspaces/{ws}/budget", responses=errors())
async def workspace_budget(ws: WorkspaceId, caller: Caller, outbox: OutboxDep) -> BudgetOut:
    """What the workspace holds against its byte budget, part by part, and that budget: a
    few fields read, no entry. Past the budget its accepts, edits and retries are refused
    (429 ``workspace_bytes_full``)."""
    use = await outbox.overview.budget(ws)
    return BudgetOut(
        used=use.used, queued=use.queued, logs=use.logs, markers=use.markers, limit=use.limit
    )


@router.get("/v1/workspaces/{ws}/sessions/{ses}/history", responses=errors())
async def session_history(
    ws: WorkspaceId,
    ses: SessionId,
    caller: Caller,
    outbox: OutboxDep,
    events: Events = 100,
) -> HistoryOut:
    """The session's recently delivered prompts, newest first, with when and how long their
    turn took: read from the newest ``events`` of its event log (which keeps
    ``event_log_len`` events for ``event_log_ttl``)."""
    found = await outbox.overview.history(ws, ses, events)
    return HistoryOut(delivered=[_delivered(d) for d in found])
