"""The delivery engine: one per-session step (acquire, stage, send, verify, claim, restore,
recover), with the lease kept while the agent or the verifier runs.

The run loop drives ``drain``; ``Outbox.deliver_once`` drives one step of it; maintenance and
the operator actions use ``recover_session``, ``claim``, ``swap`` and ``lease``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..core import machine
from ..core.callbacks import Aborter, Deliverer, Hook, Turn, TurnWatcher, Verdict, Wiring
from ..core.entry import Entry, Status, decode_entry
from ..core.failpoints import CrashPoint, reached
from ..core.keys import SessionKeys
from ..core.logctx import about_entry
from ..core.metrics import Metrics
from ..core.settings import Tunables
from ..core.timeutil import Clock, to_ms
from ..storage.replies import Acquire, Acquired, Claim, Replace, Write
from ..storage.store import TRANSIENT_ERRORS, Store, notice_member
from . import traced
from .forgets import Forgets
from .lease import Kept, new_lock_value
from .tasks import never, settled
from .turns import TurnClaim, Turns

log = logging.getLogger("prompt_outbox")
T = TypeVar("T")

_NEXT = {
    Status.PENDING: ("delivery failed, to be tried again", "retry"),
    Status.VERIFYING: ("delivery outcome unknown, to be verified", "verify"),
    Status.ERROR: ("delivery failed for good", "error"),
}
"""A send or verification that did not deliver, by the entry's status after it: the log line's
message and ``outcome``, one word for what happens next (what failed goes in ``failure``)."""


class Step(enum.Enum):
    """What one per-session step did."""

    ACTED = "acted"  # an attempt, a verification pass or a recovery; the lock is still held
    NONE = "none"  # nothing due; the lock is released
    BUSY = "busy"  # another holder has the session, or its turn goes on
    TURN = "turn"  # the delivery's turn goes on: the lock is the turn's now, not the drain's


@dataclass(slots=True)
class Hold:
    """One drain's hold of a session. Two round trips per entry ride on others: a claim
    answers the next step (``next``, saving an acquire), and the OnDelivered call that has run
    (``ran``, an entry ID) is forgotten by the next stage instead of a call of its own."""

    lockval: str
    want_next: bool = False  # the drain will take another step after this one
    next: Acquired | None = None
    ran: str = ""
    ended_early: bool = False  # the last claim's turn had ended already: none is held


@dataclass(slots=True)
class InFlight:
    """An entry this process is handing to its deliverer now: what an interrupt aborts."""

    entry_id: str
    deliverer: Deliverer
    asked: bool = False  # its abort was asked for already


class Engine:
    """The per-session delivery step of one Outbox; every write after a send is fenced by the
    lease's token, so a worker that lost its lease cannot write behind the new holder."""

    def __init__(
        self, store: Store, tunables: Tunables, clock: Clock, metrics: Metrics, wiring: Wiring
    ) -> None:
        self.store = store
        self.tunables = tunables
        self.clock = clock
        self.metrics = metrics
        self.wiring = wiring
        self.forgets = Forgets(store, self._bookkeep)
        self.in_flight: dict[tuple[str, str], InFlight] = {}  # by (ws, ses)
        self.turns = Turns(store, tunables, metrics, self.now_ms, self._bookkeep)

    def now_ms(self) -> int:
        return to_ms(self.clock())

    def lock_value(self) -> str:
        """A fresh owner token for one hold of a session lock."""
        return new_lock_value(self.clock())

    @property
    def lease_ms(self) -> int:
        return round(self.tunables.lease_ttl * 1000)

    # -- the step --------------------------------------------------------------------------

    async def drain(
        self,
        k: SessionKeys,
        deliverer: Deliverer,
        *,
        max_steps: int | None = None,
        stopping: Callable[[], bool] = never,
    ) -> bool:
        """Step the session until nothing is due (or ``max_steps``, or ``stopping()``),
        keeping its lock between entries, then release it. True if any step acted."""
        hold = Hold(self.lock_value())
        step, steps, acted = Step.NONE, 0, False
        try:
            while not stopping() and (max_steps is None or steps < max_steps):
                hold.want_next = max_steps is None or steps + 1 < max_steps
                step = await self.step(k, deliverer, hold)
                steps += 1
                acted = acted or step in (Step.ACTED, Step.TURN)
                if step is not Step.ACTED:
                    break
        finally:
            await self._forget_ran(k, hold)
            # A claim's WAIT / IDLE let the lock go already; any other last step holds it.
            if step is Step.ACTED and (hold.next is None or hold.next.holds_lock):
                await self.release(k, hold.lockval)
        return acted

    async def step(self, k: SessionKeys, deliverer: Deliverer, hold: Hold) -> Step:
        """Send the due head, verify it, or recover a dead worker's staging: one of them."""
        got, hold.next = hold.next, None
        if got is None:
            got = await self.store.acquire(k, hold.lockval, self.lease_ms, self.now_ms())
        if got.kind is Acquire.BUSY:
            return Step.BUSY
        if got.kind is Acquire.TURN:
            await self._forget_ran(k, hold)
            ended = await self.turns.check(k, got.entries[0], deliverer)
            return Step.ACTED if ended else Step.BUSY  # ended: the next entry may go
        if not got.holds_lock:
            return Step.NONE
        if got.kind is Acquire.STAGED:
            await self._forget_ran(k, hold)
            await self.requeue_staged(k, hold.lockval, got.entries)
            reached(CrashPoint.AFTER_REQUEUE)
            return Step.ACTED
        reached(CrashPoint.AFTER_ACQUIRE)
        raw = got.entries[0]
        entry = decode_entry(raw)
        if entry.status is Status.PENDING:
            return await self._send(k, hold, raw, entry, deliverer)
        await self._forget_ran(k, hold)
        return await self._verify(k, hold, raw, entry, deliverer)

    async def _send(
        self, k: SessionKeys, hold: Hold, raw: str, entry: Entry, deliverer: Deliverer
    ) -> Step:
        lockval = hold.lockval
        staged = machine.staged(entry, self.clock())
        staged_raw = staged.to_json()
        ran, hold.ran = hold.ran, ""
        try:
            member = notice_member(k.ses, ran) if ran else ""
            wrote = await self.store.stage(k, lockval, raw, staged_raw, member)
        except BaseException:  # an outage, a cancel: the drain's end forgets it alone (retried)
            hold.ran = ran
            raise
        if wrote is not Write.OK:
            return Step.ACTED
        reached(CrashPoint.AFTER_STAGE)
        await self._fire(self.wiring.on_staged, "on_staged", k, staged)
        started = time.perf_counter()
        flight = self.in_flight[(k.ws, k.ses)] = InFlight(staged.id, deliverer)
        try:
            async with self.lease(k, lockval):
                turn, failure = await traced.send(
                    k, staged, self._bounded(deliverer(k.ws, k.ses, staged))
                )
        finally:
            if self.in_flight.get((k.ws, k.ses)) is flight:
                del self.in_flight[(k.ws, k.ses)]
        reached(CrashPoint.AFTER_DELIVER)
        self.metrics.delivery_seconds.observe(time.perf_counter() - started)
        outcome = machine.classify(failure)
        self.metrics.attempts.labels(outcome=outcome.value).inc()
        if failure is None:
            return await self._claim_sent(k, hold, staged, "send", staged_raw, turn)
        new = machine.after_send_failure(
            staged, failure, self.clock(), self.tunables, verifier=self.wiring.verifier is not None
        )
        self._count_rescheduled(k, new, outcome.value)
        await self._bookkeep(
            "restore",
            lambda: self.store.restore(k, lockval, staged_raw, new.to_json(), self.now_ms()),
        )
        reached(CrashPoint.AFTER_RESTORE)
        return Step.ACTED

    async def _claim_sent(
        self, k: SessionKeys, hold: Hold, entry: Entry, via: str, raw: str, turn: object
    ) -> Step:
        """Claim an entry the agent has; with a turn (a ``Turn`` the deliverer returned, or
        a verified send of a deliverer that watches turns), the lock goes to the turn, unless
        its end came first (then the drain goes on)."""
        held = self.turns.claim_of(k, turn, entry.id, verified=via == "verify", trace=entry.trace)
        claimed = await self.claim(k, hold.lockval, entry, via, hold, raw=raw, turn=held)
        if held is None or (claimed and hold.ended_early):
            return Step.ACTED
        await self.turns.claimed(k, held, claimed)
        return Step.TURN

    async def _verify(
        self, k: SessionKeys, hold: Hold, raw: str, entry: Entry, deliverer: Deliverer
    ) -> Step:
        lockval = hold.lockval
        verifier = self.wiring.verifier
        if verifier is None:
            new = machine.no_verifier(entry)
            self._count_rescheduled(k, new, "no_verifier")
            await self.swap(k, lockval, raw, new)
            return Step.ACTED
        verdict, reason = Verdict.INCONCLUSIVE, "verifier gave no answer"
        async with self.lease(k, lockval):
            try:
                async with asyncio.timeout(self.tunables.delivery_timeout):
                    verdict = await traced.verify(k, entry, verifier(k.ws, k.ses, entry))
            except Exception as exc:
                reason = f"verifier failed: {machine.describe(exc)}"
        reached(CrashPoint.AFTER_VERIFY)
        self.metrics.verified.labels(verdict=verdict.name.lower()).inc()
        if verdict is Verdict.DELIVERED:
            # Its turn may go on: one who watches turns is asked at once (named by the entry).
            turn = Turn(entry.id) if isinstance(deliverer, TurnWatcher) else None
            return await self._claim_sent(k, hold, entry, "verify", raw, turn)
        if verdict is Verdict.ABSENT:
            new = machine.after_absent(entry, self.clock(), self.tunables)
        else:
            new = machine.after_inconclusive(entry, reason, self.clock(), self.tunables)
        self._count_rescheduled(k, new, verdict.name.lower())
        await self.swap(k, lockval, raw, new)
        return Step.ACTED

    def _count_rescheduled(self, k: SessionKeys, new: Entry, reason: str) -> None:
        """Count and log a send or verification that did not deliver (``_NEXT``); ``reason``:
        what failed (the send's class, the verdict, ``no_verifier``), the ``failure`` field."""
        failed = new.status is Status.ERROR
        if failed:
            self.metrics.failed.inc()
        elif new.status is Status.PENDING:
            self.metrics.retried.labels(reason=reason).inc()
        what, outcome = _NEXT[new.status]
        fields = {"outcome": outcome, "failure": reason, "error": new.last_error}
        about = about_entry(k.ws, k.ses, new.id, attempt=new.attempts, **fields)
        # A move to error is for good (until an operator's retry): a WARNING, not news.
        log.log(logging.WARNING if failed else logging.INFO, what, extra=about)

    # -- writes after a send (fenced by the lease token, retried through an outage) ---------

    async def claim(
        self,
        k: SessionKeys,
        lockval: str,
        entry: Entry,
        via: str,
        hold: Hold | None = None,
        *,
        raw: str | None = None,
        turn: TurnClaim | None = None,
    ) -> bool:
        """Complete the entry; True (and OnDelivered fired) if this call claimed it. With a
        hook wired, the claim also records the OnDelivered call it owes (see ``notify``).
        Within a drain (``hold``) that takes another step, the claim also answers that step.
        ``raw``: the entry's stored JSON, when the caller has it (else it is encoded).
        ``turn``: the value, expiry and owner of the turn the session is held in from now on."""
        grace_ms = round(self.tunables.hook_retry_after * 1000) if self.wiring.on_delivered else 0
        next_ms = self.lease_ms if hold is not None and hold.want_next and not turn else 0
        t = turn or TurnClaim("", "", 0, "")
        if raw is None:
            raw = entry.to_json()
        claimed = await self._bookkeep(
            "complete",
            lambda: self.store.complete(
                k,
                raw,
                entry.id,
                lockval,
                self.now_ms(),
                grace_ms,
                next_ms,
                t.value,
                t.hold_ms,
                t.owner,
                t.turn_id,
            ),
        )
        if claimed is None or claimed.claim is not Claim.CLAIMED:
            return False
        if hold is not None:
            hold.next, hold.ended_early = claimed.next, claimed.ended_early
        reached(CrashPoint.AFTER_COMPLETE)
        self.metrics.delivered.labels(via=via).inc()
        # attempts counts the failed ones: this is the one after them.
        about = about_entry(k.ws, k.ses, entry.id, attempt=entry.attempts + 1, outcome=via)
        log.info("delivered", extra=about)
        waited = (self.clock() - entry.accepted_at).total_seconds()
        self.metrics.accept_to_delivered_seconds.observe(max(0.0, waited))
        await self.notify(k, entry, hold)
        return True

    async def notify(self, k: SessionKeys, entry: Entry, hold: Hold | None = None) -> None:
        """Fire OnDelivered for a claimed entry, then clear the record of the call owed
        (within a drain, by its next stage, or at its end). A worker killed in between leaves
        the record: another fires the hook again after ``hook_retry_after`` (at-least-once;
        twice only if killed after the hook ran)."""
        hook = self.wiring.on_delivered
        if hook is None:
            return
        await self._fire(traced.hook(hook), "on_delivered", k, entry)
        reached(CrashPoint.AFTER_HOOK)
        if hold is not None:
            hold.ran = entry.id
            return
        await self.forgets.forget(k.workspace, notice_member(k.ses, entry.id))

    async def _forget_ran(self, k: SessionKeys, hold: Hold) -> None:
        """Forget the drain's OnDelivered call that ran, alone: no stage comes to carry it."""
        ran, hold.ran = hold.ran, ""
        if ran:
            await self.forgets.forget(k.workspace, notice_member(k.ses, ran))

    async def swap(self, k: SessionKeys, lockval: str, old: str, new: Entry) -> int:
        """Replace the exact string ``old`` by ``new``; 1 if it landed, 0 otherwise."""
        done = await self._bookkeep(
            "replace",
            lambda: self.store.replace(k, lockval, self.now_ms(), [(old, new.to_json())]),
        )
        return done.count if done is not None and done.outcome is Replace.OK else 0

    async def release(self, k: SessionKeys, lockval: str) -> None:
        """Let the session go (best effort: an unreachable Valkey lets the lease lapse)."""
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self.store.release(k, lockval, self.now_ms())

    def lease(self, k: SessionKeys, lockval: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Keep the session's lease renewed while the body runs (up to ``lock_ttl``)."""
        t = self.tunables
        return Kept(
            self.store,
            k,
            lockval,
            lease_ms=self.lease_ms,
            every=t.lease_ttl / 3,
            ceiling=t.lock_ttl,
            now_ms=self.now_ms,
        )

    async def abort(self, ws: str, ses: str, entry_id: str) -> None:
        """whileBusy interrupt: have the deliverer abort the turn of ``entry_id`` if this
        process is handing that entry to it now; once, however many loops heard the ask. The
        entry's own send then ends as the agent answers it (its outcome class decides)."""
        flight = self.in_flight.get((ws, ses))
        if flight is None or flight.entry_id != entry_id or flight.asked:
            return
        flight.asked = True
        if not isinstance(flight.deliverer, Aborter):
            self.metrics.aborts.labels(outcome="unsupported").inc()
            return
        _, failure = await self._bounded(flight.deliverer.abort(ws, ses))
        self.metrics.aborts.labels(outcome="failed" if failure else "asked").inc()
        log.info(
            "abort of the turn in flight asked",
            extra=about_entry(ws, ses, entry_id, error=repr(failure or "")),
        )

    async def _bounded(self, call: Awaitable[T]) -> tuple[T | None, BaseException | None]:
        """Await a deliverer under delivery_timeout: what it returned, or what it raised."""
        return await settled(call, self.tunables.delivery_timeout)

    async def _bookkeep(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """Retry a post-send write through a short Valkey outage. None if it never landed:
        the entry then stays staged and is recovered (as verifying) when the lease lapses."""
        deadline = time.monotonic() + self.tunables.bookkeeping_timeout
        delay = 0.05
        while True:
            try:
                return await call()
            except TRANSIENT_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    log.error("%s never reached Valkey: %s", what, exc)
                    return None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _fire(self, hook: Hook | None, name: str, k: SessionKeys, entry: Entry) -> None:
        if hook is None:
            return
        try:
            await hook(k.ws, k.ses, entry)
        except Exception:
            log.exception("%s hook failed", name, extra=about_entry(k.ws, k.ses, entry.id))

    # -- recovery --------------------------------------------------------------------------

    async def requeue_staged(self, k: SessionKeys, lockval: str, staged: Sequence[str]) -> int:
        """Put the staged entries read (under our lock) back at the head as verifying."""
        now = self.clock()
        new = [machine.recovered(decode_entry(raw), now, self.tunables).to_json() for raw in staged]
        done = await self.store.requeue(k, lockval, to_ms(now), staged, new)
        if done.count:
            log.warning(
                "recovered staged entries",
                extra={"workspace": k.ws, "session": k.ses, "count": done.count},
            )
        return done.count

    async def recover_session(self, k: SessionKeys) -> int:
        """Recover one session's staging if nobody holds it; the number of entries requeued."""
        lockval = self.lock_value()
        got = await self.store.acquire(k, lockval, self.lease_ms, self.now_ms())
        if got.kind in (Acquire.BUSY, Acquire.TURN):
            log.info("recover skipped a busy session", extra={"workspace": k.ws, "session": k.ses})
            return 0
        try:
            if got.kind is Acquire.STAGED:
                return await self.requeue_staged(k, lockval, got.entries)
            return 0
        finally:
            if got.holds_lock:
                await self.release(k, lockval)

    @contextlib.asynccontextmanager
    async def holding(self, k: SessionKeys) -> AsyncIterator[str | None]:
        """Hold the session's lock (leased) for an operator pass: yields the lock value, or
        None when another holder has the session."""
        lockval = self.lock_value()
        if not await self.store.lock(k, lockval, self.lease_ms, self.now_ms()):
            yield None
            return
        try:
            async with self.lease(k, lockval):
                yield lockval
        finally:
            await self.release(k, lockval)
