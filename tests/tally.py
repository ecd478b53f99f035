"""The tally the session scripts keep for the overview and the counts (lua/lib.lua, "the
tally"), as stored and as it must be: recounted from the lists themselves, which are found by
SCAN, not by any index."""

from __future__ import annotations

from typing import Any

from prompt_outbox.core.entry import Status, decode_entry
from prompt_outbox.core.keys import (
    BYTES_TOTAL,
    COUNT_SEP,
    COUNT_TOTAL,
    SessionKeys,
    WorkspaceKeys,
    tally_field,
)
from prompt_outbox.core.timeutil import to_ms
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.replies import text

Tallied = dict[str, dict[str, object]]
"""``{"sessions": session -> its field ("p,d,v,e,k,sent" in Status order), "totals": the
workspace's non-zero totals by status, "oldest": session -> ms}``."""


def is_tally_field(field: str) -> bool:
    """A field of the count HASH that the tally keeps (the others are the quota's count and
    the queued bytes)."""
    if field.startswith(":"):
        return field not in (COUNT_TOTAL, BYTES_TOTAL)
    return field == tally_field(field.partition(COUNT_SEP)[0])


def is_bytes_field(field: str) -> bool:
    """A field of the count HASH that the queued bytes keep (lib.lua ``sized``)."""
    return field == BYTES_TOTAL or field.endswith(f"{COUNT_SEP}bytes")


async def sessions_in(client: Client, ws: str) -> set[str]:
    """The workspace's sessions that have a queue or a staging list, found by SCAN."""
    sessions: set[str] = set()
    for prefix in ("outboxq", "outboxd"):
        async for key in client.scan_iter(match=f"{prefix}:{{{ws}}}:*", count=1000):
            name = text(key)
            sessions.add(name[name.index("}:{") + 3 : -1])
    return sessions


async def stored(client: Client, ws: str) -> Tallied:
    """The tally as the scripts left it (a total at 0 is left out: it may stay stored)."""
    w = WorkspaceKeys(ws)
    raw: dict[Any, Any] = await client.hgetall(w.count)  # type: ignore[misc]
    fields = {text(f): text(v) for f, v in raw.items() if is_tally_field(text(f))}
    sessions = {f.partition(COUNT_SEP)[0]: v for f, v in fields.items() if COUNT_SEP in f}
    totals = {f[1:]: int(v) for f, v in fields.items() if f.startswith(":") and int(v)}
    oldest = await client.zrange(w.oldest, 0, -1, withscores=True)
    return {
        "sessions": sessions,
        "totals": totals,
        "oldest": {text(s): int(ms) for s, ms in oldest},
    }


async def recounted(client: Client, ws: str) -> Tallied:
    """What the tally must be, from every entry of the workspace's lists."""
    sessions: dict[str, object] = {}
    totals: dict[str, int] = {}
    oldest: dict[str, object] = {}
    for ses in await sessions_in(client, ws):
        k = SessionKeys(ws, ses)
        staged = [decode_entry(text(r)) for r in await client.lrange(k.staging, 0, -1)]  # type: ignore[misc]
        queued = [decode_entry(text(r)) for r in await client.lrange(k.queue, 0, -1)]  # type: ignore[misc]
        by = {str(s): 0 for s in Status}
        for e in [*staged, *queued]:
            by[e.status] += 1
            totals[e.status] = totals.get(e.status, 0) + 1
        sent = [to_ms(e.last_attempt_at) for e in staged if e.last_attempt_at is not None]
        if staged or queued:
            sessions[ses] = ",".join([*map(str, by.values()), str(min(sent)) if sent else ""])
        first = next((e for e in queued if e.status is Status.PENDING), None)
        if first is not None:
            oldest[ses] = to_ms(first.accepted_at)
    return {"sessions": sessions, "totals": dict(totals), "oldest": oldest}


async def sized(client: Client, ws: str) -> dict[str, int]:
    """The queued bytes as the scripts left them: each session's, and the total."""
    raw: dict[Any, Any] = await client.hgetall(WorkspaceKeys(ws).count)  # type: ignore[misc]
    return {text(f): int(v) for f, v in raw.items() if is_bytes_field(text(f))}


ENTRY_BYTES = 64
"""What an entry counts beside its string (``lua/lib.lua`` ``entry_bytes``)."""


async def resized(client: Client, ws: str) -> dict[str, int]:
    """What the queued bytes must be: each session's entries' strings and ``ENTRY_BYTES``
    each, from the lists themselves (found by SCAN)."""
    want: dict[str, int] = {}
    for ses in await sessions_in(client, ws):
        k = SessionKeys(ws, ses)
        n = 0
        for key in (k.queue, k.staging):
            raws = await client.lrange(key, 0, -1)  # type: ignore[misc]
            n += sum(
                len(raw if isinstance(raw, bytes) else raw.encode()) + ENTRY_BYTES for raw in raws
            )
        if n:
            want[f"{ses}{COUNT_SEP}bytes"] = n
    if want:
        want[BYTES_TOTAL] = sum(want.values())
    return want
