"""Operator actions: retry, dismiss, edit, park, unpark, the sweeps, cleanup and counts.

Every action that writes holds the session: it is refused (BUSY) while a delivery holds the
lock, because contention is not absence. Each first recovers a dead worker's staged entries,
so it never acts around them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from .core import machine
from .core.callbacks import BulkResult, DismissResult, EditResult, RetryResult
from .core.entry import Entry, Status, decode_entry
from .core.errors import InvalidInput, StorageFull, WorkspaceLogsFull
from .core.failpoints import CrashPoint, reached
from .core.keys import SessionKeys, WorkspaceKeys, check_id, session_keys, workspace_keys
from .core.metrics import Metrics
from .core.validate import check_model, check_reason, check_text
from .delivery.engine import Engine
from .delivery.maintenance import Maintenance
from .storage.replies import Counted, Edited, Replace, Snapshot
from .storage.store import Store

log = logging.getLogger("prompt_outbox.admin")

Pick = Callable[[Snapshot], tuple[str, str] | None]
"""Given the session, the (old, new) strings of the one entry to change ('' deletes)."""
Edit = Callable[[Entry], Entry | None]
"""An entry's new state, or None to leave it."""
Pairs = Callable[[Snapshot], list[tuple[str, str]]]
"""Given an idle session, the (old, new) strings of the queued entries to change ('' deletes)."""


def _edited(edit: Edit) -> Pairs:
    """The pairs of the queued entries ``edit`` changes."""
    return lambda snap: [
        (raw, new.to_json()) for raw in snap.queue if (new := edit(decode_entry(raw))) is not None
    ]


def _errors_removed(snap: Snapshot) -> list[tuple[str, str]]:
    return [(raw, "") for raw in snap.queue if decode_entry(raw).status is Status.ERROR]


def _retried_if_error(e: Entry) -> Entry | None:
    return machine.retried(e) if e.status is Status.ERROR else None


class _Edit(enum.IntEnum):
    """One-entry edit outcome; values line up with RetryResult and DismissResult."""

    DONE = 0
    MISSING = 1
    BUSY = 2


