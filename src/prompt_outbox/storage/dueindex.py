"""The due index: which workspaces a run loop must visit, and by when, in O(due work).

A workspace's work lives in its own slot (``outboxready:{ws}``, kept by every session script).
The run loops need the other direction, "which workspaces have work due", without reading
every workspace. ``BUCKETS`` global ZSETs hold one *mark* per workspace: a time by which some
loop must visit it, never later than its earliest due work. A tick reads each bucket once.

The marks live in other slots than the workspaces, so no script can update both: the rule
that keeps this safe is the stage-out ordering (docs/contract.md, Crash ordering: copy
before removing), applied to an index.

- A writer whose transition may make work due sooner marks BEFORE it (``mark``: ZADD LT, a new
  generation in the bucket's registry, and one more pending writer) and AFTER it (one fewer),
  with the wake-up. A crash before the transition leaves a stale mark (one empty visit); a
  crash after it leaves the first mark. On a standalone server every key is on one server, so
  the transition and its mark run as one script instead (``in_script``): nothing to order.
- A holder letting a lock go (release, a drain's last acquire) marks ALONE after, when its
  script says its session's work moved earlier. While a lock is held the mark is no later
  than its lease expiry (the loop put it there), so a crash before that mark costs at most a
  lease.
- A loop raises or drops a mark only by compare-and-set (``unmark``) against the mark and
  generation it read BEFORE it read the workspace: a writer that marked since wins. While a
  workspace has a pending writer younger than ``grace`` (its transition may not have landed
  yet), the mark stays no later than that writer's BEFORE mark + grace.

The registry HASH (workspace -> generation, the server's clock in microseconds) is also the
list of workspaces that admin and maintenance walk. docs/design.md, "Finding due work", has the
whole argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from valkey.commands.core import AsyncScript

from ..core.keys import LEGACY_WORKSPACES, WorkspaceKeys, buckets
from .replies import Compared, Ok, parse, text
from .topology import Topology

MarkKind = Literal["before", "after", "alone"]
"""mark.lua's ARGV[3]: before a transition, after it, or for a change already in place."""


@dataclass(frozen=True, slots=True)
class Mark:
    """A workspace in the due index: visit by ``score_ms``; ``generation`` read with it."""

    ws: str
    score_ms: int
    generation: str


@dataclass(frozen=True, slots=True)
class Visit:
    """One workspace's work as a loop visit reads it."""

    due: list[str]
    """Sessions due now (at most the limit asked for)."""
    next_ready_ms: int | None
    """The earliest later ready score."""
    next_notice_ms: int | None
    """When the earliest owed OnDelivered call falls due (``outboxnotifydue:{ws}``)."""


def _scored(rows: Sequence[Any]) -> list[tuple[str, int]]:
    return [(text(member), int(score)) for member, score in rows]


def _visit(ready: Sequence[Any], notice: Sequence[Any], now_ms: int, limit: int) -> Visit:
    """A visit from its two reads (``DueIndex._queue_visit``)."""
    scored = _scored(ready)
    later = [score for _, score in scored if score > now_ms]
    return Visit(
        [ses for ses, score in scored if score <= now_ms][:limit],
        later[0] if later else None,
        _scored(notice)[0][1] if notice else None,
    )


