"""Outbox: the seed's Service. Accept, list, deliver, recover, and the operator actions."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from valkey.asyncio import Valkey
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from . import failpoints, machine
from .callbacks import Deliverer, DismissResult, Hook, LedgerProbe, RetryResult, Verdict, Verifier
from .entry import Entry, Status, decode_entry
from .errors import Duplicate, OutboxFull
from .events import QueueEvent, QueueReset, missed_events, parse_event_id
from .keys import SessionKeys, check_client_message_id, check_id, session_keys, workspace_keys
from .ledger import LEDGER_DELIVERED, LEDGER_NOT_DELIVERED
from .metrics import Metrics
from .settings import Tunables
from .store import Snapshot, Store
from .timeutil import Clock, to_ms, utcnow
from .validate import check_model, check_reason, check_text, check_user_id

log = logging.getLogger("prompt_outbox")
T = TypeVar("T")

# Valkey being unreachable for a moment: worth retrying bookkeeping for (BusyLoadingError,
# a restarted server replaying its AOF, is a ConnectionError subclass).
_TRANSIENT_STORE_ERRORS = (ValkeyConnectionError, ValkeyTimeoutError, OSError)


class Step(enum.Enum):
    """What one per-session step did."""

    ACTED = "acted"  # an attempt, a verification pass or a recovery; the lock is still held
    NONE = "none"  # nothing due; the lock is released
    BUSY = "busy"  # another holder has the session


class _Edit(enum.IntEnum):
    """One-entry edit outcome; values line up with RetryResult and DismissResult."""

    DONE = 0
    MISSING = 1
    BUSY = 2


def _new_id(now: datetime) -> str:
    # Time-ordered, unique, and inside the ID charset: 12 hex digits of ms + 64 random bits.
    return f"{to_ms(now):012x}{secrets.token_hex(8)}"


def _lock_value(now: datetime) -> str:
    # The acquisition time rides in the value so List can say how long the hold has lasted.
    return f"{secrets.token_hex(8)}:{to_ms(now)}"


class Outbox:
    """A durable per-session outbox of prompts on Valkey. Safe for concurrent use.

    ``client`` is a ``valkey.asyncio.Valkey``, borrowed: the caller owns its lifecycle.
    ``clock`` returns the current aware UTC time (tests pass a controllable one).
    """

    def __init__(
        self, client: Valkey, tunables: Tunables | None = None, *, clock: Clock | None = None
    ) -> None:
        self.tunables = tunables or Tunables()
        self._store = Store(
            client,
            event_log_len=self.tunables.event_log_len,
            event_log_ttl_ms=round(self.tunables.event_log_ttl * 1000),
        )
        self._clock: Clock = clock or utcnow
        self._verifier: Verifier | None = None
        self._on_delivered: Hook | None = None
        self._on_staged: Hook | None = None
        self._ledger_probe: LedgerProbe | None = None
        self._detached: set[asyncio.Task[Any]] = set()
        self._wakers: set[asyncio.Event] = set()
        self.metrics = Metrics()
        """This Outbox's Prometheus metrics (``metrics.render`` for the text exposition)."""

    # -- wiring (call before run) --------------------------------------------------------

    def set_verifier(self, verifier: Verifier | None) -> None:
        """Wire the ambiguity resolver (transcript check)."""
        self._verifier = verifier

    def set_on_delivered(self, hook: Hook | None) -> None:
        """Wire the confirmed-delivery hook: fires once per entry, across replicas."""
        self._on_delivered = hook

    def set_on_staged(self, hook: Hook | None) -> None:
        """Wire the picked-up-for-delivery hook: fires when an entry is staged for a send."""
        self._on_staged = hook

    def set_ledger_probe(self, probe: LedgerProbe | None) -> None:
        """Wire the ledger truth source used by ``sweep_workspace_parked_errors``."""
        self._ledger_probe = probe

    # -- accept and list -----------------------------------------------------------------

    async def accept(
        self,
        workspace_id: str,
        session_id: str,
        user_id: str,
        client_message_id: str,
        text: str,
        model: str | None = None,
    ) -> Entry:
        """Persist a prompt for delivery; returns the entry (status pending).

        Raises ``Duplicate`` (with the first accept's ID) when the clientMessageID was accepted
        within ``dedupe_ttl``, ``OutboxFull`` at ``cap``, ``ValueError`` for bad input. The
        dedupe marker is written only after the push, in the same script: never half-written.
        """
        k = session_keys(workspace_id, session_id)
        cmid = check_client_message_id(client_message_id)
        now = self._clock()
        entry = Entry(
            id=_new_id(now),
            client_message_id=cmid,
            user_id=check_user_id(user_id),
            text=check_text(text),
            model=check_model(model),
            accepted_at=now,
        )
        t = self.tunables
        started = time.perf_counter()
        reply = await self._store.accept(
            k, cmid, entry.to_json(), entry.id, t.cap, round(t.dedupe_ttl * 1000), to_ms(now)
        )
        if reply.kind == "dup":
            self.metrics.duplicates.inc()
            raise Duplicate(reply.detail)
        if reply.kind == "full":
            self.metrics.refused_full.inc()
            raise OutboxFull(t.cap)
        self.metrics.accepted.inc()
        self.metrics.accept_seconds.observe(time.perf_counter() - started)
        for waker in self._wakers:
            waker.set()
        return entry

    def _listed(self, snap: Snapshot) -> list[Entry]:
        entries = [decode_entry(raw) for raw in (*snap.staging, *snap.queue)]
        if not snap.locked:
            return entries
        held_for = self._held_for(snap.lock_value, snap.lock_pttl_ms)
        return [
            replace(e, blocked_by_in_flight=True, in_flight_for=held_for)
            if e.status is Status.PENDING
            else e
            for e in entries
        ]

    async def list(self, workspace_id: str, session_id: str) -> list[Entry]:
        """The session's entries in FIFO order: staged (delivering) first, then the queue.

        While the session lock is held, pending entries carry ``blocked_by_in_flight`` and
        ``in_flight_for`` (seconds the hold has lasted): "sending..." versus "frozen".
        """
        return self._listed(await self._store.snapshot(session_keys(workspace_id, session_id)))

    async def watch(
        self,
        workspace_id: str,
        session_id: str,
        last_event_id: str | None = None,
        *,
        poll: float = 1.0,
    ) -> AsyncIterator[QueueEvent | QueueReset | None]:
        """Follow the session's queue: a QueueReset (the whole queue) first, then a QueueEvent
        per change, for as long as the caller iterates. ``None`` after each quiet ``poll``.

        With ``last_event_id`` (the last event a reader saw) it resumes right after it, with
        no reset, while the capped log still holds everything after it; otherwise it starts
        with a reset. A reset and its position are read together: nothing is skipped.
        """
        k = session_keys(workspace_id, session_id)
        if last_event_id is not None:
            parse_event_id(last_event_id)
        snap = await self._store.snapshot(k)
        ttl_ms = round(self.tunables.event_log_ttl * 1000)
        position = last_event_id
        if position is None or missed_events(position, snap.log, ttl_ms):
            position = snap.log.position()
            yield QueueReset(position, self._listed(snap))
        while True:
            batch = await self._store.read_events(k, position, round(poll * 1000), 100)
            if not batch:
                yield None
            for event_id, fields in batch:
                position = event_id
                raw = fields.get("entry", "")
                entry = decode_entry(raw) if raw else None
                yield QueueEvent(event_id, fields.get("kind", ""), fields.get("id", ""), entry)

    def _held_for(self, lock_value: str, pttl_ms: int) -> float:
        _, _, since = lock_value.rpartition(":")
        if since.isdigit():
            return max(0.0, (to_ms(self._clock()) - int(since)) / 1000)
        return max(0.0, self.tunables.lock_ttl - pttl_ms / 1000)

    async def ping(self) -> bool:
        """True when Valkey answers (readiness); raises the client's error when it does not."""
        return await self._store.ping()

    async def seed_entry_for_test(self, workspace_id: str, session_id: str, raw_entry: str) -> None:
        """Append a raw entry JSON to the session queue (test harnesses only; it is checked)."""
        decode_entry(raw_entry)
        k = session_keys(workspace_id, session_id)
        await self._store.seed(k, raw_entry, to_ms(self._clock()))

    # -- delivery ------------------------------------------------------------------------

    async def deliver_once(self, workspace_id: str, session_id: str, deliverer: Deliverer) -> bool:
        """Run one per-session step: send the due head, verify it, or recover stale staging.

        True when it acted on an entry; False when nothing was due or another holder had the
        session. The step runs detached: cancelling the caller does not cancel the delivery.
        """
        k = session_keys(workspace_id, session_id)

        async def one_step() -> bool:
            lockval = _lock_value(self._clock())
            step = await self._step(k, deliverer, lockval)
            if step is Step.ACTED:
                await self._release(k, lockval)
            return step is Step.ACTED

        return await asyncio.shield(self._detach(one_step()))

    async def run(self, deliverer: Deliverer, tick: float = 1.0) -> None:
        """Deliver until cancelled, then join every delivery it started, then re-raise.

        Sessions deliver in parallel (at most ``tunables.concurrency``), one entry in flight per
        session. An accept wakes the loop at once; ``tick`` bounds how long it sleeps otherwise.
        """
        from .worker import RunLoop

        await RunLoop(self, deliverer, tick).run()

    def _detach(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start work that must outlive its caller (a delivery and its bookkeeping)."""
        task = asyncio.create_task(coro)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        return task

    async def _step(self, k: SessionKeys, deliverer: Deliverer, lockval: str) -> Step:
        got = await self._store.acquire(k, lockval, self._lease_ms, self._now_ms())
        if got.kind == "busy":
            return Step.BUSY
        if got.kind in ("idle", "wait"):
            return Step.NONE
        if got.kind == "staged":
            await self._requeue_staged(k, lockval, got.entries)
            failpoints.reached("after-requeue")
            return Step.ACTED
        failpoints.reached("after-acquire")
        raw = got.entries[0]
        entry = decode_entry(raw)
        if entry.status is Status.PENDING:
            await self._send(k, lockval, raw, entry, deliverer)
        else:
            await self._verify(k, lockval, raw, entry)
        return Step.ACTED

    async def _send(
        self, k: SessionKeys, lockval: str, raw: str, entry: Entry, deliverer: Deliverer
    ) -> None:
        staged = machine.staged(entry, self._clock())
        staged_raw = staged.to_json()
        if await self._store.stage(k, lockval, raw, staged_raw) != "ok":
            return
        failpoints.reached("after-stage")
        await self._fire(self._on_staged, "on_staged", k, staged)
        started = time.perf_counter()
        async with self._lease(k, lockval):
            failure = await self._bounded(deliverer(k.ws, k.ses, staged))
        failpoints.reached("after-deliver")
        self.metrics.delivery_seconds.observe(time.perf_counter() - started)
        outcome = machine.classify(failure)
        self.metrics.attempts.labels(outcome=outcome.value).inc()
        if failure is None:
            await self._claim(k, lockval, staged, "send")
            return
        new = machine.after_send_failure(
            staged, failure, self._clock(), self.tunables, verifier=self._verifier is not None
        )
        self._count_rescheduled(new, outcome.value)
        log.info(
            "delivery failed",
            extra={
                "ws": k.ws,
                "ses": k.ses,
                "entry": entry.id,
                "status": str(new.status),
                "error": new.last_error,
            },
        )
        await self._bookkeep(
            "restore",
            lambda: self._store.restore(
                k, lockval, staged_raw, new.to_json(), self._now_ms(), release=False
            ),
        )
        failpoints.reached("after-restore")

    async def _verify(self, k: SessionKeys, lockval: str, raw: str, entry: Entry) -> None:
        verifier = self._verifier
        if verifier is None:
            self.metrics.failed.inc()
            await self._swap(k, lockval, raw, machine.no_verifier(entry))
            return
        verdict, reason = Verdict.INCONCLUSIVE, "verifier gave no answer"
        async with self._lease(k, lockval):
            try:
                async with asyncio.timeout(self.tunables.delivery_timeout):
                    verdict = await verifier(k.ws, k.ses, entry)
            except Exception as exc:
                reason = f"verifier failed: {machine.describe(exc)}"
        failpoints.reached("after-verify")
        self.metrics.verified.labels(verdict=verdict.name.lower()).inc()
        if verdict is Verdict.DELIVERED:
            await self._claim(k, lockval, entry, "verify")
            return
        if verdict is Verdict.ABSENT:
            new = machine.after_absent(entry, self._clock(), self.tunables)
        else:
            new = machine.after_inconclusive(entry, reason, self._clock(), self.tunables)
        self._count_rescheduled(new, verdict.name.lower())
        await self._swap(k, lockval, raw, new)

    def _count_rescheduled(self, new: Entry, reason: str) -> None:
        if new.status is Status.ERROR:
            self.metrics.failed.inc()
        elif new.status is Status.PENDING:
            self.metrics.retried.labels(reason=reason).inc()

    async def _claim(self, k: SessionKeys, lockval: str, entry: Entry, via: str) -> bool:
        # With a hook wired, the claim also records the OnDelivered call it owes (see _notify).
        grace_ms = round(self.tunables.hook_retry_after * 1000) if self._on_delivered else 0
        raw = entry.to_json()
        removed = await self._bookkeep(
            "complete",
            lambda: self._store.complete(
                k, raw, entry.id, lockval, self._now_ms(), release=False, notice_grace_ms=grace_ms
            ),
        )
        if removed is not None and removed > 0:
            failpoints.reached("after-complete")
            self.metrics.delivered.labels(via=via).inc()
            waited = (self._clock() - entry.accepted_at).total_seconds()
            self.metrics.accept_to_delivered_seconds.observe(max(0.0, waited))
            await self._notify(k, entry)
            return True
        return False

    async def _notify(self, k: SessionKeys, entry: Entry) -> None:
        """Fire OnDelivered for a claimed entry, then clear the record of the call owed. A
        worker killed in between leaves the record: another fires the hook again after
        ``hook_retry_after`` (at-least-once; twice only if killed after the hook ran)."""
        hook = self._on_delivered
        if hook is None:
            return
        await self._fire(hook, "on_delivered", k, entry)
        failpoints.reached("after-hook")
        await self._bookkeep("notified", lambda: self._store.notified(k.workspace, k.ses, entry.id))

    async def _fire_owed_hooks(self) -> int:
        """Fire the OnDelivered calls that claims owe and whose workers did not make them in
        time (killed after the claim). Returns how many were fired."""
        if self._on_delivered is None:
            return 0
        grace_ms = round(self.tunables.hook_retry_after * 1000)
        fired = 0
        for ws in await self._store.workspaces():
            owed = await self._store.take_notices(
                workspace_keys(ws), self._now_ms(), grace_ms, limit=100
            )
            for ses, entry_id, raw in owed:
                log.warning(
                    "firing an OnDelivered its worker never made",
                    extra={"ws": ws, "ses": ses, "entry": entry_id},
                )
                self.metrics.hooks_refired.inc()
                await self._notify(SessionKeys(ws, ses), decode_entry(raw))
                fired += 1
        return fired

    async def _swap(self, k: SessionKeys, lockval: str, old: str, new: Entry) -> int:
        n = await self._bookkeep(
            "replace",
            lambda: self._store.replace(k, lockval, self._now_ms(), [(old, new.to_json())]),
        )
        return n or 0

    async def _requeue_staged(self, k: SessionKeys, lockval: str, staged: Sequence[str]) -> int:
        now = self._clock()
        new = [machine.recovered(decode_entry(raw), now, self.tunables).to_json() for raw in staged]
        n = await self._store.requeue(k, lockval, to_ms(now), staged, new)
        if n > 0:
            log.warning("recovered staged entries", extra={"ws": k.ws, "ses": k.ses, "count": n})
        return max(n, 0)

    async def _release(self, k: SessionKeys, lockval: str) -> None:
        with contextlib.suppress(*_TRANSIENT_STORE_ERRORS):
            await self._store.release(k, lockval, self._now_ms())

    async def _bounded(self, call: Awaitable[None]) -> BaseException | None:
        """Await a deliverer under delivery_timeout; what it raised, or None on success."""
        try:
            async with asyncio.timeout(self.tunables.delivery_timeout):
                await call
        except Exception as exc:
            return exc
        return None

    @contextlib.asynccontextmanager
    async def _lease(self, k: SessionKeys, lockval: str) -> AsyncIterator[None]:
        """Keep renewing the session lease while the body runs (until lock_ttl at most).

        The keeper is stopped by a flag, never by cancellation: valkey-py 6.2 can swallow a
        CancelledError that lands inside a command, and a keeper that missed its cancel went
        on renewing for lock_ttl, freezing the session (test_lease.py)."""
        stop = asyncio.Event()
        keeper = asyncio.create_task(self._renew_until(stop, k, lockval))
        try:
            yield
        finally:
            stop.set()
            await asyncio.shield(keeper)  # at most one renew call to finish

    async def _renew_until(self, stop: asyncio.Event, k: SessionKeys, lockval: str) -> None:
        t = self.tunables
        started = time.monotonic()
        while time.monotonic() - started < t.lock_ttl:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(t.lease_ttl / 3):
                    await stop.wait()
            if stop.is_set():
                return
            try:
                if not await self._store.renew(k, lockval, self._lease_ms, self._now_ms()):
                    log.warning("lease lost mid-delivery", extra={"ws": k.ws, "ses": k.ses})
                    return
            except _TRANSIENT_STORE_ERRORS as exc:
                log.warning("lease renewal failed: %s", exc, extra={"ws": k.ws, "ses": k.ses})

    async def _bookkeep(self, what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """Retry a post-send write through a short Valkey outage. None if it never landed:
        the entry then stays staged and is recovered (as verifying) when the lease lapses."""
        deadline = time.monotonic() + self.tunables.bookkeeping_timeout
        delay = 0.05
        while True:
            try:
                return await call()
            except _TRANSIENT_STORE_ERRORS as exc:
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
            log.exception(
                "%s hook failed", name, extra={"ws": k.ws, "ses": k.ses, "entry": entry.id}
            )

    def _now_ms(self) -> int:
        return to_ms(self._clock())

    @property
    def _lease_ms(self) -> int:
        return round(self.tunables.lease_ttl * 1000)

    # -- recovery ------------------------------------------------------------------------

    async def recover(self) -> int:
        """Requeue staged entries left by a crash as verifying, at their session's head.

        Takes each session's lock before reading its staging, so a living delivery (which
        holds it) is never second-guessed; an ID already in the queue is never added twice.
        Returns the number of entries requeued.
        """
        total = 0
        for ws in await self._store.workspaces():
            sessions = [
                SessionKeys(ws, s) for s in await self._store.members(workspace_keys(ws).sessions)
            ]
            if not sessions:
                continue
            lengths = await self._store.staging_lengths(sessions)
            for k, n in zip(sessions, lengths, strict=True):
                if n:
                    total += await self._recover_session(k)
        return total

    async def _recover_session(self, k: SessionKeys) -> int:
        lockval = _lock_value(self._clock())
        got = await self._store.acquire(k, lockval, self._lease_ms, self._now_ms())
        if got.kind == "busy":
            log.info("recover skipped a busy session", extra={"ws": k.ws, "ses": k.ses})
            return 0
        try:
            return (
                await self._requeue_staged(k, lockval, got.entries) if got.kind == "staged" else 0
            )
        finally:
            if got.kind in ("staged", "head"):
                await self._release(k, lockval)

    async def _snapshot_recovered(self, k: SessionKeys) -> Snapshot:
        """The session as an operator action must see it: a dead worker's staged entries
        (staging with no holder) are recovered first, so the action finds them where they
        belong (in the queue, verifying). Acting around them would miss them (a park that
        leaves one to be re-sent) or reorder them (a retried older entry behind them)."""
        snap = await self._store.snapshot(k)
        if snap.staging and not snap.locked:
            await self._recover_session(k)
            snap = await self._store.snapshot(k)
        return snap

    # -- operator actions ----------------------------------------------------------------

    async def retry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Clear an error entry back to pending. BUSY while the session lock is held;
        NOT_FOUND when the session has no error entry with that ID."""

        def pick(snap: Snapshot) -> tuple[str, str] | None:
            raw = self._find(snap.queue, entry_id)
            if raw is None or (e := decode_entry(raw)).status is not Status.ERROR:
                return None
            return raw, machine.retried(e).to_json()

        result = RetryResult(
            await self._edit_entry(workspace_id, session_id, entry_id, pick, "retry")
        )
        if result is RetryResult.UPDATED:
            self.metrics.retried.labels(reason="operator").inc()
        return result

    async def dismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Remove an entry by ID. BUSY while the session lock is held; NOT_FOUND if absent."""

        def pick(snap: Snapshot) -> tuple[str, str] | None:
            raw = self._find((*snap.staging, *snap.queue), entry_id)
            return None if raw is None else (raw, "")

        return DismissResult(
            await self._edit_entry(workspace_id, session_id, entry_id, pick, "dismiss")
        )

    async def _edit_entry(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        pick: Callable[[Snapshot], tuple[str, str] | None],
        what: str,
    ) -> _Edit:
        """Swap one entry (pick: snapshot -> (old, new), new '' deletes) unless the lock is
        held. A swap that misses because the entry changed meanwhile is retried on a new read."""
        k = session_keys(workspace_id, session_id)
        check_id("entry ID", entry_id)
        for _ in range(3):
            snap = await self._snapshot_recovered(k)
            if snap.locked:
                return _Edit.BUSY
            pair = pick(snap)
            if pair is None:
                return _Edit.MISSING
            failpoints.reached(f"{what}-before-write")
            n = await self._store.replace(k, "", self._now_ms(), [pair])
            if n < 0:
                return _Edit.BUSY
            if n:
                return _Edit.DONE
        return _Edit.MISSING

    @staticmethod
    def _find(raws: Sequence[str], entry_id: str) -> str | None:
        return next((raw for raw in raws if decode_entry(raw).id == entry_id), None)

    async def park_workspace(self, workspace_id: str, reason: str) -> int:
        """Park every pending / verifying entry of the workspace with ``reason``. Busy sessions
        (a delivery in flight) are skipped and logged; calling again catches them."""
        check_reason(reason)

        def edit(e: Entry) -> Entry | None:
            return (
                machine.parked(e, reason)
                if e.status in (Status.PENDING, Status.VERIFYING)
                else None
            )

        n = await self._edit_workspace(workspace_id, "park", edit)
        self.metrics.parked.inc(n)
        return n

    async def unpark_workspace(self, workspace_id: str) -> int:
        """Re-arm every parked entry of the workspace (pending, or verifying if it was)."""
        return await self._edit_workspace(
            workspace_id,
            "unpark",
            lambda e: machine.unparked(e) if e.status is Status.PARKED else None,
        )

    async def sweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Re-arm unverifiable error entries as verifying, due now, with a fresh verify budget."""
        return await self._edit_workspace(
            workspace_id,
            "sweep-unverifiable",
            lambda e: machine.rearmed_for_verification(e) if machine.is_unverifiable(e) else None,
        )

    async def _edit_workspace(
        self, workspace_id: str, what: str, edit: Callable[[Entry], Entry | None]
    ) -> int:
        w = workspace_keys(workspace_id)
        total, busy = 0, []
        for ses in await self._store.members(w.sessions):
            k = SessionKeys(w.ws, ses)
            snap = await self._snapshot_recovered(k)
            if snap.locked:
                busy.append(ses)
                continue
            pairs = []
            for raw in snap.queue:
                new = edit(decode_entry(raw))
                if new is not None:
                    pairs.append((raw, new.to_json()))
            if not pairs:
                continue
            n = await self._store.replace(k, "", self._now_ms(), pairs)
            if n < 0:
                busy.append(ses)
            else:
                total += n
            failpoints.reached(f"{what}-between-sessions")
        if busy:
            log.warning("%s skipped busy sessions", what, extra={"ws": w.ws, "sessions": busy})
        return total

    async def sweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Settle the workspace's error entries against the ledger probe (no-op without one).

        Delivered (PROMOTED / TURN_ENDED) completes the entry and fires OnDelivered; no row (or
        FAILED) re-arms it as pending; anything else, or a probe error, leaves it. Entries that
        failed definitively ``max_attempts`` times are not asked about. Returns how many settled.
        """
        probe = self._ledger_probe
        w = workspace_keys(workspace_id)
        if probe is None:
            return 0
        total = 0
        for ses in await self._store.members(w.errors):
            total += await self._sweep_session_ledger(SessionKeys(w.ws, ses), probe)
        return total

    async def _sweep_session_ledger(self, k: SessionKeys, probe: LedgerProbe) -> int:
        t = self.tunables
        lockval = _lock_value(self._clock())
        if not await self._store.lock(k, lockval, self._lease_ms, self._now_ms()):
            log.info("ledger sweep skipped a busy session", extra={"ws": k.ws, "ses": k.ses})
            return 0
        settled = 0
        try:
            async with self._lease(k, lockval):
                snap = await self._store.snapshot(k)
                if snap.staging:  # recovered first, as for every operator action
                    await self._requeue_staged(k, lockval, snap.staging)
                    snap = await self._store.snapshot(k)
                for raw in snap.queue:
                    e = decode_entry(raw)
                    if not machine.is_ledger_sweepable(e):
                        continue
                    try:
                        async with asyncio.timeout(t.delivery_timeout):
                            state = await probe(k.ws, k.ses, e.id, machine.current_attempt(e))
                    except Exception as exc:
                        log.info("ledger probe failed: %s", exc, extra={"ws": k.ws, "entry": e.id})
                        continue
                    failpoints.reached("sweep-after-probe")
                    if state in LEDGER_DELIVERED:
                        settled += await self._claim(k, lockval, e, "ledger")
                    elif state in LEDGER_NOT_DELIVERED:
                        self.metrics.retried.labels(reason="ledger").inc()
                        settled += await self._swap(k, lockval, raw, machine.rearmed_by_ledger(e))
        finally:
            await self._release(k, lockval)
        return settled

    async def count_by_workspace(self) -> dict[str, dict[str, int]]:
        """Entries per status, per registered workspace (for ``stats``): one pipelined read
        per workspace, O(entries)."""
        out: dict[str, dict[str, int]] = {}
        for ws in await self._store.workspaces():
            w = workspace_keys(ws)
            sessions = [SessionKeys(ws, s) for s in await self._store.members(w.sessions)]
            counts = out.setdefault(ws, {})
            for raws in await self._store.session_entries(sessions):
                for raw in raws:
                    status = str(decode_entry(raw).status)
                    counts[status] = counts.get(status, 0) + 1
        return out

    async def count_by_status(self) -> dict[str, int]:
        """Entries per status across every workspace (the metrics gauge)."""
        total: dict[str, int] = {}
        for counts in (await self.count_by_workspace()).values():
            for status, n in counts.items():
                total[status] = total.get(status, 0) + n
        return total

    async def cleanup_workspace(self, workspace_id: str) -> int:
        """Delete every outbox key of the workspace; returns how many. Idempotent."""
        return await self._store.cleanup_workspace(workspace_keys(workspace_id))
