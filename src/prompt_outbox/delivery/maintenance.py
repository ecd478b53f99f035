"""Periodic maintenance, under one owner: recover dead workers' staging, repair the work
index and prune idle workspaces, make the OnDelivered calls dead workers owed, and settle
error entries against the ledger probe. The run loop decides when; this module decides how.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..core import machine
from ..core.callbacks import LedgerProbe, Wiring
from ..core.entry import decode_entry
from ..core.failpoints import CrashPoint, reached
from ..core.keys import SessionKeys, WorkspaceKeys
from ..core.ledger import LEDGER_DELIVERED, LEDGER_NOT_DELIVERED
from ..core.metrics import Metrics
from ..core.settings import Tunables
from ..storage.store import Store
from .engine import Engine
from .tasks import never

log = logging.getLogger("prompt_outbox.maintenance")

FULL_REPAIR_EVERY = 288
"""One scheduled repair pass in this many covers every workspace (a day at the default 5
minutes). A mark lost with a node's unsynced AOF tail changes no generation, so only a full
pass finds it: the run loop also asks for one whenever a wake channel is subscribed again
(its node may have restarted), and at start."""

RECOVER_BATCH = 256
"""Sessions whose staging lengths recovery reads in one pipelined round trip."""

OWED_HOOKS_PER_PASS = 100
"""Owed OnDelivered calls taken per workspace per pass (the rest wait for the next pass)."""


class Maintenance:
    """The slow passes of one Outbox. Each is safe to run at any time, on any replica."""

    def __init__(
        self, store: Store, engine: Engine, tunables: Tunables, metrics: Metrics, wiring: Wiring
    ) -> None:
        self.store = store
        self.engine = engine
        self.tunables = tunables
        self.metrics = metrics
        self.wiring = wiring
        self._repairs = 0
        # Workspaces the last repair found with nothing due -> the generation it read.
        self._quiet: dict[str, str] = {}

    async def recover(self) -> int:
        """Requeue staged entries left by a crash as verifying, at their session's head.

        Takes each session's lock before reading its staging, so a living delivery (which
        holds it) is never second-guessed; an ID already in the queue is never added twice.
        Returns the number of entries requeued.
        """
        await self.store.due.migrate_legacy_registry(self.engine.now_ms())
        total = 0
        batch: list[SessionKeys] = []
        async for found in self.store.walk.all_sessions():
            batch.extend(found.sessions)
            if len(batch) >= RECOVER_BATCH:
                total += await self._recover_staged(batch)
                batch = []
        return total + await self._recover_staged(batch)

    async def _recover_staged(self, sessions: list[SessionKeys]) -> int:
        """Recover those of ``sessions`` whose staging is not empty (one read for all)."""
        if not sessions:
            return 0
        total = 0
        lengths = await self.store.walk.staging_lengths(sessions)
        for k, n in zip(sessions, lengths, strict=True):
            if n:
                total += await self.engine.recover_session(k)
        return total

    async def repair(self, *, full: bool = False) -> int:
        """The slow safety net: re-derive the sessions' index entries, mark each workspace in
        the due index by its earliest work, and drop workspaces idle for
        ``idle_workspace_ttl`` from the registry. The run loop calls it every
        ``repair_interval``. With ``full``, every ``FULL_REPAIR_EVERY``-th call and the first,
        it covers every workspace; otherwise it leaves out those it last found with nothing due
        and that no writer marked since (nothing can have changed them), so idle tenants cost
        one registry read per pass, not a script per session. Returns how many it covered."""
        now_ms = self.engine.now_ms()
        idle_ms = self.tunables.idle_workspace_ttl * 1000
        full = full or self._repairs % FULL_REPAIR_EVERY == 0
        self._repairs += 1
        if full:
            await self._register_lost(now_ms)
        quiet: dict[str, str] = {}
        covered = 0
        async for found in self.store.walk.all_sessions(unless=None if full else self._quiet):
            covered += 1
            self._quiet.pop(found.workspace.ws, None)
            for k in found.sessions:
                await self.store.repair(k, now_ms)
            if not await self.store.due.remark(found.workspace) and found.sessions:
                # Entries, none due or owed: only a writer that makes work due sooner (and
                # so marks; an accept behind a ready session does not) can change that. One
                # with work is repaired every pass (deliveries change it unmarked), an empty
                # one until it is pruned.
                quiet[found.workspace.ws] = found.generation  # as read BEFORE the repair
            if now_ms - found.touched_ms > idle_ms:
                await self.store.walk.prune_idle_workspace(found.workspace, found.generation)
        if full:
            self._quiet = quiet
        else:
            self._quiet.update(quiet)
        return covered

    async def _register_lost(self, now_ms: int) -> None:
        """Register (and mark due) every workspace that holds work but that the registry lost:
        a bucket's node that failed over before its replica had the write, or an AOF tail
        lost in a restart. SCAN finds them; the registry cannot."""
        registered = await self.store.walk.workspaces()
        for ws in sorted(await self.store.walk.scan_workspaces() - registered.keys()):
            log.warning("a workspace missing from the registry was found", extra={"workspace": ws})
            await self.store.due.mark(ws, now_ms)

    async def fire_owed_hooks(self, w: WorkspaceKeys) -> int:
        """Make the workspace's OnDelivered calls that claims owe and whose workers did not
        make them in time (killed after the claim). The run loop starts this when a visit
        finds one due. Returns how many were made."""
        if self.wiring.on_delivered is None:
            return 0
        grace_ms = round(self.tunables.hook_retry_after * 1000)
        owed = await self.store.take_notices(w, self.engine.now_ms(), grace_ms, OWED_HOOKS_PER_PASS)
        for ses, entry_id, raw in owed:
            log.warning(
                "firing an OnDelivered its worker never made",
                extra={"workspace": w.ws, "session": ses, "entry": entry_id},
            )
            self.metrics.hooks_refired.inc()
            await self.engine.notify(SessionKeys(w.ws, ses), decode_entry(raw))
        return len(owed)

    async def sweep_ledger_everywhere(self, stopping: Callable[[], bool] = never) -> int:
        """``sweep_ledger`` for every workspace that holds an error entry, until ``stopping()``
        (each probe may take up to ``delivery_timeout``: a stopping loop must not wait for all)."""
        if self.wiring.ledger_probe is None:
            return 0
        total = 0
        async for found in self.store.walk.all_sessions(with_errors=True):
            total += await self._sweep_sessions(found.sessions, stopping)
            if stopping():
                break
        return total

    async def sweep_ledger(self, w: WorkspaceKeys) -> int:
        """Settle the workspace's error entries against the ledger probe (no-op without one).

        Delivered (PROMOTED / TURN_ENDED) completes the entry and fires OnDelivered; no row (or
        FAILED) re-arms it as pending; anything else, or a probe error, leaves it. Entries that
        failed definitively ``max_attempts`` times are not asked about. Returns how many settled.
        """
        if self.wiring.ledger_probe is None:
            return 0
        return await self._sweep_sessions(await self.store.walk.sessions_of(w, with_errors=True))

    async def _sweep_sessions(
        self, sessions: list[SessionKeys], stopping: Callable[[], bool] = never
    ) -> int:
        total = 0
        for k in sessions:
            probe = self.wiring.ledger_probe
            if probe is None or stopping():
                break
            total += await self._sweep_session(k, probe)
        return total

    async def _sweep_session(self, k: SessionKeys, probe: LedgerProbe) -> int:
        settled = 0
        async with self.engine.holding(k) as lockval:
            if lockval is None:
                log.info(
                    "ledger sweep skipped a busy session",
                    extra={"workspace": k.ws, "session": k.ses},
                )
                return 0
            snap = await self.store.snapshot(k)
            if snap.staging:  # recovered first, as for every operator action
                await self.engine.requeue_staged(k, lockval, snap.staging)
                snap = await self.store.snapshot(k)
            for raw in snap.queue:
                e = decode_entry(raw)
                if not machine.is_ledger_sweepable(e):
                    continue
                try:
                    async with asyncio.timeout(self.tunables.delivery_timeout):
                        state = await probe(k.ws, k.ses, e.id, machine.current_attempt(e))
                except Exception as exc:
                    log.info(
                        "ledger probe failed: %s", exc, extra={"workspace": k.ws, "entry": e.id}
                    )
                    continue
                reached(CrashPoint.SWEEP_AFTER_PROBE)
                if state in LEDGER_DELIVERED:
                    settled += await self.engine.claim(k, lockval, e, "ledger")
                elif state in LEDGER_NOT_DELIVERED:
                    self.metrics.retried.labels(reason="ledger").inc()
                    settled += await self.engine.swap(k, lockval, raw, machine.rearmed_by_ledger(e))
        return settled
