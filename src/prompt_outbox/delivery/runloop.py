"""The run loop: scheduling only. It finds due workspaces through the due index, visits each
(its due sessions go to the engine, ``Engine.drain``, in parallel; its owed OnDelivered calls
to a maintenance pass), starts the slow passes when they are due, and joins everything it
started when it stops.

A tick costs one read per due-index bucket plus one visit per workspace with due work
(storage/dueindex.py): idle workspaces cost nothing. An accept wakes the loop at once
(``Wakeups`` in this process, a published message across processes), so an idle loop starts
delivering within milliseconds; ``tick`` only bounds a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.callbacks import Deliverer, Wiring
from ..core.keys import SessionKeys, WorkspaceKeys
from ..core.settings import Tunables
from ..storage.dueindex import Mark, Visit, parse_abort
from ..storage.shardsub import ShardSubscriber
from ..storage.store import TRANSIENT_ERRORS, Store
from .engine import Engine
from .maintenance import Maintenance
from .tasks import Detached, join

log = logging.getLogger("prompt_outbox.worker")


class Wakeups:
    """The wake events of the run loops of one process; an accept sets them all."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def notify(self) -> None:
        for event in self._events:
            event.set()

    def add(self, event: asyncio.Event) -> None:
        self._events.add(event)

    def discard(self, event: asyncio.Event) -> None:
        self._events.discard(event)