class DueIndex:
    """Reads and writes of the due index and the workspace registry (the bucket keys)."""

    def __init__(self, topology: Topology, scripts: dict[str, AsyncScript]) -> None:
        self.topology = topology
        self.client: Any = topology.client
        self._scripts = scripts

    # -- writers ---------------------------------------------------------------------------

    @staticmethod
    def in_script(ws: str, by_ms: int) -> tuple[list[str], list[Any]]:
        """The KEYS and ARGV that a ``<name>_marked`` script takes after its transition's own
        (``lua/marked.lua``): the transition and its mark as one script."""
        b = WorkspaceKeys(ws).bucket
        return b.script_keys(), [ws, by_ms, b.wake]

    async def mark(self, ws: str, by_ms: int, kind: MarkKind = "alone") -> None:
        """Some loop must visit ``ws`` by ``by_ms`` (only ever lowers a mark). ``before`` a
        transition that may not land, ``after`` it (closing that ``before``), or ``alone``
        for a change already in place; the last two publish the workspace, so idle loops
        look at once."""
        b = WorkspaceKeys(ws).bucket
        args: list[str | int] = [ws, by_ms, kind, b.wake]
        parse(Ok, await self._scripts["mark"](keys=b.script_keys(), args=args))

    # -- the run loop ----------------------------------------------------------------------

    async def _scan(self, now_ms: int, limit: int) -> tuple[list[tuple[str, int]], int | None]:
        """One read per bucket: the due marks (workspace, score; at most ``limit`` a bucket)
        and the earliest later one (``now_ms`` when a bucket may hold more due marks than it
        gave)."""
        every = buckets()
        pipe = self.client.pipeline(transaction=False)
        for b in every:
            pipe.zrange(b.due, 0, limit - 1, withscores=True)
        answers = await pipe.execute(raise_on_error=True)
        found: list[tuple[str, int]] = []
        next_ms: int | None = None
        for rows in answers:
            scored = _scored(rows)
            due = [(ws, score) for ws, score in scored if score <= now_ms]
            later = [score for _, score in scored if score > now_ms]
            found += due
            if len(due) >= limit:
                next_ms = now_ms
            elif later and (next_ms is None or later[0] < next_ms):
                next_ms = later[0]
        return found, next_ms

    async def due_visits(
        self, now_ms: int, limit: int
    ) -> tuple[list[tuple[Mark, Visit]], int | None]:
        """Each workspace marked due with what a visit reads of it (its sessions due now, at
        most ``limit``, its next ready score and its next owed call), and when the next mark
        falls due."""
        found, next_ms = await self._scan(now_ms, limit)
        return await self._read(found, now_ms, limit), next_ms

    async def visits_of(
        self, workspaces: Sequence[str], now_ms: int, limit: int
    ) -> list[tuple[Mark, Visit]]:
        """``due_visits`` for named workspaces (a wake-up names its workspace, so the loop
        need not scan the buckets first); those with no mark any more are left out."""
        read = await self._read([(ws, None) for ws in workspaces], now_ms, limit)
        return [(m, v) for m, v in read if m.score_ms >= 0]

    async def _read(
        self, due: Sequence[tuple[str, int | None]], now_ms: int, limit: int
    ) -> list[tuple[Mark, Visit]]:
        """For each workspace its mark (score as given, or read when None; -1 when absent)
        and generation, then its visit. The generations are read BEFORE the
        workspaces (unmark.lua relies on it): ``Topology.in_order``."""
        if not due:
            return []

        def read_marks(pipe: Any) -> None:
            for ws, score in due:
                b = WorkspaceKeys(ws).bucket
                if score is None:
                    pipe.zscore(b.due, ws)
                pipe.hget(b.registry, ws)

        def read_visits(pipe: Any) -> None:
            for ws, _ in due:
                self._queue_visit(pipe, WorkspaceKeys(ws), limit)

        answers = await self.topology.in_order(read_marks, read_visits)
        at = 0
        marks = []
        for ws, score in due:
            if score is None:
                read, at = answers[at], at + 1
                score = -1 if read is None else int(float(read))
            gen, at = answers[at], at + 1
            marks.append(Mark(ws, score, "" if gen is None else text(gen)))
        reads = answers[at:]
        return [
            (m, _visit(reads[2 * i], reads[2 * i + 1], now_ms, limit)) for i, m in enumerate(marks)
        ]

    @staticmethod
    def _queue_visit(pipe: Any, w: WorkspaceKeys, limit: int) -> None:
        # The ready set in ONE read (the lowest limit + 1 scores): two reads, due then later,
        # could miss a session whose score moved from one side to the other between them.
        pipe.zrange(w.ready, 0, limit, withscores=True)
        pipe.zrange(w.notices_due, 0, 0, withscores=True)

    async def unmark(self, moves: Sequence[tuple[Mark, int | None]], grace_ms: int) -> list[bool]:
        """Move each mark to its time (None: drop it) unless a writer marked it since it was
        read; while a pending writer's BEFORE mark is younger than ``grace_ms``, the mark
        stays no later than that mark + grace. One pipeline on a standalone server;
        concurrent calls on a cluster (which refuses scripts in a pipeline). True where the
        move landed."""
        if not moves:
            return []
        script = self._scripts["unmark"]
        calls = []
        for mark, next_ms in moves:
            args: list[str | int] = [
                mark.ws,
                mark.score_ms,
                mark.generation,
                "" if next_ms is None else next_ms,
                grace_ms,
            ]
            calls.append((WorkspaceKeys(mark.ws).bucket.script_keys(), args))
        replies = await self.topology.run_each(script, calls)
        return [parse(Compared, reply)[0] is Compared.OK for reply in replies]

    async def remark(self, w: WorkspaceKeys) -> bool:
        """Mark the workspace by its earliest ready or owed work, if any (the repair pass);
        whether it has any."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(w.ready, 0, 0, withscores=True)
        pipe.zrange(w.notices_due, 0, 0, withscores=True)
        scores = [
            score for rows in await pipe.execute(raise_on_error=True) for _, score in _scored(rows)
        ]
        if scores:
            await self.mark(w.ws, min(scores))
        return bool(scores)

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
        await self.client.hdel(b.pending, w.ws)

    @staticmethod
    def wake_channels() -> list[str]:
        """The shard channels marks publish on: a run loop subscribes to all of them."""
        return [b.wake for b in buckets()]

    async def ask_abort(self, ws: str, ses: str, entry_id: str) -> None:
        """whileBusy interrupt: ask whichever run loop is delivering ``entry_id`` of ``ws`` /
        ``ses`` to abort its turn, on the workspace's wake channel, which every loop hears.
        Best effort, as pub/sub is: a loop resubscribing at that moment misses it."""
        channel, message = WorkspaceKeys(ws).bucket.wake, abort_message(ws, ses, entry_id)
        # execute_command: valkey-py 6.2's cluster client has no spublish(), but routes the
        # command by its channel (listed in storage/compat.py; tests/test_compat.py pins it).
        await self.client.execute_command("SPUBLISH", channel, message)

    async def migrate_legacy_registry(self, now_ms: int) -> int:
        """Fold the pre-index registry (``outboxworkspaces``) into the buckets, marking each
        workspace due now so a loop visits it once, then delete it. Idempotent; returns how
        many workspaces it moved."""
        rows = await self.client.zrange(LEGACY_WORKSPACES, 0, -1)
        for ws in rows:
            await self.mark(text(ws), now_ms)
        if rows:
            await self.client.delete(LEGACY_WORKSPACES)
        return len(rows)


_ABORT = "abort"


def abort_message(ws: str, ses: str, entry_id: str) -> str:
    """The wake-channel message that asks for an abort. IDs hold no spaces (``check_id``), so
    it cannot be taken for a workspace's name, which is what a mark publishes."""
    return f"{_ABORT} {ws} {ses} {entry_id}"


def parse_abort(message: str) -> tuple[str, str, str] | None:
    """``(ws, ses, entry ID)`` of an abort message; None for anything else (a workspace)."""
    words = message.split(" ")
    if len(words) != 4 or words[0] != _ABORT:
        return None
    return words[1], words[2], words[3]
