"""A session held in turn: the record in its lock, and what a check decides (docs/design.md,
"Turns").

While the agent works on a delivered prompt, the session's lock holds
``turn:<check ms>:<record JSON>`` instead of a worker's token. No worker holds a task, a slot
or a request for it. Its end comes from the agent (a watcher's stream, the end route), or from
a check: a worker asks the agent. Who checks:

- a turn with an ``owner`` (a running worker, alive by its heartbeat in Valkey: one write per
  worker, whatever it holds) is asked about in that worker's memory every
  ``turn_check_interval``, at no Valkey cost; its check time in Valkey is its ceiling. When the
  owner stops or dies, another worker releases its turns (owner '', check now) and the first
  loop to visit one checks it and owns it from then on;
- a turn without one (sent by ``deliver_once``, or released) is due at its check time, when
  whichever worker visits the session asks the agent.

The lock's own expiry is the hard bound, ``turn_ceiling + turn_grace`` after the send and a
margin, so a session whose agent never answers is let go in the end.

    delivered --Turn--> in turn --ended (watcher, end route, check)--> free: next entry sent
                                --check: running--> in turn (next check)
                                --check: unknown--> in turn (next check, why)
                                --check past the ceiling: running--> abort asked, let go
                                --check past ceiling + grace: unknown--> let go
                                --interrupt--> abort asked at the next check (at once)

Pure: nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from .callbacks import TurnState
from .settings import Tunables
from .tracing import checked_traceparent

PREFIX = "turn:"

# Why a turn ended (the turn_ended event's ``why``).
ENDED = "ended"  # the agent said so
CEILING = "ceiling"  # still running at turn_ceiling: aborted and let go
UNREACHABLE = "unreachable"  # the agent never answered until turn_ceiling + turn_grace


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """A session's turn as ``Outbox.turn`` tells it: its ID, the entry delivered, how long it
    has lasted (seconds), and why it is still held when the agent could not say ('')."""

    turn: str
    entry: str
    seconds: float
    why: str = ""


@dataclass(frozen=True, slots=True)
class TurnHold:
    """One session's turn: its ID, the delivered entry, when it began, when it is next
    checked (ms), why the last check could not settle it, whether an abort was asked, and
    the prompt's trace context (``trace``: the turn's end is a span of the prompt's trace)."""

    turn: str
    entry: str
    since_ms: int
    check_ms: int
    why: str = ""
    abort: bool = False
    owner: str = ""
    trace: str = ""

    def encode(self) -> str:
        record: dict[str, object] = {"turn": self.turn, "entry": self.entry, "since": self.since_ms}
        if self.owner:
            record["owner"] = self.owner
        if self.why:
            record["why"] = self.why[:300]
        if self.abort:
            record["abort"] = True
        if self.trace:
            record["tp"] = self.trace
        return f"{PREFIX}{self.check_ms}:{json.dumps(record, separators=(',', ':'))}"

    def seconds(self, now_ms: int) -> float:
        """How long the turn has lasted."""
        return max(0.0, (now_ms - self.since_ms) / 1000)

    def info(self, now_ms: int) -> TurnInfo:
        return TurnInfo(self.turn, self.entry, self.seconds(now_ms), self.why)


def is_turn(lock_value: str | None) -> bool:
    return bool(lock_value) and str(lock_value).startswith(PREFIX)


def decode_turn(lock_value: str) -> TurnHold | None:
    """The turn a lock value holds, or None (a worker's token, or a value we did not write)."""
    if not is_turn(lock_value):
        return None
    check, _, body = lock_value[len(PREFIX) :].partition(":")
    try:
        record = json.loads(body)
        return TurnHold(
            turn=str(record["turn"]),
            entry=str(record["entry"]),
            since_ms=int(record["since"]),
            check_ms=int(check),
            why=str(record.get("why", "")),
            abort=bool(record.get("abort", False)),
            owner=str(record.get("owner", "")),
            trace=checked_traceparent(record.get("tp")),
        )
    except (ValueError, TypeError, KeyError):
        return None


def next_check(since_ms: int, now_ms: int, owner: str, t: Tunables) -> int:
    """When Valkey makes a turn due for a check: an owned one at its ceiling (its owner asks
    meanwhile), past it or unowned after ``turn_check_interval``."""
    ceiling = since_ms + round(t.turn_ceiling * 1000)
    if owner and now_ms < ceiling:
        return ceiling
    return now_ms + round(t.turn_check_interval * 1000)


def started(
    turn: str,
    entry: str,
    now_ms: int,
    t: Tunables,
    *,
    owner: str,
    check_now: bool,
    trace: str = "",
) -> TurnHold:
    """The hold a delivery begins. ``check_now``: first ask the agent at once (a send that was
    verified, whose turn nobody watches yet). ``trace``: the delivered entry's."""
    check = now_ms if check_now else next_check(now_ms, now_ms, owner, t)
    return TurnHold(turn, entry, now_ms, check, owner=owner, trace=trace)


def released(hold: TurnHold, now_ms: int) -> TurnHold:
    """A turn whose owner stopped or died: unowned, checked by the first loop to visit it."""
    return replace(hold, owner="", check_ms=now_ms)


def hold_ms(t: Tunables) -> int:
    """The lock's expiry for a turn: its hard bound, past which it lapses unasked. Two checks
    and a lease past ``turn_ceiling + turn_grace``, so a check lets it go first (and says so)."""
    return round((t.turn_ceiling + t.turn_grace + 2 * t.turn_check_interval + t.lease_ttl) * 1000)


def unanswered(reason: str) -> str:
    """Why a turn the agent could not be asked about is still held (List's turnWhy)."""
    return f"the agent did not say whether the turn ended: {reason}"[:300]


@dataclass(frozen=True, slots=True)
class Decision:
    """What a check does: end the turn (``end``: why), or keep it as ``keep``; ``abort``: ask
    the agent to stop the turn first."""

    end: str = ""
    keep: TurnHold | None = None
    abort: bool = False


def after_check(
    hold: TurnHold,
    state: TurnState,
    reason: str,
    now_ms: int,
    t: Tunables,
    *,
    can_abort: bool,
    owner: str = "",
) -> Decision:
    """What a worker does with what the agent said of a turn it checked (``reason``: why the
    state is UNKNOWN, if it is). A turn kept is the checker's from then on (``owner``: its
    heartbeat's ID, '' for a worker without one)."""
    lasted = hold.seconds(now_ms)
    hold = replace(hold, owner=owner)
    later = next_check(hold.since_ms, now_ms, owner, t)
    if state is TurnState.ENDED:
        return Decision(end=ENDED)
    if state is TurnState.RUNNING:
        if lasted >= t.turn_ceiling:
            return Decision(end=CEILING, abort=can_abort)
        if hold.abort:  # an interrupt: ask the agent; its end comes as any other
            keep = replace(hold, check_ms=later, why="abort asked", abort=False)
            return Decision(keep=keep, abort=can_abort)
        return Decision(keep=replace(hold, check_ms=later, why=""))
    if lasted >= t.turn_ceiling + t.turn_grace:
        return Decision(end=UNREACHABLE)
    why = unanswered(reason)
    keep = replace(hold, check_ms=later, why=why)
    return Decision(keep=keep, abort=hold.abort and can_abort)
