"""Sessions held in turn (docs/design.md, "Turns"; core/turns.py): owning, checking and ending
turns.

No worker holds a turn with a task, a slot or a request: its record is the session's lock in
Valkey. A running worker (``keeping``) owns the turns it starts: a record each in memory,
asked about every ``turn_check_interval`` (a watcher answers from its stream), one heartbeat
in Valkey whatever it holds. A turn without a live owner is checked by whichever run loop
visits it (``Engine.step`` on acquire.lua's TURN reply), which then owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..core import machine, turns
from ..core.callbacks import (
    Aborter,
    Deliverer,
    Turn,
    TurnEnd,
    TurnEnded,
    TurnState,
    TurnWatcher,
)
from ..core.keys import SessionKeys, WorkspaceKeys
from ..core.logctx import log_context
from ..core.metrics import Metrics
from ..core.settings import Tunables
from ..core.stopping import loss_level
from ..storage.store import TRANSIENT_ERRORS, Store
from ..storage.turnstore import EndedTurn
from . import traced
from .tasks import Detached, settled

log = logging.getLogger("prompt_outbox")
T = TypeVar("T")
_ASKS_AT_ONCE = 64  # an owner's in-memory checks in flight together


@dataclass(slots=True)
class Owned:
    """A turn this worker owns: ~200 bytes, the whole cost of holding it here."""

    turn: str
    since_ms: int
    unsure: bool = False  # the last ask got no answer (and the turn's record says why)


@dataclass(frozen=True, slots=True)
class TurnClaim:
    """What a claim that begins a turn writes: the lock's value, its ID, the lock's expiry
    (ms) and its owner ('' none)."""

    value: str
    turn_id: str
    hold_ms: int
    owner: str


class Turns:
    """Own, check and end the turns of one Outbox's sessions."""

    def __init__(
        self,
        store: Store,
        tunables: Tunables,
        metrics: Metrics,
        now_ms: Callable[[], int],
        bookkeep: Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]],
    ) -> None:
        self.store = store
        self.tunables = tunables
        self.metrics = metrics
        self.now_ms = now_ms
        self._bookkeep = bookkeep
        self.owner = ""  # this worker's heartbeat ID while ``keeping``; '' owns nothing
        self.owned: dict[tuple[str, str], Owned] = {}
        # A turn of ours may be held that ``owned`` lacks (a claim or check whose reply was
        # lost): then our heartbeat is left to lapse at stop, for another to walk them all.
        self.unsure = False

    # -- a turn begins, is checked, ends ----------------------------------------------------

    def claim_of(
        self, k: SessionKeys, result: object, entry_id: str, *, verified: bool, trace: str = ""
    ) -> TurnClaim | None:
        """The turn a claim begins: the deliverer's ``Turn`` (``result``; None: no turn), or
        for a verified send of a watcher's deliverer one named by the entry, checked at once.
        ``trace``: the entry's trace context, which the turn's record keeps for its end."""
        if result is None:
            return None
        if not isinstance(result, Turn):
            log.warning(
                "the deliverer returned %r, not a Turn or None: no turn held",
                type(result).__name__,
                extra={"workspace": k.ws, "session": k.ses, "entry": entry_id},
            )
            return None
        t = self.tunables
        begun = turns.started(
            result.id, entry_id, self.now_ms(), t, owner=self.owner, check_now=verified, trace=trace
        )
        return TurnClaim(begun.encode(), result.id, turns.hold_ms(t), begun.owner)

    async def claimed(self, k: SessionKeys, held: TurnClaim, claimed: bool) -> None:
        """A claim that began ``held`` came back: own the turn; a claim whose reply was lost
        may have landed (``unsure``); a turn checked at once is due now."""
        if not claimed:
            self.unsure = True
            return
        self.metrics.turns_started.inc()
        hold = turns.decode_turn(held.value)
        self._own(k, hold)
        if hold is not None and hold.check_ms <= self.now_ms():
            await self.store.due.mark(k.ws, self.now_ms())

    def _own(self, k: SessionKeys, hold: turns.TurnHold | None) -> None:
        if hold is not None and hold.owner and hold.owner == self.owner:
            self.owned[(k.ws, k.ses)] = Owned(hold.turn, hold.since_ms)

    async def end(self, k: SessionKeys, turn_id: str, why: str = turns.ENDED) -> TurnEnd:
        """End the session's turn of that ID, if it still holds it; its next entry is then due."""
        now = self.now_ms()
        # Retried through a short outage: an end that never lands leaves the turn to a check
        # (owned, it is asked about again; and our heartbeat is left to lapse at stop).
        landed = await self._bookkeep("turn end", lambda: self._end_once(k, turn_id, now, why))
        if landed is None:
            self.unsure = True
            return TurnEnd(False)
        mine = self.owned.get((k.ws, k.ses))
        if mine is not None and mine.turn == turn_id:
            del self.owned[(k.ws, k.ses)]
        ended = landed[0]
        if ended is None:
            return TurnEnd(False)
        seconds = max(0.0, (now - ended.since_ms) / 1000)
        traced.turn_ended(k, turn_id, ended, why, seconds)
        self.metrics.turns_ended.labels(why=why).inc()
        self.metrics.turn_seconds.observe(seconds)
        log.info(
            "turn ended",
            extra={
                "workspace": k.ws,
                "session": k.ses,
                "turn": turn_id,
                "why": why,
                "seconds": seconds,
            },
        )
        return TurnEnd(True, seconds)

    async def _end_once(
        self, k: SessionKeys, turn_id: str, now: int, why: str
    ) -> tuple[EndedTurn | None]:
        return (await self.store.turns.end_turn(k, turn_id, now, why),)

    async def check(self, k: SessionKeys, value: str, deliverer: Deliverer) -> bool:
        """Ask the agent about a turn whose check came in Valkey (``value``: the lock as
        acquire.lua handed it out); True if the turn ended (the next entry may go)."""
        hold = turns.decode_turn(value)
        if hold is None:
            return False
        state, reason = await self._ask(k, hold.turn, deliverer)
        now = self.now_ms()
        aborter = deliverer if isinstance(deliverer, Aborter) else None
        decision = turns.after_check(
            hold, state, reason, now, self.tunables, can_abort=aborter is not None, owner=self.owner
        )
        if decision.abort and aborter is not None:
            await self._abort(k, aborter, hold)
        if decision.end:
            return (await self.end(k, hold.turn, decision.end)).ended
        if decision.keep is not None:
            new, owner = decision.keep.encode(), decision.keep.owner
            kept = await self._bookkeep(
                "turn check", lambda: self.store.turns.keep_turn(k, value, new, now, owner)
            )
            if kept:
                self._own(k, decision.keep)
            self.unsure = self.unsure or kept is None
        return False

    async def _ask(
        self, k: SessionKeys, turn_id: str, deliverer: Deliverer
    ) -> tuple[TurnState, str]:
        """What the agent says of the turn; nobody to ask (not a watcher): running, and the
        ceiling lets it go."""
        if not isinstance(deliverer, TurnWatcher):
            return TurnState.RUNNING, ""
        answer, failure = await self._bounded(deliverer.turn_state(k.ws, k.ses, turn_id))
        if failure is not None:
            state, reason = TurnState.UNKNOWN, machine.describe(failure)
        elif isinstance(answer, TurnState):
            state, reason = answer, "the agent could not say"
        else:
            state, reason = TurnState.UNKNOWN, f"turn_state answered {answer!r:.80}"
        self.metrics.turn_checks.labels(state=state.value).inc()
        return state, reason

    async def _abort(self, k: SessionKeys, aborter: Aborter, hold: turns.TurnHold) -> None:
        _, failure = await self._bounded(aborter.abort(k.ws, k.ses))
        self.metrics.aborts.labels(outcome="failed" if failure else "asked").inc()
        log.info(
            "abort of the turn asked",
            extra={
                "workspace": k.ws,
                "session": k.ses,
                "turn": hold.turn,
                "error": repr(failure or ""),
            },
        )

    async def _bounded(self, call: Awaitable[T]) -> tuple[T | None, BaseException | None]:
        """A call to the agent within the check's lease (acquire.lua moved the next check that
        far ahead): its answer, or what it raised."""
        return await settled(call, self.tunables.lease_ttl)

    # -- a running worker's ownership --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def keeping(
        self, deliverer: Deliverer, ended: TurnEnded, detached: Detached
    ) -> AsyncIterator[None]:
        """While a run loop runs: wire the deliverer's watcher to ``ended``, own the turns
        this worker starts (a heartbeat in Valkey, and the turns asked about in memory), and
        release the turns of owners whose heartbeat lapsed. On the way out, release its own,
        so the other workers check them at once (in the workspaces it knows them in)."""
        if isinstance(deliverer, TurnWatcher):
            deliverer.watch_turns(ended)
        self.owner, self.unsure = f"w{secrets.token_hex(8)}", False
        task = detached.start(self._keep(deliverer))
        try:
            yield
        finally:
            task.cancel()
            # Bounded: a Valkey call may swallow the cancel (see lease.Kept).
            await asyncio.wait({task}, timeout=self.tunables.bookkeeping_timeout)
            owner, self.owner = self.owner, ""
            if isinstance(deliverer, TurnWatcher):
                deliverer.watch_turns(None)
            # Ours, where we know them: no walk over every workspace on the way out. Unless
            # a lost reply may have kept one out of ``owned``, our heartbeat goes too; else
            # it is left to lapse, and the worker that finds it walks them all.
            where = sorted({ws for ws, _ in self.owned})
            self.owned.clear()
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self.release(owner, where)
                if not self.unsure:
                    await self.store.turns.forget_owner(owner)

    async def _keep(self, deliverer: Deliverer) -> None:
        """The heartbeat, every third of a lease; beside it (never holding it up, or the
        heartbeat would lapse), the asks about our turns and the releases of lapsed owners'."""
        t = self.tunables
        lease = round(t.lease_ttl * 1000)
        side: dict[str, asyncio.Task[None]] = {}
        asked = time.monotonic()
        try:
            while True:
                try:
                    now = self.now_ms()
                    for owner in await self.store.turns.beat(self.owner, now + lease, now):
                        name = f"release {owner}"
                        if owner == self.owner or name in side:
                            continue
                        if await self.store.turns.claim_dead(owner, now, lease):
                            self._beside(side, name, self._release_lapsed(owner))
                    if time.monotonic() - asked >= t.turn_check_interval and "ask" not in side:
                        asked = time.monotonic()
                        self._beside(side, "ask", self._ask_owned(deliverer))
                except TRANSIENT_ERRORS as exc:
                    log.log(loss_level(), "turn keeping interrupted: %s", exc)
                except Exception:
                    log.exception("turn keeping pass failed")
                await asyncio.sleep(t.lease_ttl / 3)
        finally:
            for task in side.values():
                task.cancel()

    @staticmethod
    def _beside(
        side: dict[str, asyncio.Task[None]], name: str, work: Coroutine[Any, Any, None]
    ) -> None:
        task = asyncio.ensure_future(work)
        side[name] = task

        def done(_: asyncio.Task[None]) -> None:
            side.pop(name, None)
            if not task.cancelled() and task.exception() is not None:
                log.warning("turn %s failed: %r", name, task.exception())

        task.add_done_callback(done)

    async def _release_lapsed(self, owner: str) -> None:
        await self.release(owner)
        await self.store.turns.forget_owner(owner)

    async def _ask_owned(self, deliverer: Deliverer) -> None:
        """Ask the agent about every turn this worker owns; end those it says ended."""
        if not isinstance(deliverer, TurnWatcher):
            self._forget_lapsed()
            return
        gate = asyncio.Semaphore(_ASKS_AT_ONCE)

        async def one(ws: str, ses: str, mine: Owned) -> None:
            # The deliverer's records of the ask name the turn's session (a drain's do too).
            async with gate:
                k = SessionKeys(ws, ses)
                with log_context(workspace=ws, session=ses, turn=mine.turn):
                    state, reason = await self._ask(k, mine.turn, deliverer)
                if state is TurnState.ENDED:
                    await self.end(k, mine.turn)
                elif (state is TurnState.UNKNOWN) != mine.unsure:
                    # Say why where the waiting entries show it, once per change, not per ask.
                    await self._note(k, mine, "" if state is TurnState.RUNNING else reason)

        await asyncio.gather(*(one(ws, ses, m) for (ws, ses), m in list(self.owned.items())))

    def _forget_lapsed(self) -> None:
        """Drop the records of turns past the lock's own expiry. A deliverer that cannot be
        asked learns no ends here (they come by ``end_turn``, maybe in another process), and
        by then each turn is let go in Valkey anyway: ``owned`` must not grow per session."""
        bound = self.now_ms() - turns.hold_ms(self.tunables)
        for key, mine in list(self.owned.items()):
            if mine.since_ms < bound:
                del self.owned[key]

    async def _note(self, k: SessionKeys, mine: Owned, reason: str) -> None:
        """Write (or clear) why an owned turn is still held in its record (List's turnWhy)."""
        value = await self.store.turns.lock_value(k)
        hold = turns.decode_turn(value)
        if hold is None or hold.turn != mine.turn or hold.owner != self.owner:
            return
        why = turns.unanswered(reason) if reason else ""
        new = replace(hold, why=why).encode()
        if await self.store.turns.keep_turn(k, value, new, self.now_ms(), self.owner):
            mine.unsure = bool(reason)

    async def release(self, owner: str, where: list[str] | None = None) -> int:
        """Release every turn of ``owner`` (stopped, or its heartbeat lapsed): unowned and due
        for a check now, in each workspace it held turns in (``where``, when known; else every
        workspace is looked at). How many were released."""
        released = 0
        for ws in where if where is not None else await self.store.walk.workspaces():
            now, here = self.now_ms(), 0
            for ses, who in (await self.store.turns.turn_owners(WorkspaceKeys(ws))).items():
                k = SessionKeys(ws, ses)
                value = await self.store.turns.lock_value(k) if who == owner else ""
                hold = turns.decode_turn(value)
                if hold is None or hold.owner != owner:
                    continue
                new = turns.released(hold, now).encode()
                here += await self.store.turns.keep_turn(k, value, new, now, "")
            if here:
                await self.store.due.mark(ws, now)
            released += here
        if released:
            log.info(
                "released the turns of a worker gone", extra={"owner": owner, "count": released}
            )
        return released
