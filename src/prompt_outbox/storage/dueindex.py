"""The due index: which workspaces a run loop must visit, and by when, in O(due work).

A workspace's work lives in its own slot (``outboxready:{ws}``, kept by every session script).
The run loops need the other direction, "which workspaces have work due", without reading
every workspace. ``BUCKETS`` global ZSETs hold one *mark* per workspace: a time by which some
loop must visit it, never later than its earliest due work. A tick reads each bucket once.

The marks live in other slots than the workspaces, so no script can update both: the rule
that keeps this safe is the seed's stage-out ordering, applied to an index.

- A writer whose transition may make work due sooner marks BEFORE it (``mark``: ZADD LT, and a
  new generation in the bucket's registry) and again AFTER it, with the wake-up. A crash before
  the transition leaves a stale mark (one empty visit); a crash after it leaves the first mark.
- A holder letting a lock go (release, a drain's last acquire) marks after, when its script
  says the workspace's earliest work moved earlier. While a lock is held the mark is no later
  than its lease expiry (the loop put it there), so a crash before that mark costs at most a
  lease.
- A loop raises or drops a mark only by compare-and-set (``unmark``) against the mark and
  generation it read BEFORE it read the workspace: a writer that marked since wins. A writer
  that marked before the read but whose transition may not have landed yet (its generation is
  younger than ``grace``) keeps a mark no later than generation + grace.

The registry HASH (workspace -> generation, the server's clock in microseconds) is also the
list of workspaces that admin and maintenance walk. docs/design.md, "Finding due work", has the
whole argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from valkey.commands.core import AsyncScript

from ..core.keys import LEGACY_WORKSPACES, WAKE_CHANNEL, BucketKeys, WorkspaceKeys, buckets
from .replies import Compared, Ok, parse, text


@dataclass(frozen=True, slots=True)
class Mark:
    """A workspace in the due index: visit by ``score_ms``; ``generation`` read with it."""

    ws: str
    score_ms: int
    generation: str


@dataclass(frozen=True, slots=True)
class DueMarks:
    """What one read of every bucket found: marks due now, and the earliest later score."""

    due: list[Mark]
    next_ms: int | None


@dataclass(frozen=True, slots=True)
class Visit:
    """One workspace's work as a loop visit reads it."""

    due: list[str]
    """Sessions due now (at most the limit asked for)."""
    next_ready_ms: int | None
    """The earliest later ready score."""
    next_notice_ms: int | None
    """When the earliest owed OnDelivered call falls due (``outboxnotifydue:{ws}``)."""


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script call, ready to run alone or to be pipelined."""

    script: AsyncScript
    keys: list[str]
    args: list[Any]

    async def __call__(self) -> Any:
        return await self.script(keys=self.keys, args=self.args)


def _scored(rows: Sequence[Any]) -> list[tuple[str, int]]:
    return [(text(member), int(score)) for member, score in rows]


class DueIndex:
    """Reads and writes of the due index and the workspace registry (the bucket keys)."""

    def __init__(self, client: Any, scripts: dict[str, AsyncScript]) -> None:
        self.client = client
        self._scripts = scripts

    # -- writers ---------------------------------------------------------------------------

    def mark_call(self, ws: str, by_ms: int, *, wake: bool) -> ScriptCall:
        """One mark, unsent (the Store pipelines it around a transition)."""
        keys = WorkspaceKeys(ws).bucket.script_keys()
        args = [ws, by_ms, "1" if wake else "0", WAKE_CHANNEL]
        return ScriptCall(self._scripts["mark"], keys, args)

    async def mark(self, ws: str, by_ms: int, *, wake: bool) -> None:
        """Some loop must visit ``ws`` by ``by_ms`` (only ever lowers a mark); ``wake``
        publishes the workspace, so idle loops look at once."""
        parse(Ok, await self.mark_call(ws, by_ms, wake=wake)())

    # -- the run loop ----------------------------------------------------------------------

    async def due_marks(self, now_ms: int, limit: int) -> DueMarks:
        """The marks due now (at most ``limit`` per bucket) with their generations, and the
        earliest later mark: one read per bucket, plus one per bucket holding due marks."""
        every = buckets()
        pipe = self.client.pipeline(transaction=False)
        for b in every:
            pipe.zrange(b.due, 0, limit - 1, withscores=True)
        answers = await pipe.execute(raise_on_error=True)
        found: list[tuple[BucketKeys, list[tuple[str, int]]]] = []
        next_ms: int | None = None
        for b, rows in zip(every, answers, strict=True):
            due = []
            for ws, score in _scored(rows):
                if score <= now_ms:
                    due.append((ws, score))
                elif next_ms is None or score < next_ms:
                    next_ms = score
            if due:
                found.append((b, due))
        if not found:
            return DueMarks([], next_ms)
        pipe = self.client.pipeline(transaction=False)
        for b, due in found:
            pipe.hmget(b.registry, [ws for ws, _ in due])
        generations = await pipe.execute(raise_on_error=True)
        marks = [
            Mark(ws, score, "" if gen is None else text(gen))
            for (_, due), gens in zip(found, generations, strict=True)
            for (ws, score), gen in zip(due, gens, strict=True)
        ]
        return DueMarks(marks, next_ms)

    async def visit(self, w: WorkspaceKeys, now_ms: int, limit: int) -> Visit:
        """The workspace's sessions due now, its next ready score and its next owed call."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(w.ready, "-inf", now_ms, start=0, num=limit)
        pipe.zrangebyscore(w.ready, f"({now_ms}", "+inf", start=0, num=1, withscores=True)
        pipe.zrange(w.notices_due, 0, 0, withscores=True)
        due, later, notice = await pipe.execute(raise_on_error=True)
        return Visit(
            [text(ses) for ses in due],
            _scored(later)[0][1] if later else None,
            _scored(notice)[0][1] if notice else None,
        )

    async def unmark(self, mark: Mark, next_ms: int | None, grace_ms: int) -> bool:
        """Move the mark to ``next_ms`` (None: drop it) unless a writer marked it since it was
        read; a writer younger than ``grace_ms`` keeps it no later than its generation + grace."""
        w = WorkspaceKeys(mark.ws)
        args: list[str | int] = [
            mark.ws,
            mark.score_ms,
            mark.generation,
            "" if next_ms is None else next_ms,
            grace_ms,
        ]
        script = self._scripts["unmark"]
        word, _ = parse(Compared, await script(keys=w.bucket.script_keys(), args=args))
        return word is Compared.OK

    async def remark(self, w: WorkspaceKeys) -> None:
        """Mark the workspace by its earliest ready or owed work, if any (the repair pass)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(w.ready, 0, 0, withscores=True)
        pipe.zrange(w.notices_due, 0, 0, withscores=True)
        scores = [
            score for rows in await pipe.execute(raise_on_error=True) for _, score in _scored(rows)
        ]
        if scores:
            await self.mark(w.ws, min(scores), wake=False)

    # -- the registry ----------------------------------------------------------------------

    async def workspaces(self) -> dict[str, str]:
        """Registered workspaces -> generation (the server's clock, us, at their last mark)."""
        pipe = self.client.pipeline(transaction=False)
        for b in buckets():
            pipe.hgetall(b.registry)
        out: dict[str, str] = {}
        for rows in await pipe.execute(raise_on_error=True):
            out.update({text(ws): text(gen) for ws, gen in rows.items()})
        return out

    async def prune(self, w: WorkspaceKeys, generation: str) -> bool:
        """Drop the workspace from its bucket unless a writer marked it since ``generation``."""
        script = self._scripts["prune_workspace"]
        word, _ = parse(
            Compared, await script(keys=w.bucket.script_keys(), args=[w.ws, generation])
        )
        return word is Compared.OK

    async def forget(self, w: WorkspaceKeys) -> None:
        """Take the workspace out of its bucket unconditionally (cleanup: its keys are gone)."""
        b = w.bucket
        await self.client.zrem(b.due, w.ws)
        await self.client.hdel(b.registry, w.ws)

    async def migrate_legacy_registry(self, now_ms: int) -> int:
        """Fold the pre-index registry (``outboxworkspaces``) into the buckets, marking each
        workspace due now so a loop visits it once, then delete it. Idempotent; returns how
        many workspaces it moved."""
        rows = await self.client.zrange(LEGACY_WORKSPACES, 0, -1)
        for ws in rows:
            await self.mark(text(ws), now_ms, wake=False)
        if rows:
            await self.client.delete(LEGACY_WORKSPACES)
        return len(rows)