class Admin:
    """The operator actions of one Outbox; each is documented on the ``Outbox`` method that
    exposes it."""

    def __init__(
        self, store: Store, engine: Engine, maintenance: Maintenance, metrics: Metrics
    ) -> None:
        self.store = store
        self.engine = engine
        self.maintenance = maintenance
        self.metrics = metrics

    async def retry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """``Outbox.retry``."""

        def pick(snap: Snapshot) -> tuple[str, str] | None:
            raw = _find(snap.queue, entry_id)
            if raw is None or (e := decode_entry(raw)).status is not Status.ERROR:
                return None
            return raw, machine.retried(e).to_json()

        k = session_keys(workspace_id, session_id)
        # A client's retry re-arms the entry for more moves, each logging it whole: it stops
        # at the workspace's log bound, as an accept does.
        bound = self.engine.tunables.workspace_log_bytes
        point = CrashPoint.RETRY_BEFORE_WRITE
        result = RetryResult(await self._edit_one(k, entry_id, pick, point, log_bytes=bound))
        if result is RetryResult.UPDATED:
            self.metrics.retried.labels(reason="operator").inc()
        return result

    async def dismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """``Outbox.dismiss``."""

        def pick(snap: Snapshot) -> tuple[str, str] | None:
            raw = _find((*snap.staging, *snap.queue), entry_id)
            return None if raw is None else (raw, "")

        k = session_keys(workspace_id, session_id)
        return DismissResult(
            await self._edit_one(k, entry_id, pick, CrashPoint.DISMISS_BEFORE_WRITE)
        )

    async def edit(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        text: str | None = None,
        model: str | None = None,
    ) -> EditResult:
        """``Outbox.edit``."""
        check_id("entry ID", entry_id)
        if text is None and model is None:
            raise InvalidInput("an edit needs a text or a model")
        text = None if text is None else check_text(text)
        new_model = None if model is None else check_model(model)
        k = session_keys(workspace_id, session_id)
        # An edit logs the whole entry again (its event): it grows memory as an accept does,
        # so it stops at the same ceiling.
        over = await self.store.memory.over(k)
        if over is not None:
            raise StorageFull(over.used, over.limit)
        bound = self.engine.tunables.workspace_log_bytes  # and at its workspace's log bound
        for _ in range(3):
            snap = await self._settled(k)
            if snap.locked:
                return EditResult.BUSY
            raw = _find(snap.queue, entry_id)
            if raw is None:
                return EditResult.NOT_FOUND
            e = decode_entry(raw)
            if e.status not in (Status.PENDING, Status.ERROR):
                return EditResult.NOT_EDITABLE
            new = replace(
                e,
                text=e.text if text is None else text,
                model=e.model if model is None else new_model,
            )
            try:
                done = await self.store.edit(k, raw, new.to_json(), entry_id, log_bytes=bound)
            except WorkspaceLogsFull:
                self.metrics.refused_logs_full.inc()
                raise
            if done is Edited.OK:
                self.metrics.edited.inc()
                return EditResult.UPDATED
            if done is Edited.BUSY:
                return EditResult.BUSY
        return EditResult.BUSY  # it kept changing under us: contention, not absence

    async def park_workspace(self, workspace_id: str, reason: str) -> int:
        """``Outbox.park_workspace``."""
        check_reason(reason)

        def edit(e: Entry) -> Entry | None:
            if e.status in (Status.PENDING, Status.VERIFYING):
                return machine.parked(e, reason)
            return None

        w = workspace_keys(workspace_id)
        n = await self._edit_workspace(w, "park", edit, CrashPoint.PARK_BETWEEN_SESSIONS)
        self.metrics.parked.inc(n)
        return n

    async def unpark_workspace(self, workspace_id: str) -> int:
        """``Outbox.unpark_workspace``."""

        def edit(e: Entry) -> Entry | None:
            return machine.unparked(e) if e.status is Status.PARKED else None

        return await self._edit_workspace(workspace_keys(workspace_id), "unpark", edit)

    async def sweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """``Outbox.sweep_workspace_unverifiable``."""

        def edit(e: Entry) -> Entry | None:
            return machine.rearmed_for_verification(e) if machine.is_unverifiable(e) else None

        return await self._edit_workspace(workspace_keys(workspace_id), "sweep", edit)

    async def sweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """``Outbox.sweep_workspace_parked_errors`` (``Maintenance.sweep_ledger``)."""
        return await self.maintenance.sweep_ledger(workspace_keys(workspace_id))

    async def retry_errors(self, workspace_id: str, session_id: str | None) -> BulkResult:
        """``Outbox.retry_errors``."""
        keys = await self._with_errors(workspace_id, session_id)
        bound = self.engine.tunables.workspace_log_bytes  # as retry's
        retried = _edited(_retried_if_error)
        done = await self._edit_sessions(keys, "retry errors", retried, log_bytes=bound)
        self.metrics.retried.labels(reason="operator").inc(done.done)
        return done

    async def dismiss_errors(self, workspace_id: str, session_id: str | None) -> BulkResult:
        """``Outbox.dismiss_errors``."""
        keys = await self._with_errors(workspace_id, session_id)
        return await self._edit_sessions(keys, "dismiss errors", _errors_removed)

    async def _with_errors(self, workspace_id: str, session_id: str | None) -> list[SessionKeys]:
        """The session named, or every session of the workspace holding an error entry (the
        errors index: the others have nothing to do)."""
        if session_id is not None:
            return [session_keys(workspace_id, session_id)]
        return await self.store.walk.sessions_of(workspace_keys(workspace_id), with_errors=True)

    async def cleanup_workspace(self, workspace_id: str) -> int:
        """``Outbox.cleanup_workspace``."""
        return await self.store.walk.cleanup_workspace(workspace_keys(workspace_id))

    async def count_by_workspace(self) -> dict[str, dict[str, int]]:
        """``Outbox.count_by_workspace``: each registered workspace's totals by status, as the
        scripts keep them (a few small fields a workspace, pipelined): O(workspaces), no
        entry read."""
        out: dict[str, dict[str, int]] = {}
        async for t in self.store.walk.all_tallies():
            out[t.ws] = {status: n for status, n in t.tally.by_status.items() if n}
        return out

    async def count_by_status(self) -> dict[str, int]:
        """``Outbox.count_by_status``."""
        total: dict[str, int] = {}
        for counts in (await self.count_by_workspace()).values():
            for status, n in counts.items():
                total[status] = total.get(status, 0) + n
        return total

    # -- how an action sees and changes a session -------------------------------------------

    async def _settled(self, k: SessionKeys) -> Snapshot:
        """The session as an operator action must see it: a dead worker's staged entries
        (staging with no holder) are recovered first, so the action finds them where they
        belong (in the queue, verifying). Acting around them would miss them (a park that
        leaves one to be re-sent) or reorder them (a retried older entry behind them)."""
        snap = await self.store.snapshot(k)
        if snap.staging and not snap.locked:
            await self.engine.recover_session(k)
            snap = await self.store.snapshot(k)
        return snap

    async def _edit_one(
        self, k: SessionKeys, entry_id: str, pick: Pick, point: CrashPoint, log_bytes: int = 0
    ) -> _Edit:
        """Swap one entry unless the lock is held. A swap that misses because the entry
        changed meanwhile is retried on a new read. ``log_bytes``: ``_replace``'s."""
        check_id("entry ID", entry_id)
        for _ in range(3):
            snap = await self._settled(k)
            if snap.locked:
                return _Edit.BUSY
            pair = pick(snap)
            if pair is None:
                return _Edit.MISSING
            reached(point)
            done = await self._replace(k, [pair], log_bytes)
            if done.outcome is Replace.BUSY:
                return _Edit.BUSY
            if done.count:
                return _Edit.DONE
        return _Edit.MISSING

    async def _edit_workspace(
        self, w: WorkspaceKeys, what: str, edit: Edit, point: CrashPoint | None = None
    ) -> int:
        """Apply ``edit`` to every entry of every idle session of the workspace."""
        keys = await self.store.walk.sessions_of(w)
        return (await self._edit_sessions(keys, what, _edited(edit), point)).done

    async def _edit_sessions(
        self,
        keys: Sequence[SessionKeys],
        what: str,
        pairs_of: Pairs,
        point: CrashPoint | None = None,
        log_bytes: int = 0,
    ) -> BulkResult:
        """Write ``pairs_of`` each idle session; a session a delivery holds is skipped (and
        named in the result), never waited for. ``log_bytes``: ``_replace``'s (a refusal ends
        the walk; the sessions written before it stay written, each in one step)."""
        total, busy = 0, []
        for k in keys:
            snap = await self._settled(k)
            if snap.locked:
                busy.append(k.ses)
                continue
            pairs = pairs_of(snap)
            if not pairs:
                continue
            done = await self._replace(k, pairs, log_bytes)
            if done.outcome is Replace.BUSY:
                busy.append(k.ses)
            total += done.count
            if point is not None:
                reached(point)
        if busy:
            ws = keys[0].ws
            log.warning("%s skipped busy sessions", what, extra={"workspace": ws, "sessions": busy})
        return BulkResult(total, tuple(busy))

    async def _replace(
        self, k: SessionKeys, pairs: list[tuple[str, str]], log_bytes: int
    ) -> Counted[Replace]:
        """An operator's swap (no lock held); ``log_bytes`` > 0 refuses it at the workspace's
        log bound (``WorkspaceLogsFull``, counted), 0 never."""
        try:
            return await self.store.replace(k, "", self.engine.now_ms(), pairs, log_bytes=log_bytes)
        except WorkspaceLogsFull:
            self.metrics.refused_logs_full.inc()
            raise


def _find(raws: Sequence[str], entry_id: str) -> str | None:
    return next((raw for raw in raws if decode_entry(raw).id == entry_id), None)
