"""The run loop: scheduling only. It finds due sessions through the ready index, hands each
to the engine (``Engine.drain``) in parallel, starts the maintenance passes when they are due,
and joins everything it started when it stops.

Work is found without scanning the keyspace: every session script keeps a per-workspace ZSET
of sessions with due work (score = when), and a registry of workspaces. An accept wakes the
loop at once (``Wakeups`` in this process, a published message across processes), so an idle
loop starts delivering within milliseconds; ``tick`` only bounds a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.callbacks import Deliverer, Wiring
from ..core.keys import SessionKeys
from ..core.settings import Tunables
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
        self._loop: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.wakeups.add(self.wake)
        self._listener = asyncio.create_task(self._listen())
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
        started = [t for t in (self._loop, self._listener) if t is not None]
        for task in started:
            task.cancel()
        await join([*started, *self.passes.values(), *self.active.values()])

    async def _run(self) -> None:
        t = self.tunables
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self.maintenance.recover()
        last_sweep = last_repair = last_notices = time.monotonic()
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
                if (
                    self.wiring.on_delivered is not None
                    and now - last_notices >= t.hook_retry_after / 4
                ):
                    last_notices = now
                    self._start_pass("owed hooks", self.maintenance.fire_owed_hooks)
                if now - last_repair >= t.repair_interval:
                    last_repair = now
                    await self.maintenance.repair()
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
        """Start a task per due session not already running here; seconds until the next due."""
        t = self.tunables
        now_ms = self.engine.now_ms()
        workspaces = list(await self.store.workspaces())
        due, next_ms = await self.store.due_sessions(workspaces, now_ms, limit=t.concurrency)
        for key in due:
            if self.stopping or len(self.active) >= t.concurrency:
                return self.tick  # a finishing session sets the wake event
            if key not in self.active:
                task = self.detached.start(self._drain(SessionKeys(*key)))
                self.active[key] = task
                task.add_done_callback(self._on_finished(key))
        if next_ms is None:
            return self.tick
        return min(self.tick, max(0.0, (next_ms - now_ms) / 1000))

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

    async def _listen(self) -> None:
        """Set the wake event on every published accept; reconnect after a Valkey outage."""
        while not self.stopping:
            try:
                async for ws in self.store.wake_ups():
                    if self.stopping:
                        return
                    if ws:
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("wake-up channel lost: %s", exc)
            await asyncio.sleep(self.tick)

    def _start_pass(self, name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> None:
        """Start a maintenance pass unless the last one of its kind is still running.
        Detached: its I/O is the caller's (ledger probes, hooks) and must never hold up
        delivery."""
        running = self.passes.get(name)
        if running is None or running.done():
            self.passes[name] = self.detached.start(self._logged(name, body))

    @staticmethod
    async def _logged(name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> None:
        try:
            await body()
        except Exception:
            log.exception("%s pass failed", name)
