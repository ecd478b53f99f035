"""The walks over every workspace: the registry, each workspace's sessions, their lists in
bulk, SCAN for what the registry lost, pruning and cleanup. O(workspaces) by nature, so
maintenance, recovery, counts and operator actions use them, never the delivery path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.keys import SessionKeys, WorkspaceKeys
from .client import Client
from .dueindex import DueIndex
from .replies import text

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

    async def session_entries(self, keys: Sequence[SessionKeys]) -> list[list[str]]:
        """Each session's staging then queue, raw (one pipelined round trip)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.lrange(k.staging, 0, -1)
            pipe.lrange(k.queue, 0, -1)
        answers = await pipe.execute(raise_on_error=True)
        return [[text(x) for x in answers[i] + answers[i + 1]] for i in range(0, len(answers), 2)]

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
        """Delete every key of the workspace (found by pattern: an admin action, not a tick).
        Out of the registry first: an accept racing the cleanup registers it again (its
        entry may survive the cleanup, and must stay found)."""
        await self.due.forget(w)
        removed = 0
        batch: list[Any] = []
        async for key in self.client.scan_iter(match=w.scan_pattern, count=500):
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
