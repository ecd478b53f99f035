"""The walks over every workspace: the registry, each workspace's sessions, their lists in
bulk, their tallies, SCAN for what the registry lost, pruning and cleanup. O(workspaces) by
nature, so maintenance, recovery, counts and operator actions use them, never the delivery
path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ..core.entry import Status
from ..core.errors import InvalidInput
from ..core.keys import SessionKeys, WorkspaceKeys, buckets, status_total
from ..core.turns import is_turn
from .client import Client
from .dueindex import DueIndex
from .replies import Tally, WorkspaceTally, counts, ms_or_none, text

CLEANUP_PASSES = 3
"""SCAN-and-delete passes a cleanup makes at most (see ``cleanup_workspace``)."""
_WALK_BATCH = 256  # workspaces whose session sets one pipelined read of all_sessions takes


@dataclass(frozen=True, slots=True)
class WorkspaceSessions:
    """One registered workspace, its registry generation (the server's clock in us at its
    last mark), and the sessions asked for."""

    workspace: WorkspaceKeys
    generation: str
    sessions: list[SessionKeys]

    @property
    def touched_ms(self) -> int:
        """When a writer last marked the workspace (server clock, ms)."""
        return int(self.generation) // 1000 if self.generation else 0


class Walk:
    """Reads and writes over every workspace, for one Store (``Store.walk``)."""

    def __init__(self, client: Client, due: DueIndex) -> None:
        self.client = client
        self.due = due

    async def workspaces(self) -> dict[str, str]:
        """Registered workspaces -> generation (see ``WorkspaceSessions``)."""
        return await self.due.workspaces()

    async def sessions_of(
        self, w: WorkspaceKeys, *, with_errors: bool = False
    ) -> list[SessionKeys]:
        """The workspace's sessions holding any entry (or, ``with_errors``, an error entry)."""
        key = w.errors if with_errors else w.sessions
        members: set[Any] = await self.client.smembers(key)  # type: ignore[misc]
        return [SessionKeys(w.ws, s) for s in sorted(text(x) for x in members)]

    async def all_sessions(
        self, *, with_errors: bool = False, unless: Mapping[str, str] | None = None
    ) -> AsyncIterator[WorkspaceSessions]:
        """Every registered workspace with its sessions (see ``sessions_of``): the one walk
        over "all workspaces, all sessions" that maintenance, recovery and counts share. The
        session sets are read in pipelined batches (this walk is O(workspaces) by nature).
        ``unless`` leaves out the workspaces whose generation is still the one it names."""
        registered = sorted((await self.workspaces()).items())
        if unless:
            registered = [(ws, gen) for ws, gen in registered if unless.get(ws) != gen]
        for i in range(0, len(registered), _WALK_BATCH):
            batch = registered[i : i + _WALK_BATCH]
            pipe = self.client.pipeline(transaction=False)
            for ws, _ in batch:
                w = WorkspaceKeys(ws)
                pipe.smembers(w.errors if with_errors else w.sessions)
            for (ws, generation), members in zip(
                batch, await pipe.execute(raise_on_error=True), strict=True
            ):
                sessions = [SessionKeys(ws, s) for s in sorted(text(x) for x in members)]
                yield WorkspaceSessions(WorkspaceKeys(ws), generation, sessions)

    async def workspace_page(self, cursor: str, limit: int) -> tuple[list[str], str]:
        """Up to ``limit`` registered workspaces from ``cursor`` ('' to start), and the cursor
        of the rest ('' at the end). HSCAN over the buckets' registries, so a page costs
        O(limit) whatever the number of workspaces. The order is the server's; as with SCAN,
        a workspace registered or dropped meanwhile may be missed or met twice.

        The cursor is ``bucket:hscan-cursor:skip``: HSCAN hands out whole batches, and a page
        that ends inside one asks for the same batch again and skips what it took."""
        b, pos, skip = _page_cursor(cursor)
        registries = [x.registry for x in buckets()]
        found: list[str] = []
        while b < len(registries) and len(found) < limit:
            after, rows = await self.client.hscan(registries[b], pos, count=max(limit, 16))
            names = [text(x) for x in rows][skip:]
            taken = names[: limit - len(found)]
            found.extend(taken)
            if len(taken) < len(names):
                return found, f"{b}:{pos}:{skip + len(taken)}"
            b, pos, skip = (b, int(after), 0) if int(after) else (b + 1, 0, 0)
        return found, f"{b}:{pos}:0" if b < len(registries) else ""

    async def session_sizes(self, w: WorkspaceKeys) -> list[tuple[SessionKeys, int]]:
        """The workspace's sessions holding entries, with how many each holds (queue and
        staging): one SMEMBERS, then two LLEN a session in one pipelined round trip."""
        sessions = await self.sessions_of(w)
        if not sessions:
            return []
        pipe = self.client.pipeline(transaction=False)
        for k in sessions:
            pipe.llen(k.queue)
            pipe.llen(k.staging)
        n = [int(x) for x in await pipe.execute(raise_on_error=True)]
        return [(k, n[2 * i] + n[2 * i + 1]) for i, k in enumerate(sessions)]

    async def workspace_tallies(self, names: Sequence[str]) -> list[WorkspaceTally]:
        """Each named workspace's entries by status and oldest pending entry (the tally the
        scripts keep, ``lua/lib.lua``), and how many of its sessions hold entries: SCARD, one
        HMGET of its totals and the first of its oldest-pending index, a workspace, in one
        pipelined round trip. O(names), whatever the workspaces hold: no entry is read."""
        if not names:
            return []
        fields = [status_total(s) for s in Status]
        pipe = self.client.pipeline(transaction=False)
        for ws in names:
            w = WorkspaceKeys(ws)
            pipe.scard(w.sessions)
            pipe.hmget(w.count, fields)
            pipe.zrange(w.oldest, 0, 0, withscores=True)
        answers = await pipe.execute(raise_on_error=True)
        out = []
        for i, ws in enumerate(names):
            sessions, by_status, first = answers[3 * i : 3 * i + 3]
            oldest = ms_or_none(first[0][1]) if first else None
            out.append(WorkspaceTally(ws, int(sessions), Tally(counts(by_status), oldest)))
        return out

    async def all_tallies(self) -> AsyncIterator[WorkspaceTally]:
        """``workspace_tallies`` of every registered workspace, in pipelined batches: the
        entry counts (``stats``, the metrics gauge) at O(workspaces), no entry read."""
        async for tally, _ in self.all_tallies_and_turns(with_turns=False):
            yield tally

    async def all_tallies_and_turns(
        self, *, with_turns: bool = True
    ) -> AsyncIterator[tuple[WorkspaceTally, int]]:
        """``all_tallies``, each with the workspace's sessions in turn (0 unasked): held by a
        worker or not (``deliver_once``, another process, a dead worker's), as
        ``sessions_in_turn`` counts them, in the same batches."""
        registered = sorted(await self.workspaces())
        for i in range(0, len(registered), _WALK_BATCH):
            batch = registered[i : i + _WALK_BATCH]
            tallies = await self.workspace_tallies(batch)
            held = await self.sessions_in_turn(batch) if with_turns else [0] * len(batch)
            for tally, n in zip(tallies, held, strict=True):
                yield tally, n

    async def sessions_in_turn(self, names: Sequence[str]) -> list[int]:
        """Each named workspace's sessions whose lock is a turn now: the members of its
        ``in_turn`` index (every claim that began a turn), each lock read to drop those whose
        turn lapsed. Two pipelined round trips, O(sessions in turn): no entry is read."""
        pipe = self.client.pipeline(transaction=False)
        for ws in names:
            pipe.zrange(WorkspaceKeys(ws).in_turn, 0, -1)
        members: list[list[Any]] = await pipe.execute(raise_on_error=True)
        pairs = zip(names, members, strict=True)
        locks = [SessionKeys(ws, text(m)).lock for ws, ms in pairs for m in ms]
        if not locks:
            return [0] * len(names)
        pipe = self.client.pipeline(transaction=False)
        for lock in locks:
            pipe.get(lock)
        values = iter(await pipe.execute(raise_on_error=True))
        return [sum(is_turn(text(v)) for v in islice(values, len(ms)) if v) for ms in members]

    async def staging_lengths(self, keys: Sequence[SessionKeys]) -> list[int]:
        """Each session's staging length (one pipelined round trip)."""
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.llen(k.staging)
        return [int(n) for n in await pipe.execute(raise_on_error=True)]

    async def prune_idle_workspace(self, w: WorkspaceKeys, generation: str) -> bool:
        """Drop an idle workspace from the registry unless a writer marked it since
        ``generation`` was read (that read came first: a racing accept changes it)."""
        sessions: int = await self.client.scard(w.sessions)  # type: ignore[misc]
        owed: int = await self.client.hlen(w.notices)  # type: ignore[misc]
        if sessions or owed:
            return False
        return await self.due.prune(w, generation)

    async def cleanup_workspace(self, w: WorkspaceKeys) -> int:
        """Delete every key of the workspace, and no other's (an admin action, not a tick).
        One SCAN with the workspace's pattern, then ``WorkspaceKeys.owns`` keeps only the keys
        under its exact prefixes: the pattern alone also matches another workspace's session
        named like this one. (One pass over the keyspace, where a SCAN per prefix would make
        one pass each; the workspace's own indexes would miss the dedupe markers, claim
        markers and event logs of sessions that hold no entry now.) Out of the registry first:
        an accept racing the cleanup registers it again (its entry may survive, and must stay
        found)."""
        await self.due.forget(w)
        removed = 0
        # Again while a pass still found keys: a delivery under way when the cleanup began
        # may write once more (a lease it took again, a recovery) behind the first pass's
        # SCAN. What a writer adds after the last pass stays (an accept racing the cleanup
        # is kept on purpose); running the cleanup again removes the rest.
        for _ in range(CLEANUP_PASSES):
            found = await self._delete_owned(w)
            removed += found
            if not found:
                break
        return removed

    async def _delete_owned(self, w: WorkspaceKeys) -> int:
        removed = 0
        batch: list[Any] = []
        async for key in self.client.scan_iter(match=w.scan_pattern, count=500):
            if not w.owns(text(key)):
                continue
            batch.append(key)
            if len(batch) >= 500:
                removed += int(await self.client.delete(*batch))
                batch.clear()
        if batch:
            removed += int(await self.client.delete(*batch))
        return removed

    async def scan_workspaces(self) -> set[str]:
        """Workspaces that hold sessions or owed calls, found by SCAN on every primary, not
        by the registry: what a full repair uses to find one the registry lost (a node that
        failed over before its replica had the registry write)."""
        found: set[str] = set()
        for pattern in (WorkspaceKeys("*").sessions, WorkspaceKeys("*").notices):
            async for key in self.client.scan_iter(match=pattern, count=1000):
                name = text(key)
                found.add(name[name.index("{") + 1 : name.rindex("}")])
        return found


def _page_cursor(cursor: str) -> tuple[int, int, int]:
    """(bucket, HSCAN cursor, items to skip) of a ``workspace_page`` cursor."""
    if not cursor:
        return 0, 0, 0
    parts = cursor.split(":")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts):
        raise InvalidInput(f"not a workspace page cursor: {cursor!r}")
    b, pos, skip = (int(p) for p in parts)
    if b >= len(buckets()) or pos >= 2**64:  # HSCAN takes an unsigned 64-bit cursor
        raise InvalidInput(f"not a workspace page cursor: {cursor!r}")
    return b, pos, skip
