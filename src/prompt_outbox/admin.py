"""Operator actions: retry, dismiss, edit, park, unpark, the sweeps, cleanup and counts.

Reach them as ``Outbox.admin`` (``outbox.admin.retry(...)``); the ``Outbox`` methods of the
same names are aliases of these (``AdminAlias``). Every action that writes holds the session: it
is refused (BUSY) while a delivery holds the lock, because contention is not absence. Each
first recovers a dead worker's staged entries, so it never acts around them.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from .core import machine
from .core.callbacks import BulkResult, DismissResult, EditResult, RetryResult
from .core.entry import Entry, Status, decode_entry
from .core.errors import InvalidInput, StorageFull, WorkspaceBytesFull
from .core.failpoints import CrashPoint, reached
from .core.keys import SessionKeys, WorkspaceKeys, check_id, session_keys, workspace_keys
from .core.metrics import Metrics
from .core.validate import check_model, check_reason, check_text
from .delivery.engine import Engine
from .delivery.maintenance import Maintenance
from .storage.replies import Counted, Edited, Found, Replace, Slice
from .storage.store import Store

log = logging.getLogger("prompt_outbox.admin")

SWAP_ATTEMPTS = 3
"""Reads a one-entry action tries when its write misses because the entry changed in
between (a delivery took or moved it); after that it gives up (contention, not a loop)."""

SLICE_BYTES = 1024 * 1024
"""The most bytes of entries an action on many of them reads at a time (``Picks.entries``):
what it holds in memory, whatever the session holds."""

Pick = Callable[[Found], tuple[str, str] | None]
"""Given the entry as found, the (old, new) strings to change ('' deletes), or None."""
Change = Callable[[Entry], Entry | None]
"""An entry's new state, or None to leave it."""
Pairs = Callable[[Sequence[str]], list[tuple[str, str]]]
"""Given queued entries of an idle session, the (old, new) strings to change ('' deletes)."""

R = TypeVar("R")
Read = TypeVar("Read", Found, Slice)
P = ParamSpec("P")


class Swap(enum.Enum):
    """How a one-entry swap ended; retry and dismiss each name their result for it."""

    DONE = "done"
    MISSING = "missing"
    BUSY = "busy"


_RETRY_RESULTS: Mapping[Swap, RetryResult] = {
    Swap.DONE: RetryResult.UPDATED,
    Swap.MISSING: RetryResult.NOT_FOUND,
    Swap.BUSY: RetryResult.BUSY,
}
_DISMISS_RESULTS: Mapping[Swap, DismissResult] = {
    Swap.DONE: DismissResult.REMOVED,
    Swap.MISSING: DismissResult.NOT_FOUND,
    Swap.BUSY: DismissResult.BUSY,
}


def _pairs(change: Change) -> Pairs:
    """The pairs of the queued entries ``change`` changes."""
    return lambda raws: [
        (raw, new.to_json()) for raw in raws if (new := change(decode_entry(raw))) is not None
    ]


def _removed(raws: Sequence[str]) -> list[tuple[str, str]]:
    """Every entry of a slice removed (its statuses chose them)."""
    return [(raw, "") for raw in raws]


_PARKABLE = (Status.PENDING, Status.VERIFYING)


def _retried_if_error(e: Entry) -> Entry | None:
    return machine.retried(e) if e.status is Status.ERROR else None


