"""The reads behind the queue page's charts and a session's history: the workspace's
per-minute series the scripts keep (``lua/lib.lua`` ``series``), its oldest pending entry now,
and the newest events of a session's log. Each costs what it shows: at most ``SERIES_SLOTS``
small fields, or ``count`` events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.keys import SessionKeys, WorkspaceKeys
from .client import Client
from .replies import Ok, ms_or_none, parse, text
from .turnstore import Run

SERIES_SLOTS = 120
"""Minutes the ring in ``outboxseries:{ws}`` holds (lib.lua's ``SERIES_SLOTS``): two hours, so
that an hour's chart knows the oldest pending entry as it stood before its first minute."""


@dataclass(frozen=True, slots=True)
class SeriesMinute:
    """One minute of a workspace (``minute``: minutes since the epoch): prompts accepted,
    delivered and moved into error, and the oldest pending entry's ``acceptedAt`` (ms) after
    that minute's last change that counted one or moved the oldest (None: nothing was
    pending)."""

    minute: int
    accepted: int
    delivered: int
    failed: int
    oldest_pending_ms: int | None


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event of a session's log: its stream ID's time (server clock, ms), kind, entry ID,
    and, for a turn (its value) and a turn's end (its record), what it carries ('' for the
    others: their entries are never read here)."""

    at_ms: int
    kind: str
    entry: str
    body: str


def _minute(field: Any, value: Any) -> SeriesMinute | None:
    parts = text(value).split(",")
    if len(parts) != 5 or not all(p.isdigit() for p in parts[:4]):
        return None  # not a form this version writes: left out, never guessed
    minute, accepted, delivered, failed = (int(p) for p in parts[:4])
    if minute % SERIES_SLOTS != int(text(field)):
        return None
    return SeriesMinute(minute, accepted, delivered, failed, ms_or_none(parts[4]))


class Series:
    """The series and history reads of one Store: its ``client``, and ``run`` to run a
    script (``Store._run``)."""

    def __init__(self, client: Client, run: Run) -> None:
        self.client = client
        self._run = run

    async def minutes(self, w: WorkspaceKeys) -> tuple[list[SeriesMinute], int | None]:
        """The workspace's recorded minutes (oldest first; a slot holds its last lap only),
        and its oldest pending entry's ``acceptedAt`` now (ms; None when none is pending):
        one HGETALL of at most ``SERIES_SLOTS`` fields and one ZRANGE, pipelined."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(w.series)
        pipe.zrange(w.oldest, 0, 0, withscores=True)
        ring, first = await pipe.execute(raise_on_error=True)
        found = [_minute(f, v) for f, v in dict(ring).items()]
        rows = sorted((m for m in found if m is not None), key=lambda m: m.minute)
        return rows, ms_or_none(first[0][1]) if first else None

    async def recent_events(self, k: SessionKeys, count: int) -> list[LoggedEvent]:
        """The session's newest ``count`` events, newest first, without the entries they
        carry (history.lua): a few hundred bytes an event, whatever the entries hold."""
        _, flat = parse(Ok, await self._run("history", [k.events], [count]))
        out = []
        for i in range(0, len(flat), 4):
            event_id, kind, entry_id, body = (text(x) for x in flat[i : i + 4])
            out.append(LoggedEvent(int(event_id.partition("-")[0]), kind, entry_id, body))
        return out
