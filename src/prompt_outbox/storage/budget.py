"""The byte budgets' storage side (docs/design.md, "What one tenant may store"): a workspace's
budget, a share of the memory of the node that holds it (``MemoryCeiling``'s cached reading),
and what it holds against it (``holding.lua``: a few fields the scripts keep, no entry read).
The scripts that refuse past a budget (accept, edit, a client's retry) are given it in bytes
by ``Store``; the API sums ``holding`` over a token's workspaces for the token's budget."""

from __future__ import annotations

from ..core.keys import SessionKeys, WorkspaceKeys, bytes_field
from .client import Client
from .memory import Memory, MemoryCeiling
from .replies import Holding, Ok, parse
from .turnstore import Run


class Budgets:
    """``share`` of a node's memory per workspace; ``run`` runs a script (``Store._run``)."""

    def __init__(self, client: Client, memory: MemoryCeiling, share: float, run: Run) -> None:
        self.client = client
        self.memory = memory
        self.share = share
        self._run = run

    async def reading(self, key: str) -> Memory:
        """The memory reading of the node that owns ``key`` (cached)."""
        return await self.memory.reading(key)

    async def limit(self, key: str) -> int:
        """The budget, in bytes, of the workspace that owns ``key`` (0: none)."""
        return (await self.memory.reading(key)).budget(self.share)

    async def holding(self, w: WorkspaceKeys) -> Holding:
        """What the workspace holds against its budget (holding.lua)."""
        _, payload = parse(Ok, await self._run("holding", [w.count, w.log_bytes], []))
        return Holding.of(payload)

    async def session_bytes(self, k: SessionKeys) -> int:
        """What the session's queue and staging hold (their entries' strings and 64 B each, as
        the scripts keep it: ``lib.lua`` ``entry_bytes``; 0 for a session no script of this
        version has written)."""
        raw = await self.client.hget(k.workspace.count, bytes_field(k.ses))  # type: ignore[misc]
        return int(raw or 0)