class Admin:
    """The operator actions of one Outbox (``Outbox.admin``)."""

    def __init__(
        self, store: Store, engine: Engine, maintenance: Maintenance, metrics: Metrics
    ) -> None:
        self._store = store
        self._engine = engine
        self._maintenance = maintenance
        self._metrics = metrics

    async def retry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Clear an error entry back to pending. BUSY while the session lock is held;
        NOT_FOUND when the session has no error entry with that ID. ``WorkspaceBytesFull``
        at the workspace's byte budget, as an accept (a re-armed entry logs each move whole)."""

        def pick(found: Found) -> tuple[str, str] | None:
            if not found.raw or found.in_staging:
                return None
            if (e := decode_entry(found.raw)).status is not Status.ERROR:
                return None
            return found.raw, machine.retried(e).to_json()

        k = session_keys(workspace_id, session_id)
        # A client's retry re-arms the entry for more moves, each logging it whole: it stops
        # at the workspace's byte budget, as an accept does.
        point = CrashPoint.RETRY_BEFORE_WRITE
        swap = await self._swap_one(k, entry_id, pick, point, budgeted=True)
        if swap is Swap.DONE:
            self._metrics.retried.labels(reason="operator").inc()
        return _RETRY_RESULTS[swap]

    async def dismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Remove an entry by ID. BUSY while the session lock is held; NOT_FOUND if absent."""

        def pick(found: Found) -> tuple[str, str] | None:
            return (found.raw, "") if found.raw else None

        k = session_keys(workspace_id, session_id)
        swap = await self._swap_one(k, entry_id, pick, CrashPoint.DISMISS_BEFORE_WRITE)
        return _DISMISS_RESULTS[swap]

    async def edit(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        text: str | None = None,
        model: str | None = None,
    ) -> EditResult:
        """Replace the text or the model (raw JSON text; ``"null"`` removes it; None leaves
        either as it is) of a pending or error entry before it is sent. An error entry stays
        in error until retried. BUSY while the session lock is held; NOT_EDITABLE once staged,
        verifying or parked; NOT_FOUND if absent. Emits ``edited``. Raises accept's InvalidInput
        (an edit of neither too), StorageFull and WorkspaceBytesFull."""
        check_id("entry ID", entry_id)
        if text is None and model is None:
            raise InvalidInput("an edit needs a text or a model")
        text = None if text is None else check_text(text)
        new_model = None if model is None else check_model(model)
        k = session_keys(workspace_id, session_id)
        check_id("entry ID", entry_id)
        # An edit logs the whole entry again (its event): it grows memory as an accept does,
        # so it stops at the same ceiling.
        over = await self._store.memory.over(k)
        if over is not None:
            raise StorageFull(over.used, over.limit)

        async def attempt(found: Found) -> EditResult | None:
            raw = found.raw
            if not raw or found.in_staging:
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
                done = await self._store.edit(k, raw, new.to_json(), entry_id)
            except WorkspaceBytesFull:  # and at its workspace's byte budget
                self._metrics.refused_bytes_full.inc()
                raise
            if done is Edited.OK:
                self._metrics.edited.inc()
                return EditResult.UPDATED
            return EditResult.BUSY if done is Edited.BUSY else None

        # Kept changing under us: contention, not absence.
        busy = EditResult.BUSY
        return await self._attempts(k, entry_id, attempt, busy=busy, gave_up=busy)

    async def park_workspace(self, workspace_id: str, reason: str) -> int:
        """Park every pending / verifying entry of the workspace with ``reason``. Busy sessions
        (a delivery in flight) are skipped and logged; calling again catches them."""
        check_reason(reason)

        def change(e: Entry) -> Entry | None:
            if e.status in (Status.PENDING, Status.VERIFYING):
                return machine.parked(e, reason)
            return None

        w, point = workspace_keys(workspace_id), CrashPoint.PARK_BETWEEN_SESSIONS
        n = await self._change_workspace(w, "park", change, _PARKABLE, point)
        self._metrics.parked.inc(n)
        return n

    async def unpark_workspace(self, workspace_id: str) -> int:
        """Re-arm every parked entry of the workspace (pending, or verifying if it was)."""

        def change(e: Entry) -> Entry | None:
            return machine.unparked(e) if e.status is Status.PARKED else None

        w = workspace_keys(workspace_id)
        return await self._change_workspace(w, "unpark", change, (Status.PARKED,))

    async def sweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Re-arm unverifiable error entries as verifying, due now, with a fresh verify budget."""

        def change(e: Entry) -> Entry | None:
            return machine.rearmed_for_verification(e) if machine.is_unverifiable(e) else None

        w = workspace_keys(workspace_id)
        return await self._change_workspace(w, "sweep", change, (Status.ERROR,))

    async def sweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Settle the workspace's error entries against the ledger probe (no-op without one):
        delivered (PROMOTED / TURN_ENDED) completes one and fires OnDelivered; no row (or FAILED)
        re-arms it; anything else, or a probe error, leaves it. Entries that failed definitively
        ``max_attempts`` times are not asked about. Returns how many settled
        (``Maintenance.sweep_ledger``)."""
        return await self._maintenance.sweep_ledger(workspace_keys(workspace_id))

    async def retry_errors(self, workspace_id: str, session_id: str | None = None) -> BulkResult:
        """Re-arm every error entry of the session (of every session of the workspace, when
        none is named) that no delivery holds; held sessions are named in ``busy`` (try again).
        ``WorkspaceBytesFull`` as ``retry``: the sessions re-armed before it stay so."""
        keys = await self._with_errors(workspace_id, session_id)
        retried = _pairs(_retried_if_error)
        done = await self._write_sessions(
            keys, "retry errors", retried, (Status.ERROR,), budgeted=True
        )
        self._metrics.retried.labels(reason="operator").inc(done.done)
        return done

    async def dismiss_errors(self, workspace_id: str, session_id: str | None = None) -> BulkResult:
        """Remove every error entry of the session (or of the workspace), as ``retry_errors``."""
        keys = await self._with_errors(workspace_id, session_id)
        return await self._write_sessions(keys, "dismiss errors", _removed, (Status.ERROR,))

    async def _with_errors(self, workspace_id: str, session_id: str | None) -> list[SessionKeys]:
        """The session named, or every session of the workspace holding an error entry (the
        errors index: the others have nothing to do)."""
        if session_id is not None:
            return [session_keys(workspace_id, session_id)]
        return await self._store.walk.sessions_of(workspace_keys(workspace_id), with_errors=True)

    async def cleanup_workspace(self, workspace_id: str) -> int:
        """Delete every outbox key of the workspace; returns how many. Idempotent."""
        return await self._store.walk.cleanup_workspace(workspace_keys(workspace_id))

    async def count_by_workspace(self) -> dict[str, dict[str, int]]:
        """Entries per status, per registered workspace (for ``stats``), as the scripts keep
        them (a few small fields a workspace, pipelined): O(workspaces), no entry read."""
        out: dict[str, dict[str, int]] = {}
        async for t in self._store.walk.all_tallies():
            out[t.ws] = {status: n for status, n in t.tally.by_status.items() if n}
        return out

    async def count_by_status(self) -> dict[str, int]:
        """Entries per status across every workspace (the metrics gauge)."""
        total: dict[str, int] = {}
        for counts in (await self.count_by_workspace()).values():
            for status, n in counts.items():
                total[status] = total.get(status, 0) + n
        return total

    # -- how an action sees and changes a session -------------------------------------------

    async def _settled(self, k: SessionKeys, read: Callable[[], Awaitable[Read]]) -> Read:
        """What ``read`` reads of the session, as an operator action must see it: a dead
        worker's staged entries (staging with no holder) are recovered first, so the action
        finds them where they belong (in the queue, verifying). Acting around them would miss
        them (a park that leaves one to be re-sent) or reorder them (a retried older entry
        behind them). ``read``: the one entry (``Picks.entry``) or a slice (``Picks.entries``),
        never the whole session."""
        got = await read()
        if got.staged and not got.locked:
            await self._engine.recover_session(k)
            got = await read()
        return got

    async def _attempts(
        self,
        k: SessionKeys,
        entry_id: str,
        attempt: Callable[[Found], Awaitable[R | None]],
        *,
        busy: R,
        gave_up: R,
    ) -> R:
        """``attempt`` on a fresh read of the entry, up to ``SWAP_ATTEMPTS`` times while it
        returns None (its write missed: the entry changed meanwhile); ``busy`` at once while
        the lock is held, ``gave_up`` after the last miss."""
        for _ in range(SWAP_ATTEMPTS):
            found = await self._settled(k, lambda: self._store.picks.entry(k, entry_id))
            if found.locked:
                return busy
            result = await attempt(found)
            if result is not None:
                return result
        return gave_up

    async def _swap_one(
        self, k: SessionKeys, entry_id: str, pick: Pick, point: CrashPoint, budgeted: bool = False
    ) -> Swap:
        """Swap the one entry ``pick`` names unless the lock is held (``_attempts``).
        ``budgeted``: ``_replace``'s."""
        check_id("entry ID", entry_id)

        async def attempt(found: Found) -> Swap | None:
            pair = pick(found)
            if pair is None:
                return Swap.MISSING
            reached(point)
            done = await self._replace(k, [pair], budgeted)
            if done.outcome is Replace.BUSY:
                return Swap.BUSY
            return Swap.DONE if done.count else None

        return await self._attempts(k, entry_id, attempt, busy=Swap.BUSY, gave_up=Swap.MISSING)

    async def _change_workspace(
        self,
        w: WorkspaceKeys,
        what: str,
        change: Change,
        statuses: Sequence[str],
        point: CrashPoint | None = None,
    ) -> int:
        """Apply ``change`` to every entry in ``statuses`` of every idle session of the
        workspace (``change`` may leave some of them)."""
        keys = await self._store.walk.sessions_of(w)
        return (await self._write_sessions(keys, what, _pairs(change), statuses, point)).done

    async def _write_sessions(
        self,
        keys: Sequence[SessionKeys],
        what: str,
        pairs_of: Pairs,
        statuses: Sequence[str],
        point: CrashPoint | None = None,
        budgeted: bool = False,
    ) -> BulkResult:
        """Write ``pairs_of`` the entries in ``statuses`` of each idle session, a slice of at
        most ``SLICE_BYTES`` at a time (each slice one step); a session a delivery holds is
        skipped (and named in the result), never waited for. ``budgeted``: ``_replace``'s (a
        refusal ends the walk; what was written before it stays written)."""
        total, busy = 0, []
        for k in keys:
            wrote, skip = False, 0  # skip: what the slices before left as it was
            while True:
                read = functools.partial(self._store.picks.entries, k, statuses, SLICE_BYTES, skip)
                got = await self._settled(k, read)
                if got.locked:
                    busy.append(k.ses)
                    break
                pairs = pairs_of(got.entries)
                done = await self._replace(k, pairs, budgeted) if pairs else None
                if done is not None and done.outcome is Replace.BUSY:
                    busy.append(k.ses)
                    break
                wrote = wrote or done is not None
                total += done.count if done is not None else 0
                # An entry changed meanwhile stays as it is (its pair missed), as the rest
                # of the session, and ends the walk of it: it never chases a writer.
                if not got.more or (done is not None and done.count < len(pairs)):
                    break
                skip += len(got.entries) - len(pairs)
            if wrote and point is not None:
                reached(point)
        if busy:
            ws = keys[0].ws
            log.warning("%s skipped busy sessions", what, extra={"workspace": ws, "sessions": busy})
        return BulkResult(total, tuple(busy))

    async def _replace(
        self, k: SessionKeys, pairs: list[tuple[str, str]], budgeted: bool
    ) -> Counted[Replace]:
        """An operator's swap (no lock held); ``budgeted`` refuses it at the workspace's byte
        budget (``WorkspaceBytesFull``, counted), else never."""
        try:
            return await self._store.replace(k, "", self._engine.now_ms(), pairs, budgeted=budgeted)
        except WorkspaceBytesFull:
            self._metrics.refused_bytes_full.inc()
            raise


