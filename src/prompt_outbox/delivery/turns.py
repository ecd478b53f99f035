"""Sessions held in turn (DESIGN.md §8, core/turns.py): checking a turn nobody heard end, and
ending one, from whatever learned it (a watcher, the end route, a check).

No worker holds a turn: its record is the session's lock in Valkey, due at its check time.
A check is a short visit by any worker's run loop (``Engine.step`` on acquire.lua's TURN
reply); an end is one script call that lets the session's next entry go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..core import machine, turns
from ..core.callbacks import Aborter, Deliverer, TurnEnd, TurnState, TurnWatcher
from ..core.keys import SessionKeys
from ..core.metrics import Metrics
from ..core.settings import Tunables
from ..storage.store import Store

log = logging.getLogger("prompt_outbox")
T = TypeVar("T")


class Turns:
    """Check and end the turns of one Outbox's sessions."""

    def __init__(
        self,
        store: Store,
        tunables: Tunables,
        metrics: Metrics,
        now_ms: Callable[[], int],
        bookkeep: Callable[[str, Callable[[], Awaitable[bool]]], Awaitable[bool | None]],
    ) -> None:
        self.store = store
        self.tunables = tunables
        self.metrics = metrics
        self.now_ms = now_ms
        self._bookkeep = bookkeep

    def hold(self, turn_id: str, entry_id: str, *, check_now: bool) -> tuple[str, int]:
        """The lock value and expiry (ms) of a turn that begins now."""
        t = self.tunables
        begun = turns.started(turn_id, entry_id, self.now_ms(), t, check_now=check_now)
        self.metrics.turns_started.inc()
        return begun.encode(), turns.hold_ms(t)

    async def end(self, k: SessionKeys, turn_id: str, why: str = turns.ENDED) -> TurnEnd:
        """End the session's turn of that ID, if it still holds it; its next entry is then due."""
        now = self.now_ms()
        since = await self.store.end_turn(k, turn_id, now, why)
        if since is None:
            return TurnEnd(False)
        seconds = max(0.0, (now - since) / 1000)
        self.metrics.turns_ended.labels(why=why).inc()
        self.metrics.turn_seconds.observe(seconds)
        log.info(
            "turn ended",
            extra={"ws": k.ws, "ses": k.ses, "turn": turn_id, "why": why, "seconds": seconds},
        )
        return TurnEnd(True, seconds)

    async def check(self, k: SessionKeys, value: str, deliverer: Deliverer) -> bool:
        """Ask the agent about a turn whose check came (``value``: the lock as acquire.lua
        handed it out); True if the turn ended (the session's next entry may go)."""
        hold = turns.decode_turn(value)
        if hold is None:
            return False
        state, reason = TurnState.RUNNING, ""  # nobody to ask: the ceiling lets it go
        if isinstance(deliverer, TurnWatcher):
            answer, failure = await self._bounded(deliverer.turn_state(k.ws, k.ses, hold.turn))
            if failure is not None:
                state, reason = TurnState.UNKNOWN, machine.describe(failure)
            elif isinstance(answer, TurnState):
                state = answer
                reason = "the agent could not be asked"
            else:
                state, reason = TurnState.UNKNOWN, f"turn_state answered {answer!r:.80}"
        self.metrics.turn_checks.labels(state=state.value).inc()
        now = self.now_ms()
        aborter = deliverer if isinstance(deliverer, Aborter) else None
        decision = turns.after_check(
            hold, state, reason, now, self.tunables, can_abort=aborter is not None
        )
        if decision.abort and aborter is not None:
            await self._abort(k, aborter, hold)
        if decision.end:
            return (await self.end(k, hold.turn, decision.end)).ended
        if decision.keep is not None:
            new = decision.keep.encode()
            await self._bookkeep("turn check", lambda: self.store.keep_turn(k, value, new, now))
        return False

    async def _abort(self, k: SessionKeys, aborter: Aborter, hold: turns.TurnHold) -> None:
        _, failure = await self._bounded(aborter.abort(k.ws, k.ses))
        self.metrics.aborts.labels(outcome="failed" if failure else "asked").inc()
        log.info(
            "abort of the turn asked",
            extra={"ws": k.ws, "ses": k.ses, "turn": hold.turn, "error": repr(failure or "")},
        )

    async def _bounded(self, call: Awaitable[T]) -> tuple[T | None, BaseException | None]:
        """A call to the agent within the check's lease (acquire.lua moved the next check that
        far ahead): its answer, or what it raised."""
        try:
            async with asyncio.timeout(self.tunables.lease_ttl):
                return await call, None
        except Exception as exc:
            return None, exc
