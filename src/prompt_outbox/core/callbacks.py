"""The shapes of what callers plug in: deliverer, verifier, hooks, ledger probe."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .entry import Entry
from .validate import check_unicode


class Verdict(enum.IntEnum):
    """A verifier's decision about an ambiguous delivery attempt."""

    INCONCLUSIVE = 0
    """The transcript could not be read (agent unreachable...): recheck with backoff."""
    DELIVERED = 1
    """The entry is in the transcript within the send window: it is complete."""
    ABSENT = 2
    """The transcript proves the message never persisted: safe to re-send."""


TURN_ID_MAX = 200


@dataclass(frozen=True, slots=True)
class Turn:
    """What a deliverer returns when the agent has the prompt and its turn goes on
    (docs/design.md, "Turns"): the entry is delivered at once (OnDelivered fires), and the
    session stays held *in turn*, by a record in Valkey and no worker, until the turn ends
    (``Outbox.end_turn``, a ``TurnWatcher``, or the ceiling). ``id`` names the turn to whoever
    ends it: 1-200 printable characters (the agent's message ID, a receiver's turn ID)."""

    id: str

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not 0 < len(self.id) <= TURN_ID_MAX:
            raise ValueError(f"a turn ID is 1-{TURN_ID_MAX} characters, got {self.id!r:.80}")
        check_unicode("turn ID", self.id)
        if not self.id.isprintable():
            raise ValueError("a turn ID holds printable characters only")


class TurnState(enum.Enum):
    """What the agent says of a turn (``TurnWatcher.turn_state``)."""

    RUNNING = "running"
    ENDED = "ended"
    UNKNOWN = "unknown"
    """The agent cannot answer now (unreachable, an unreadable answer): asked again later."""


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """``Outbox.end_turn``'s outcome: ``ended`` False when the session holds no such turn (an
    unknown ID, or a turn that ended already); ``seconds``, how long the turn lasted."""

    ended: bool
    seconds: float = 0.0


TurnEnded = Callable[[str, str, str], Awaitable[object]]
"""``async (ws, ses, turn_id)``: a turn ended (``Outbox.end_turn``, as a watcher calls it)."""


@runtime_checkable
class TurnWatcher(Protocol):
    """A deliverer's optional capability: learn the ends of its turns from the agent.

    ``watch_turns(ended)`` is called when a run loop starts (``None`` when the last one
    stops): from then on the watcher calls ``ended(ws, ses, turn_id)`` for each turn it knows
    of that the agent reports ended (opencode: its event stream). ``turn_state`` is asked by
    whichever worker checks a turn nobody heard end (after a worker died, a stream was cut, or
    the ceiling came): it answers from the agent, and from then on watches that turn too, so
    a new process learns the ends of turns an old one started."""

    def watch_turns(self, ended: TurnEnded | None) -> None: ...

    def turn_state(self, ws: str, ses: str, turn_id: str) -> Awaitable[TurnState]: ...


Deliverer = Callable[[str, str, Entry], Awaitable["Turn | None"]]
"""``async (ws, ses, entry) -> Turn | None``: deliver one entry; raise to fail. ``None``: the
turn (if any) is over when this returns (a deliverer that blocks for the whole turn); a
``Turn``: the agent has the prompt and works on it, and the session is held in turn until the
turn ends (see ``Turn``).

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