class HasAdmin(Protocol):
    """What ``AdminAlias`` aliases on: an object with an ``admin`` (the Outbox)."""

    admin: Admin


class AdminAlias(Generic[P, R]):
    """An alias, on the Outbox, of one ``Admin`` method: ``outbox.retry`` is
    ``outbox.admin.retry`` (the same bound method, the same signature); its docstring is the
    real one's (with its signature, for help()), written once, on the ``Admin`` method."""

    def __init__(self, method: Callable[Concatenate[Admin, P], R]) -> None:
        self.name = method.__name__
        functools.update_wrapper(self, method)

    @overload
    def __get__(self, obj: None, owner: type) -> AdminAlias[P, R]: ...
    @overload
    def __get__(self, obj: HasAdmin, owner: type) -> Callable[P, R]: ...
    def __get__(self, obj: HasAdmin | None, owner: type) -> AdminAlias[P, R] | Callable[P, R]:
        if obj is None:
            return self  # ``Outbox.retry`` stays callable unbound: ``__call__``
        return self.of(obj)

    def of(self, obj: HasAdmin) -> Callable[P, R]:
        """The real method, bound to ``obj.admin``."""
        return cast("Callable[P, R]", getattr(obj.admin, self.name))

    def __call__(self, obj: HasAdmin, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.of(obj)(*args, **kwargs)
