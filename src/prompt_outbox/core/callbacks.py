"""The shapes of what callers plug in: deliverer, verifier, hooks, ledger probe."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .entry import Entry


class Verdict(enum.IntEnum):
    """A verifier's decision about an ambiguous delivery attempt."""

    INCONCLUSIVE = 0
    """The transcript could not be read (agent unreachable...): recheck with backoff."""
    DELIVERED = 1
    """The entry is in the transcript within the send window: it is complete."""
    ABSENT = 2
    """The transcript proves the message never persisted: safe to re-send."""


Deliverer = Callable[[str, str, Entry], Awaitable[None]]
"""``async (ws, ses, entry) -> None``: deliver one entry; raise to fail.

A plain exception is a definitive (proven not delivered) failure; wrap with ``ambiguous``,
``transient`` or ``prior_attempt_pending`` for the other classes. Runs detached from whoever
accepted the prompt, bounded by ``Tunables.delivery_timeout``; the attempt number it drives is
``entry.attempts + 1``; ``entry.id`` is the idempotency key to hand the agent."""


@runtime_checkable
class Aborter(Protocol):
    """A deliverer's optional capability (whileBusy ``interrupt``): ``abort(ws, ses)`` asks the
    agent to stop the session's turn in flight. The interrupted entry's own ``deliver`` call
    then returns as the agent answers it: an agent that keeps the aborted prompt in its
    transcript (opencode answers 200) counts it delivered, so it is never sent again."""

    def abort(self, ws: str, ses: str) -> Awaitable[None]: ...


Verifier = Callable[[str, str, Entry], Awaitable[Verdict]]
"""``async (ws, ses, entry) -> Verdict``; raising counts as INCONCLUSIVE."""

Hook = Callable[[str, str, Entry], Awaitable[None]]
"""``async (ws, ses, entry) -> None`` (OnStaged, OnDelivered); what it raises is logged."""

LedgerProbe = Callable[[str, str, str, int], Awaitable[str]]
"""``async (ws, ses, entry_id, attempt) -> state``: "" = no row; raising = indeterminate."""


class RetryResult(enum.IntEnum):
    """Retry's outcome: contention (BUSY) is never reported as absence."""

    UPDATED = 0
    NOT_FOUND = 1
    BUSY = 2


@dataclass(frozen=True, slots=True)
class BulkResult:
    """A bulk action's outcome: how many entries it changed, and the sessions it skipped
    because a delivery held them (try those again)."""

    done: int
    busy: tuple[str, ...] = ()


class EditResult(enum.IntEnum):
    """Edit's outcome: contention (BUSY) is never reported as absence; NOT_EDITABLE once the
    entry is being delivered or verified (or is parked)."""

    UPDATED = 0
    NOT_FOUND = 1
    BUSY = 2
    NOT_EDITABLE = 3


class DismissResult(enum.IntEnum):
    """Dismiss's outcome: contention (BUSY) is never reported as absence."""

    REMOVED = 0
    NOT_FOUND = 1
    BUSY = 2


@dataclass(slots=True)
class Wiring:
    """What the caller plugged in (``Outbox.set_*``), shared by the rooms that call it."""

    verifier: Verifier | None = None
    on_delivered: Hook | None = None
    on_staged: Hook | None = None
    ledger_probe: LedgerProbe | None = None
