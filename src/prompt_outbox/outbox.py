"""Outbox: the contract's Service (docs/contract.md), and the one public entry point. Accept,
list and watch live here; delivery is the engine's (``delivery/``), the operator actions are
``Outbox.admin`` (``admin.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from datetime import datetime

from .admin import Admin, AdminAlias
from .core.callbacks import (
    Deliverer,
    Hook,
    LedgerProbe,
    TurnEnd,
    Verifier,
    Wiring,
)
from .core.entry import Entry, decode_entry
from .core.errors import Duplicate, NotDurable
from .core.events import QueueEvent, QueueReset, missed_events, parse_event_id, queue_event
from .core.keys import check_client_message_id, session_keys
from .core.metrics import Metrics
from .core.settings import Tunables
from .core.timeutil import Clock, to_ms, utcnow
from .core.turns import TurnInfo, decode_turn
from .core.validate import (
    WhileBusy,
    check_model,
    check_text,
    check_unicode,
    check_user_id,
    check_while_busy,
    payload_fingerprint,
)
from .delivery.engine import Engine
from .delivery.lease import listed
from .delivery.maintenance import Maintenance
from .delivery.runloop import RunLoop, Wakeups
from .delivery.tasks import Detached
from .overview import Overview
from .storage.client import Client
from .storage.durability import DurabilityReport, resolve_durability
from .storage.feed import EventFeed, FeedLimits
from .storage.replies import Accept, Snapshot
from .storage.scripts import LogBounds
from .storage.store import TRANSIENT_ERRORS, Store
from .storage.waitaof import WaitAof


def _new_id(now: datetime) -> str:
    # Time-ordered, unique, and inside the ID charset: 12 hex digits of ms + 64 random bits.
    return f"{to_ms(now):012x}{secrets.token_hex(8)}"


class Outbox:
    """A durable per-session outbox of prompts on Valkey. Safe for concurrent use.

    ``client`` is a ``valkey.asyncio.Valkey`` or a ``valkey.asyncio.cluster.ValkeyCluster``,
    borrowed: the caller owns its lifecycle. ``aclose`` closes what the Outbox opened itself
    (the event feed's subscription connections).
    ``clock`` returns the current aware UTC time (tests pass a controllable one).
    ``feed`` bounds how ``watch`` shares connections (``storage/feed.py``: concurrent reads,
    a reader's unread events, the safety poll).
    """

    def __init__(
        self,
        client: Client,
        tunables: Tunables | None = None,
        *,
        clock: Clock | None = None,
        feed: FeedLimits | None = None,
    ) -> None:
        self.tunables = tunables or Tunables()
        t = self.tunables
        self.metrics = Metrics()
        """This Outbox's Prometheus metrics (``metrics.render`` for the text exposition)."""
        self._clock: Clock = clock or utcnow
        self._store = Store(
            client,
            logs=LogBounds(
                length=t.event_log_len,
                ttl_ms=round(t.event_log_ttl * 1000),
                max_bytes=t.event_log_bytes,
                dedupe_ttl_ms=round(t.dedupe_ttl * 1000),
            ),
            memory_ratio=t.accept_memory_ratio,
            memory_interval=t.memory_check_interval,
            budget_share=t.workspace_budget_share,
        )
        self._wiring = Wiring()
        self._engine = Engine(self._store, t, self._clock, self.metrics, self._wiring)
        self._maintenance = Maintenance(self._store, self._engine, t, self.metrics, self._wiring)
        self.admin = Admin(self._store, self._engine, self._maintenance, self.metrics)
        """The operator actions: retry, edit, dismiss, park, the sweeps, cleanup, counts."""
        self.overview = Overview(self._store, t, self._clock)
        """Workspaces and sessions with their counts, in pages (the queue page's overview)."""
        self._detached = Detached()
        self._wakeups = Wakeups()
        self._feed = EventFeed(self._store, feed, self.metrics)
        self._durability: DurabilityReport | None = None
        self._wait: WaitAof | None = None
        self._durability_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """End every open ``watch`` (with ``StreamEnded``) and close the connections the
        Outbox made for them. The client stays open: it is the caller's."""
        await self._feed.aclose()

    # -- wiring (call before run) --------------------------------------------------------

    def set_verifier(self, verifier: Verifier | None) -> None:
        """Wire the ambiguity resolver (transcript check)."""
        self._wiring.verifier = verifier

    def set_on_delivered(self, hook: Hook | None) -> None:
        """Wire the confirmed-delivery hook: fires once per entry, across replicas."""
        self._wiring.on_delivered = hook

    def set_on_staged(self, hook: Hook | None) -> None:
        """Wire the picked-up-for-delivery hook: fires when an entry is staged for a send."""
        self._wiring.on_staged = hook

    def set_ledger_probe(self, probe: LedgerProbe | None) -> None:
        """Wire the ledger truth source used by ``sweep_workspace_parked_errors``."""
        self._wiring.ledger_probe = probe

    # -- accept and list -----------------------------------------------------------------

    async def check_durability(self) -> DurabilityReport:
        """Decide what an acknowledged accept promises on this server, once (the first
        ``accept`` calls it if nobody did): ``tunables.accept_durability`` is tried on every
        primary. Raises ``DurabilityError`` when a level the caller chose cannot be honoured;
        the default steps down to what the server can do, and the report says so."""
        async with self._durability_lock:
            if self._durability is None:
                t = self.tunables
                report = await resolve_durability(
                    self._store.topology,
                    t.accept_durability,
                    chosen=t.durability_chosen,
                    wait_for=t.durability_timeout,
                )
                self._wait = WaitAof.for_level(report.level, t.durability_timeout)
                await self._store.load_scripts()
                await self._store.memory.prime()  # the first accepts need not read it
                self._durability = report
            return self._durability

    async def accept(
        self,
        workspace_id: str,
        session_id: str,
        user_id: str,
        client_message_id: str,
        text: str,
        model: str | None = None,
        *,
        while_busy: WhileBusy = "enqueue",
    ) -> Entry:
        """Persist a prompt for delivery; returns the entry (status pending).

        ``while_busy`` (LangGraph's double-texting): ``"enqueue"`` queues it behind what the
        session holds; ``"reject"`` raises ``SessionBusy`` and writes nothing when the session
        holds an entry that is pending, being delivered or being verified; ``"interrupt"``
        queues it, and asks the run loop delivering the session's entry in flight (if any,
        in any process) to have the deliverer abort that turn (``Aborter``), once this
        accept is as durable as asked. The interrupted entry counts as delivered if the agent
        says so; FIFO goes on. A duplicate never asks again.

        Raises ``Duplicate`` (with the first accept's ID) when the clientMessageID was accepted
        within ``dedupe_ttl`` with the same text and model, ``IdempotencyKeyReused`` (with it
        too, nothing written) when it was accepted with another text or model, ``ValueError``
        (an ``InvalidInput``) for bad input, and at a quota, nothing written: ``OutboxFull``
        (``cap``), ``WorkspaceFull`` (``workspace_cap``), ``StorageFull`` (the memory
        ceiling), ``WorkspaceBytesFull`` (``workspace_budget_share``); docs/security.md has
        each.
        The dedupe marker is written only after the push, in the same script.

        Returns (or raises ``Duplicate``) once the entry is as durable as
        ``accept_durability`` asks (see ``check_durability``); ``NotDurable`` when the wait
        for that ran out: the entry is written, not confirmed. A retry with the same
        clientMessageID waits again, for the same entry.
        """
        k = session_keys(workspace_id, session_id)
        text = check_text(text)  # before the rest: an oversized body is a 413 first, over HTTP
        cmid = check_client_message_id(client_message_id)
        policy = check_while_busy(while_busy)
        now = self._clock()
        entry = Entry(
            id=_new_id(now),
            client_message_id=cmid,
            user_id=check_user_id(user_id),
            text=text,
            model=check_model(model),
            accepted_at=now,
        )
        fingerprint = payload_fingerprint(text, entry.model)
        t = self.tunables
        if self._durability is None:
            await self.check_durability()
        started = time.perf_counter()
        reply = await self._store.accept(
            k,
            cmid,
            fingerprint,
            entry.traced().to_json(),
            entry.id,
            t.cap,
            t.workspace_cap,
            round(t.dedupe_ttl * 1000),
            to_ms(now),
            self._wait,
            while_busy=policy,
        )
        refused = reply.refusal(t.cap, t.workspace_cap)
        if refused is not None:
            self.metrics.refused[reply.outcome.value].inc()
            raise refused
        written = reply.accepted_id or entry.id
        if reply.outcome is Accept.OK:
            self.metrics.accepted.inc()
            self.metrics.accept_seconds.observe(time.perf_counter() - started)
            self._wakeups.notify()
        else:
            self.metrics.duplicates.inc()
        if self._wait is not None and reply.confirmation is not None:
            missing = self._wait.shortfall(reply.confirmation, written)
            if missing:
                self.metrics.not_durable.inc()
                raise NotDurable(written, self._wait.level, missing)
        if reply.outcome is Accept.DUPLICATE:
            raise Duplicate(written)
        if reply.in_flight:
            # After the durability wait: a turn is never cut for an accept that was lost. Best
            # effort: the accept stands whatever becomes of the ask.
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self._store.due.ask_abort(k.ws, k.ses, reply.in_flight)
        return entry

    def _listed(self, snap: Snapshot) -> list[Entry]:
        return listed(snap, self._clock(), self.tunables.lock_ttl)

    async def list(self, workspace_id: str, session_id: str) -> list[Entry]:
        """The session's entries in FIFO order: staged (delivering) first, then the queue.

        While the session lock is held, pending entries carry ``blocked_by_in_flight`` and
        ``in_flight_for`` (seconds the hold has lasted): "sending..." versus "frozen"; while
        the agent's turn on a delivered entry goes on, also ``in_turn_for``.
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
        with a reset. A reset and its position are read together: nothing is skipped. A bad
        ``last_event_id`` raises ``InvalidEventId`` (a ValueError) before anything is read.

        Every watch of this Outbox shares its few connections (``storage/feed.py``). A caller
        that leaves more than ``FeedLimits.max_behind`` events or ``max_behind_bytes`` bytes
        unread (or is among those holding the most when the process's streams together hold
        over ``max_buffered_bytes``) gets ``FellBehind`` (a ``StreamEnded``, as ``aclose``
        gives): resume with the last event ID it got.
        """
        k = session_keys(workspace_id, session_id)
        if last_event_id is not None:
            parse_event_id(last_event_id)
        snaps = [await self._feed.snapshot(k)]  # bounded like the feed's reads (bursts of opens)
        ttl_ms = round(self.tunables.event_log_ttl * 1000)
        position = last_event_id
        if position is None or missed_events(position, snaps[0].log, ttl_ms):
            position = snaps[0].log.position()
            yield QueueReset(position, self._listed(snaps.pop()))  # kept by its reader alone
        snaps.clear()  # the whole queue: dropped before its reset is out (streams live for hours)
        with self._feed.follow(k, position) as follower:
            while True:
                # One event at a time: what the caller has not taken stays in the follower's
                # buffer, where its bytes are counted against the bounds.
                batch = await follower.next(poll, limit=1)
                if not batch:
                    yield None
                for event_id, fields in batch:
                    yield queue_event(event_id, fields)

    async def ping(self) -> bool:
        """True when Valkey answers (readiness); raises the client's error when it does not."""
        return await self._store.ping()

    async def seed_entry_for_test(self, workspace_id: str, session_id: str, raw_entry: str) -> None:
        """Append a raw entry JSON to the session queue (test harnesses only; it is checked)."""
        k = session_keys(workspace_id, session_id)
        decode_entry(raw_entry)
        await self._store.seed(k, raw_entry, to_ms(self._clock()))

    # -- delivery ------------------------------------------------------------------------

    async def deliver_once(self, workspace_id: str, session_id: str, deliverer: Deliverer) -> bool:
        """Run one per-session step: send the due head, verify it, or recover stale staging.

        True when it acted on an entry; False when nothing was due or another holder had the
        session. The step runs detached: cancelling the caller does not cancel the delivery.
        """
        k = session_keys(workspace_id, session_id)
        step = self._engine.drain(k, deliverer, max_steps=1)
        return await asyncio.shield(self._detached.start(step))

    @contextlib.asynccontextmanager
    async def running(self, deliverer: Deliverer, tick: float = 1.0) -> AsyncIterator[None]:
        """Deliver in the background while the block runs; on the way out, start nothing new
        and wait for every delivery in flight to finish (under its own context)::

            async with outbox.running(deliver):
                await serve_forever()

        Sessions deliver in parallel (at most ``tunables.concurrency``), one entry in flight
        per session. An accept wakes delivery at once; ``tick`` bounds how long it sleeps
        otherwise. It calls ``recover()`` as it starts. ``StorageFormatError`` (before anything
        runs) if a newer version wrote to this Valkey.
        """
        async with self._looping(deliverer, tick) as loop:
            yield
        loop.raise_failure()  # a loop that died of a bug says so here, not silently

    async def run(self, deliverer: Deliverer, tick: float = 1.0) -> None:
        """``running`` as a task: deliver until cancelled, join every delivery it started,
        then re-raise the CancelledError."""
        async with self._looping(deliverer, tick) as loop:
            await loop.wait()

    @contextlib.asynccontextmanager
    async def _looping(self, deliverer: Deliverer, tick: float) -> AsyncIterator[RunLoop]:
        await self._store.record_format()  # a newer store is refused before anything runs
        loop = RunLoop(
            store=self._store,
            engine=self._engine,
            maintenance=self._maintenance,
            tunables=self.tunables,
            wiring=self._wiring,
            wakeups=self._wakeups,
            detached=self._detached,
            deliverer=deliverer,
            tick=tick,
        )
        async with self._engine.turns.keeping(deliverer, self.end_turn, self._detached):
            loop.start()
            try:
                yield loop
            finally:
                await loop.stop()

    async def end_turn(self, workspace_id: str, session_id: str, turn_id: str) -> TurnEnd:
        """End the session's turn of that ID (docs/design.md, "Turns"): its next entry is then sent.
        ``ended`` False when it holds no such turn (unknown, or over: a second call is fine).
        InvalidInput for a turn ID that is not Unicode (a lone surrogate): no turn has one."""
        k = session_keys(workspace_id, session_id)
        return await self._engine.turns.end(k, check_unicode("turn ID", turn_id))

    async def turn(self, workspace_id: str, session_id: str) -> TurnInfo | None:
        """The session's turn, if it is held in one (its ID, entry, how long, why); else None."""
        value = await self._store.turns.lock_value(session_keys(workspace_id, session_id))
        hold = decode_turn(value)
        return hold.info(to_ms(self._clock())) if hold is not None else None

    async def recover(self) -> int:
        """Requeue staged entries left by a crash as verifying, at their session's head.

        Takes each session's lock before reading its staging, so a living delivery (which
        holds it) is never second-guessed; an ID already in the queue is never added twice.
        Returns the number of entries requeued.
        """
        return await self._maintenance.recover()

    # -- operator actions: aliases of ``Outbox.admin``'s (admin.py has their docstrings) ---

    retry = AdminAlias(Admin.retry)
    edit = AdminAlias(Admin.edit)
    dismiss = AdminAlias(Admin.dismiss)
    park_workspace = AdminAlias(Admin.park_workspace)
    unpark_workspace = AdminAlias(Admin.unpark_workspace)
    sweep_workspace_unverifiable = AdminAlias(Admin.sweep_workspace_unverifiable)
    sweep_workspace_parked_errors = AdminAlias(Admin.sweep_workspace_parked_errors)
    retry_errors = AdminAlias(Admin.retry_errors)
    dismiss_errors = AdminAlias(Admin.dismiss_errors)
    cleanup_workspace = AdminAlias(Admin.cleanup_workspace)
    count_by_workspace = AdminAlias(Admin.count_by_workspace)
    count_by_status = AdminAlias(Admin.count_by_status)