class RunLoop:
    """One ``Outbox.run`` / ``Outbox.running``: its session tasks, wake-ups and passes.

    ``start`` it, then ``stop`` it: stopping starts nothing new and returns once every
    delivery it started has finished under its own context."""

    def __init__(
        self,
        *,
        store: Store,
        engine: Engine,
        maintenance: Maintenance,
        tunables: Tunables,
        wiring: Wiring,
        wakeups: Wakeups,
        detached: Detached,
        deliverer: Deliverer,
        tick: float,
    ) -> None:
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.store = store
        self.engine = engine
        self.maintenance = maintenance
        self.tunables = tunables
        self.wiring = wiring
        self.wakeups = wakeups
        self.detached = detached
        self.deliverer = deliverer
        self.tick = tick
        self.wake = asyncio.Event()
        self.active: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.stopping = False
        self.passes: dict[str, asyncio.Task[None]] = {}
        self.owed: dict[str, asyncio.Task[None]] = {}  # owed-hook passes, by workspace
        self.woken: set[str] = set()  # workspaces named by wake-ups since the last pass
        # A wake channel was (re)subscribed: its node may have restarted and lost the tail of
        # its AOF (marks among it), which only a full repair pass finds.
        self.full_repair = False
        self._heard_from: set[str] = set()  # wake channels subscribed at least once
        self._loop: asyncio.Task[None] | None = None
        # Sharded pub/sub: one connection per node owning a bucket's wake channel.
        self._listener = ShardSubscriber(store.client, self._heard, retry_after=tick)

    def start(self) -> None:
        self.wakeups.add(self.wake)
        for channel in self.store.due.wake_channels():
            self._listener.add(channel)
        self._loop = asyncio.create_task(self._run())

    async def wait(self) -> None:
        """Until the loop ends by itself (only a bug ends it: this re-raises that)."""
        assert self._loop is not None
        # Wait without forwarding our cancellation into the loop: valkey-py 6.2 asyncio
        # commands sometimes swallow a CancelledError, so stopping must not rely on one.
        await asyncio.wait({self._loop})
        self.raise_failure()

    def raise_failure(self) -> None:
        """Re-raise what ended the loop, if a bug (not ``stop``) did."""
        loop = self._loop
        if loop is None or not loop.done() or loop.cancelled():
            return
        failure = loop.exception()
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        """Start nothing new, let every in-flight delivery finish, then return."""
        self.stopping = True
        self.wake.set()
        self.wakeups.discard(self.wake)
        await self._listener.aclose()
        started = [t for t in (self._loop,) if t is not None]
        for task in started:
            task.cancel()
        await join([*started, *self.passes.values(), *self.owed.values(), *self.active.values()])

    async def _run(self) -> None:
        t = self.tunables
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self.maintenance.recover()
        last_sweep = last_repair = time.monotonic()
        while not self.stopping:
            self.wake.clear()  # before the read, so a wake-up during it is not lost
            sleep_for = self.tick
            try:
                sleep_for = await self._start_due_sessions()
                now = time.monotonic()
                if (
                    self.wiring.ledger_probe is not None
                    and now - last_sweep >= t.parked_sweep_interval
                ):
                    last_sweep = now
                    self._start_pass("ledger sweep", self._ledger_sweep)
                if (now - last_repair >= t.repair_interval or self.full_repair) and (
                    self._start_pass("repair", self._repair)
                ):
                    last_repair = now
            except TRANSIENT_ERRORS as exc:
                log.warning("valkey unavailable, retrying: %s", exc)
            except Exception:
                log.exception("run loop pass failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the wake event is set, and the loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, sleep_for)):
                    await self.wake.wait()

    async def _start_due_sessions(self) -> float:
        """Visit the workspaces a wake-up named, then every workspace marked due; seconds
        until the next mark falls due."""
        limit = self.tunables.concurrency
        now_ms = self.engine.now_ms()
        woken, self.woken = self.woken, set()
        if woken:  # no bucket scan first: the delivery starts one round trip sooner
            await self._visit(await self.store.due.visits_of(sorted(woken), now_ms, limit), now_ms)
        found, next_ms = await self.store.due.due_visits(now_ms, limit)
        later = await self._visit(found, now_ms)
        if len(self.active) >= self.tunables.concurrency:
            # Full: marks left due now stay for other loops; this one waits for a drain to
            # finish (which sets the wake event) instead of scanning again at once.
            return self.tick
        times = [t for t in (next_ms, later) if t is not None]
        if not times:
            return self.tick
        return min(self.tick, max(0.0, (min(times) - now_ms) / 1000))

    async def _visit(self, found: list[tuple[Mark, Visit]], now_ms: int) -> int | None:
        """Start what each visit found, then move its mark; the earliest new mark (ms)."""
        moves = [(mark, self._start(mark.ws, visit, now_ms)) for mark, visit in found]
        await self.store.due.unmark(moves, grace_ms=self.engine.lease_ms)
        return min((m for _, m in moves if m is not None), default=None)

    def _start(self, ws: str, visit: Visit, now_ms: int) -> int | None:
        """Start the workspace's due sessions not already running here (and its owed hooks);
        when it next needs a visit (ms), or None."""
        t = self.tunables
        later = [x for x in (visit.next_ready_ms,) if x is not None]
        if visit.next_notice_ms is not None:
            if visit.next_notice_ms <= now_ms:
                self._fire_owed_hooks(WorkspaceKeys(ws))  # it takes them for hook_retry_after
                later.append(now_ms + round(t.hook_retry_after * 1000))
            else:
                later.append(visit.next_notice_ms)
        left_due = len(visit.due) >= t.concurrency  # maybe more than the read returned
        for ses in visit.due:
            key = (ws, ses)
            if key not in self.active:
                if self.stopping or len(self.active) >= t.concurrency:
                    left_due = True  # a finishing session sets the wake event
                    break
                task = self.detached.start(self._drain(SessionKeys(*key)))
                self.active[key] = task
                task.add_done_callback(self._on_finished(key))
            # Held now: due again at its lease's expiry, unless its drain lets go sooner (and
            # then marks the workspace itself, see Store.release).
            later.append(now_ms + self.engine.lease_ms)
        return now_ms if left_due else min(later, default=None)

    def _fire_owed_hooks(self, w: WorkspaceKeys) -> None:
        """Start the workspace's owed-hooks pass unless one is still running."""
        if self.wiring.on_delivered is None:
            return
        running = self.owed.get(w.ws)
        if running is not None and not running.done():
            return
        task = self.detached.start(
            self._logged("owed hooks", lambda: self.maintenance.fire_owed_hooks(w))
        )
        self.owed[w.ws] = task
        task.add_done_callback(lambda _t: self.owed.pop(w.ws, None))

    async def _ledger_sweep(self) -> int:
        return await self.maintenance.sweep_ledger_everywhere(lambda: self.stopping)

    def _on_finished(self, key: tuple[str, str]) -> Callable[[asyncio.Task[None]], None]:
        def finished(_task: asyncio.Task[None]) -> None:
            self.active.pop(key, None)
            self.wake.set()

        return finished

    async def _drain(self, k: SessionKeys) -> None:
        try:
            await self.engine.drain(k, self.deliverer, stopping=lambda: self.stopping)
        except TRANSIENT_ERRORS as exc:
            log.warning("session step interrupted: %s", exc, extra={"ws": k.ws, "ses": k.ses})
        except Exception:
            log.exception("session step failed", extra={"ws": k.ws, "ses": k.ses})

    def _heard(self, channel: str, ws: str | None) -> None:
        """A mark published its workspace (visit it at once), an interrupt asks for an abort
        (``DueIndex.ask_abort``), or a wake channel was (re)subscribed (``None``: a message
        may have been missed, so scan the buckets; and when subscribed AGAIN, its node may
        have restarted, so repair everything once)."""
        abort = parse_abort(ws) if ws else None
        if abort is not None:
            if abort[:2] in self.active:  # the engine checks the entry: it may be another
                self.detached.start(self._logged("abort", lambda: self._abort(*abort)))
            return
        if ws:
            self.woken.add(ws)
        elif channel in self._heard_from:
            self.full_repair = True
        self._heard_from.add(channel)
        self.wake.set()

    async def _abort(self, ws: str, ses: str, entry_id: str) -> int:
        await self.engine.abort(ws, ses, entry_id)
        return 0

    def _start_pass(self, name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> bool:
        """Start a maintenance pass unless the last one of its kind is still running (then
        False). Detached: its I/O is the caller's (ledger probes, hooks) and must never hold
        up delivery."""
        running = self.passes.get(name)
        if running is not None and not running.done():
            return False
        self.passes[name] = self.detached.start(self._logged(name, body))
        return True

    async def _repair(self) -> int:
        """A repair pass, full if one was asked for; a full one that fails is asked again."""
        full, self.full_repair = self.full_repair, False
        try:
            return await self.maintenance.repair(full=full)
        except BaseException:
            self.full_repair = self.full_repair or full
            raise

    @staticmethod
    async def _logged(name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> None:
        try:
            await body()
        except Exception:
            log.exception("%s pass failed", name)
