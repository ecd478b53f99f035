"""Sessions held in turn (core/turns.py) in Valkey: ending a turn, keeping one after a check,
and the owners' heartbeats. One room of the Store (``Store.turns``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.keys import OWNERS, SessionKeys, WorkspaceKeys
from .client import Client
from .dueindex import DueIndex
from .replies import Lock, TurnWrite, lowered_ms, parse, text

EARLY_END_MS = 60_000
"""How long an end that named a turn not held yet is kept for the claim that holds it: the
agent's end can outrun that claim (a webhook receiver that ends at once, a short opencode
turn). Kept only while the session has a send in flight (an entry staged, the lock a worker's
token): no other session has a claim to come, so an end for it writes nothing. Past it the end
is forgotten, and the turn is learned from a check."""


@dataclass(frozen=True, slots=True)
class EndedTurn:
    """A turn turn_end.lua ended: when it began (ms), its entry's ID and trace context."""

    since_ms: int
    entry: str = ""
    trace: str = ""


Run = Callable[[str, Sequence[str], Sequence[Any]], Awaitable[Any]]


class TurnStore:
    """The turn transitions (turn_end.lua, turn_check.lua) and the ``OWNERS`` heartbeats."""

    def __init__(self, client: Client, run: Run, due: DueIndex) -> None:
        self.client = client
        self._run = run
        self._due = due

    async def end_turn(
        self, k: SessionKeys, turn_id: str, now_ms: int, why: str
    ) -> EndedTurn | None:
        """End the session's turn of that ID (turn_end.lua): what it was, or None if the
        session holds no such turn (kept ``EARLY_END_MS`` for the claim of a send in flight,
        if one is). Marks the due index if that made work due sooner."""
        args = [k.ses, turn_id, now_ms, why, EARLY_END_MS]
        keys = [*k.script_keys(), k.workspace.turns, k.early_end, k.workspace.in_turn]
        word, rest = parse(TurnWrite, await self._run("turn_end", keys, args))
        if word is TurnWrite.GONE:
            return None
        lowered = lowered_ms(rest[1])
        if lowered is not None:
            await self._due.mark(k.ws, lowered)
        entry, trace = (text(rest[2]), text(rest[3])) if len(rest) > 3 else ("", "")
        return EndedTurn(int(text(rest[0])), entry, trace)

    async def keep_turn(
        self, k: SessionKeys, old: str, new: str, now_ms: int, owner: str = ""
    ) -> bool:
        """Swap a checked turn's value for its next one, owned by ``owner`` ('' none)
        (turn_check.lua); False if it moved."""
        keys = [*k.script_keys(), k.workspace.turns]
        reply = await self._run("turn_check", keys, [k.ses, old, new, now_ms, owner])
        return parse(TurnWrite, reply)[0] is TurnWrite.OK

    async def turn_owners(self, w: WorkspaceKeys) -> dict[str, str]:
        """The workspace's owned turns: session -> owner (a hint: check each lock)."""
        raw: dict[Any, Any] = await self.client.execute_command("HGETALL", w.turns)
        return {text(s): text(o) for s, o in raw.items()}

    async def lock_value(self, k: SessionKeys) -> str:
        """The session lock's value ('' when free)."""
        return text(await self.client.get(k.lock) or "")

    async def beat(self, owner: str, lapses_ms: int, now_ms: int) -> list[str]:
        """A worker's heartbeat (``OWNERS``): its own, then the owners whose heartbeat lapsed
        before ``now_ms`` (to release their turns: see ``claim_dead``)."""
        await self.client.zadd(OWNERS, {owner: lapses_ms})
        return [text(o) for o in await self.client.zrangebyscore(OWNERS, "-inf", now_ms)]

    async def claim_dead(self, owner: str, now_ms: int, lease_ms: int) -> bool:
        """Take the release of a lapsed owner's turns for ``lease_ms`` (owner_claim.lua): True
        for the one caller that did, who releases them, then calls ``forget_owner``."""
        reply = await self._run("owner_claim", [OWNERS], [owner, now_ms, lease_ms])
        return parse(Lock, reply)[0] is Lock.OK

    async def forget_owner(self, owner: str) -> None:
        """Take an owner off ``OWNERS``: its turns are released (or it stopped owning none)."""
        await self.client.zrem(OWNERS, owner)
