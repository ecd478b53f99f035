"""The run loop: find due sessions through the ready index, deliver them in parallel, join.

Work is found without scanning the keyspace: every session script keeps a per-workspace ZSET
of sessions with due work (score = when), and a registry of workspaces. An accept publishes a
wake-up, so an idle loop starts delivering within milliseconds; ``tick`` only bounds a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .keys import SessionKeys, workspace_keys
from .outbox import _TRANSIENT_STORE_ERRORS, Step, _lock_value

if TYPE_CHECKING:
    from .callbacks import Deliverer
    from .outbox import Outbox

log = logging.getLogger("prompt_outbox.worker")


class RunLoop:
    """One ``Outbox.run`` call: its session tasks, its wake-ups and its periodic passes."""

    def __init__(self, outbox: Outbox, deliverer: Deliverer, tick: float) -> None:
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.outbox = outbox
        self.deliverer = deliverer
        self.tick = tick
        self.wake = asyncio.Event()
        self.active: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.stopping = False
        self.sweeper: asyncio.Task[None] | None = None
        self.notifier: asyncio.Task[None] | None = None

    async def run(self) -> None:
        ob = self.outbox
        ob._wakers.add(self.wake)
        listener = asyncio.create_task(self._listen())
        loop = asyncio.create_task(self._loop())
        try:
            # Wait without forwarding our cancellation into the loop: valkey-py 6.2 asyncio
            # commands sometimes swallow a CancelledError, so stopping must not rely on one.
            await asyncio.wait({loop})
            loop.result()  # the loop only returns by raising (a bug) or when stopping
        finally:
            # Cancelled (or failed): start nothing new, let every in-flight delivery finish
            # under its own context, and only then return.
            self.stopping = True
            self.wake.set()
            ob._wakers.discard(self.wake)
            listener.cancel()
            loop.cancel()
            passes = [t for t in (self.sweeper, self.notifier) if t is not None]
            await _join([loop, listener, *passes, *self.active.values()])

    async def _loop(self) -> None:
        t = self.outbox.tunables
        with contextlib.suppress(*_TRANSIENT_STORE_ERRORS):
            await self.outbox.recover()
        last_sweep = last_repair = last_notices = time.monotonic()
        while not self.stopping:
            self.wake.clear()  # before the read, so a wake-up during it is not lost
            sleep_for = self.tick
            try:
                sleep_for = await self._start_due_sessions()
                now = time.monotonic()
                if (
                    self.outbox._ledger_probe is not None
                    and now - last_sweep >= t.parked_sweep_interval
                ):
                    last_sweep = now
                    self.sweeper = self._start_pass(self.sweeper, self._ledger_sweep)
                if (
                    self.outbox._on_delivered is not None
                    and now - last_notices >= t.hook_retry_after / 4
                ):
                    last_notices = now
                    self.notifier = self._start_pass(self.notifier, self._owed_hooks)
                if now - last_repair >= t.repair_interval:
                    last_repair = now
                    await self._repair()
            except _TRANSIENT_STORE_ERRORS as exc:
                log.warning("valkey unavailable, retrying: %s", exc)
            except Exception:
                log.exception("run loop pass failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the wake event is set, and run() would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, sleep_for)):
                    await self.wake.wait()

    async def _start_due_sessions(self) -> float:
        """Start a task per due session not already running here; seconds until the next due."""
        ob = self.outbox
        t = ob.tunables
        now_ms = ob._now_ms()
        workspaces = list(await ob._store.workspaces())
        due, next_ms = await ob._store.due_sessions(workspaces, now_ms, limit=t.concurrency)
        for key in due:
            if self.stopping or len(self.active) >= t.concurrency:
                return self.tick  # a finishing session sets the wake event
            if key not in self.active:
                task = ob._detach(self._drain(SessionKeys(*key)))
                self.active[key] = task
                task.add_done_callback(self._on_finished(key))
        if next_ms is None:
            return self.tick
        return min(self.tick, max(0.0, (next_ms - now_ms) / 1000))

    def _on_finished(self, key: tuple[str, str]) -> Callable[[asyncio.Task[None]], None]:
        def finished(_task: asyncio.Task[None]) -> None:
            self.active.pop(key, None)
            self.wake.set()

        return finished

    async def _drain(self, k: SessionKeys) -> None:
        """Deliver one session until nothing is due, keeping its lock between entries."""
        ob = self.outbox
        lockval = _lock_value(ob._clock())
        step = Step.NONE
        try:
            while not self.stopping:
                step = await ob._step(k, self.deliverer, lockval)
                if step is not Step.ACTED:
                    return
        except _TRANSIENT_STORE_ERRORS as exc:
            log.warning("session step interrupted: %s", exc, extra={"ws": k.ws, "ses": k.ses})
        except Exception:
            log.exception("session step failed", extra={"ws": k.ws, "ses": k.ses})
        finally:
            if step is Step.ACTED:
                await ob._release(k, lockval)

    async def _listen(self) -> None:
        """Set the wake event on every published accept; reconnect after a Valkey outage."""
        while not self.stopping:
            try:
                async for ws in self.outbox._store.wake_ups():
                    if self.stopping:
                        return
                    if ws:
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("wake-up channel lost: %s", exc)
            await asyncio.sleep(self.tick)

    async def _ledger_sweep(self) -> None:
        ob = self.outbox
        try:
            for ws in await ob._store.workspaces():
                if self.stopping:
                    return
                if await ob._store.members(workspace_keys(ws).errors):
                    await ob.sweep_workspace_parked_errors(ws)
        except Exception:
            log.exception("parked-error sweep failed")

    def _start_pass(
        self, running: asyncio.Task[None] | None, body: Callable[[], Coroutine[Any, Any, None]]
    ) -> asyncio.Task[None]:
        """Start a periodic pass unless the last one of its kind is still running. Detached:
        its I/O is the caller's (ledger probes, hooks) and must never hold up delivery."""
        if running is None or running.done():
            return self.outbox._detach(body())
        return running

    async def _owed_hooks(self) -> None:
        try:
            await self.outbox._fire_owed_hooks()
        except Exception:
            log.exception("owed-hook pass failed")

    async def _repair(self) -> None:
        """The slow safety net: re-derive every session's index entries, prune idle workspaces."""
        ob = self.outbox
        now_ms = ob._now_ms()
        idle_ms = ob.tunables.idle_workspace_ttl * 1000
        for ws, touched_ms in (await ob._store.workspaces()).items():
            for ses in await ob._store.members(workspace_keys(ws).sessions):
                await ob._store.repair(SessionKeys(ws, ses), now_ms)
            if now_ms - touched_ms > idle_ms:
                await ob._store.prune_idle_workspace(ws, touched_ms)


async def _join(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for every task, even if the caller is cancelled again meanwhile."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            continue
