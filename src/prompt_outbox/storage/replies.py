"""The typed values the Lua scripts' replies become. Callers never compare raw strings.

Every script answers ``{word, payload...}`` (see the header of ``lua/lib.lua``); ``parse``
checks the word against the ones that script may give and raises ``ReplyError`` for any
other, so a script and its caller cannot drift apart silently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..core.entry import Status
from ..core.errors import (
    IdempotencyKeyReused,
    OutboxFull,
    SessionBusy,
    StorageFull,
    WorkspaceBytesFull,
    WorkspaceFull,
)
from ..core.events import EventLogState
from .memory import Memory

E = TypeVar("E", bound=enum.Enum)


class ReplyError(RuntimeError):
    """A script answered something its header does not list (a bug, never an outcome)."""


def text(value: Any) -> str:
    """A reply element as ``str``, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else str(value)


def parse(kind: type[E], reply: Any) -> tuple[E, list[Any]]:
    """Split ``{word, payload...}`` into the word as a member of ``kind`` and the payload."""
    if not isinstance(reply, list) or not reply:
        raise ReplyError(f"expected {{word, ...}} for {kind.__name__}, got {reply!r:.200}")
    word = text(reply[0])
    try:
        return kind(word), reply[1:]
    except ValueError:
        raise ReplyError(f"{kind.__name__} has no reply {word!r}") from None


class Accept(enum.Enum):
    """accept.lua."""

    OK = "ok"
    DUPLICATE = "duplicate"
    REUSED = "reused"
    REJECTED = "rejected"  # whileBusy reject, and the session is busy
    FULL = "full"  # the session holds cap entries
    WORKSPACE_FULL = "workspace_full"  # the workspace holds workspace_cap entries
    STORAGE_FULL = "storage_full"  # the node's memory is at the accept ceiling
    BYTES_FULL = "bytes_full"  # the workspace is at its byte budget


class Confirm(enum.Enum):
    """confirm.lua."""

    OK = "ok"  # the dedupe marker is there (its entry ID follows), written again
    GONE = "gone"  # no marker: the accept is not on this server


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What waiting for an accept's durability saw: the entry the dedupe marker names ('' if
    it is gone), the AOF fsyncs WAITAOF counted on the primary and on replicas, or the error
    that stopped the wait."""

    marker_id: str
    local: int = 0
    replicas: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class BytesFull:
    """A ``bytes_full`` reply (accept.lua, edit.lua, replace.lua): what the workspace holds
    in all and in each part, the ms until the windows passing bring it under its budget (0:
    they cannot), and whether deliveries, freeing its queued bytes, could."""

    used: int
    queued: int
    logs: int
    markers: int
    clears_in_ms: int
    deliveries_help: bool

    @classmethod
    def of(cls, payload: list[Any]) -> BytesFull:
        used, queued, logs, markers, clears, deliveries = (int(x) for x in payload[:6])
        return cls(used, queued, logs, markers, clears, bool(deliveries))

    def refusal(self, limit: int) -> WorkspaceBytesFull:
        # When deliveries may make room, a client is told to look again soon (None), not when
        # the windows would have made it alone.
        waits = self.clears_in_ms > 0 and not self.deliveries_help
        return WorkspaceBytesFull(
            self.used,
            limit,
            self.clears_in_ms / 1000 if waits else None,
            queued=self.queued,
            logs=self.logs,
            markers=self.markers,
        )


@dataclass(frozen=True, slots=True)
class Holding:
    """What a workspace holds against its byte budget (holding.lua), in bytes: its queued
    entries, and what its event logs and its markers took in the windows still counted."""

    queued: int
    logs: int
    markers: int

    @property
    def total(self) -> int:
        return self.queued + self.logs + self.markers

    @classmethod
    def of(cls, payload: list[Any]) -> Holding:
        queued, logs, markers = (int(x) for x in payload[:3])
        return cls(queued, logs, markers)


@dataclass(frozen=True, slots=True)
class Accepted:
    """accept.lua's answer: ``accepted_id`` is the first accept's ID for a DUPLICATE or a
    REUSED key; ``confirmation`` what the durability wait saw (None when none was asked, or
    a refusal); ``in_flight`` the entry being delivered when an ``interrupt`` accept
    landed ('' if none); ``memory`` the node's reading that refused a STORAGE_FULL; ``held``
    what refused a BYTES_FULL, and ``budget`` the workspace's budget it was refused at."""

    outcome: Accept
    accepted_id: str = ""
    confirmation: Confirmation | None = None
    in_flight: str = ""
    memory: Memory | None = None
    held: BytesFull | None = None
    budget: int = 0

    def refusal(self, cap: int, workspace_cap: int) -> Exception | None:
        """The library's exception for a refused accept (None for OK and DUPLICATE): the
        session's ``cap``, the workspace's ``workspace_cap``, its byte budget, the memory
        ceiling, whileBusy reject, a reused key. Nothing was written for any of them."""
        if self.outcome is Accept.FULL:
            return OutboxFull(cap)
        if self.outcome is Accept.WORKSPACE_FULL:
            return WorkspaceFull(workspace_cap)
        if self.held is not None:
            return self.held.refusal(self.budget)
        if self.outcome is Accept.STORAGE_FULL:
            m = self.memory
            return StorageFull(m.used if m else 0, m.limit if m else 0)
        if self.outcome is Accept.REJECTED:
            return SessionBusy()
        if self.outcome is Accept.REUSED:
            return IdempotencyKeyReused(self.accepted_id)
        return None


class Acquire(enum.Enum):
    """acquire.lua: what the session needs now."""

    BUSY = "busy"  # another holder has it
    STAGED = "staged"  # a dead worker's staging, to recover first (lock held)
    HEAD = "head"  # the head is due (lock held)
    WAIT = "wait"  # the head is not due yet (lock released)
    IDLE = "idle"  # nothing blocks (lock released)
    TURN = "turn"  # in turn, its check due: the caller asks the agent (no lock taken)


@dataclass(frozen=True, slots=True)
class Acquired:
    """acquire.lua's answer: the staged entries (STAGED) or the due head (HEAD), raw."""

    kind: Acquire
    entries: list[str]

    @property
    def holds_lock(self) -> bool:
        return self.kind in (Acquire.STAGED, Acquire.HEAD)


class Write(enum.Enum):
    """stage.lua and restore.lua: whether a write that needs the session landed."""

    OK = "ok"
    BUSY = "busy"  # another holder owns the session
    LOST = "lost"  # the caller's lock is gone
    GONE = "gone"  # the entry is no longer where the caller read it


class Claim(enum.Enum):
    """complete.lua: whether this caller claimed the entry (and so fires OnDelivered)."""

    CLAIMED = "ok"
    BUSY = "busy"  # another holder owns the session
    LOST = "lost"  # nobody holds it: the caller's lease lapsed (the fence)
    GONE = "gone"  # claimed by someone else, or dismissed


@dataclass(frozen=True, slots=True)
class Claimed:
    """complete.lua's answer: the claim, and the caller's next step when it asked for one
    (only with CLAIMED; None otherwise)."""

    claim: Claim
    next: Acquired | None = None
    ended_early: bool = False  # its turn had ended before the claim: none is held


class Requeue(enum.Enum):
    """requeue.lua."""

    OK = "ok"
    LOST = "lost"  # the caller's lock is gone
    CHANGED = "changed"  # staging moved since it was read


class Replace(enum.Enum):
    """replace.lua."""

    OK = "ok"
    BUSY = "busy"  # another holder owns the session
    LOST = "lost"  # a lock value was given, and nobody holds the lock (the fence)
    BYTES_FULL = "bytes_full"  # a client's retry, as Accept's (a BytesFull payload)


class Edited(enum.Enum):
    """edit.lua."""

    OK = "ok"
    BUSY = "busy"  # a holder has the session
    CHANGED = "changed"  # the exact string read is gone from the queue
    BYTES_FULL = "bytes_full"  # as Accept's (a BytesFull payload)


@dataclass(frozen=True, slots=True)
class Counted(Generic[E]):
    """requeue.lua / replace.lua: the outcome, and how many entries it moved (if OK)."""

    outcome: E
    count: int = 0


class Held(enum.Enum):
    """renew.lua and release.lua: whether the caller held the lock."""

    OK = "ok"
    LOST = "lost"


class TurnWrite(enum.Enum):
    """turn_end.lua and turn_check.lua: whether the turn the caller named was still held."""

    OK = "ok"
    GONE = "gone"


class Lock(enum.Enum):
    """lock.lua."""

    OK = "ok"
    BUSY = "busy"


class Format(enum.Enum):
    """format.lua: the format now in force follows."""

    OK = "ok"
    NEWER = "newer"  # a newer format (or not one) is there: nothing written


class Forgot(enum.Enum):
    """notified.lua: whether the owed-hook record was there."""

    OK = "ok"
    GONE = "gone"


class Compared(enum.Enum):
    """prune_workspace.lua and unmark.lua: compare-and-set against a generation read earlier."""

    OK = "ok"
    CHANGED = "changed"  # a writer marked the workspace since its generation was read


def lowered_ms(value: Any) -> int | None:
    """acquire.lua / release.lua's ``m``: ms, or None for ''."""
    raw = text(value)
    return int(raw) if raw else None


class Ok(enum.Enum):
    """The scripts whose only word is ok (snapshot, tally, seed, repair, take_notices)."""

    OK = "ok"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """snapshot.lua: one consistent read of a session and its event log."""

    queue: list[str]
    staging: list[str]
    lock_value: str
    lock_pttl_ms: int
    log: EventLogState

    @property
    def locked(self) -> bool:
        return bool(self.lock_value)


def snapshot(payload: list[Any]) -> Snapshot:
    q, d, lockval, pttl, (first, last, length, added, now, after) = payload
    log = EventLogState(text(first), text(last), int(length), int(added), int(now), text(after))
    return Snapshot([text(x) for x in q], [text(x) for x in d], text(lockval), int(pttl), log)


@dataclass(frozen=True, slots=True)
class Found:
    """entry.lua: one entry of a session (``raw`` '' when absent; ``in_staging`` when found
    there), whether a holder has the session (``locked``) and whether it has staged entries."""

    raw: str
    in_staging: bool
    locked: bool
    staged: bool

    @classmethod
    def of(cls, payload: list[Any]) -> Found:
        raw, where, held, staged = payload
        return cls(text(raw), text(where) == "staging", bool(int(held)), bool(int(staged)))


@dataclass(frozen=True, slots=True)
class Slice:
    """entries.lua: a slice of a session's queue (its entries in some statuses, in order),
    whether the queue holds more of them past it, whether a holder has the session
    (``locked``) and whether it has staged entries."""

    entries: list[str]
    more: bool
    locked: bool
    staged: bool

    @classmethod
    def of(cls, payload: list[Any]) -> Slice:
        held, staged, more, *entries = payload
        return cls([text(x) for x in entries], bool(int(more)), bool(int(held)), bool(int(staged)))


@dataclass(frozen=True, slots=True)
class Tally:
    """Entries by status (every status, 0 included), and the acceptedAt (ms) of the oldest
    pending one (None when none is pending): what the scripts keep (``lua/lib.lua``, "the
    tally") of a session or a workspace."""

    by_status: dict[str, int]
    oldest_pending_ms: int | None


@dataclass(frozen=True, slots=True)
class SessionTally:
    """tally.lua, for one session: its ``tally``; ``sent_ms``, when its staged entry was
    handed to the agent (None when nothing is staged); its lock's value ('' when free) and
    PTTL."""

    ses: str
    tally: Tally
    sent_ms: int | None
    lock_value: str
    lock_pttl_ms: int


@dataclass(frozen=True, slots=True)
class WorkspaceTally:
    """A workspace's ``tally``, and how many of its sessions hold entries."""

    ws: str
    sessions: int
    tally: Tally


def counts(values: list[Any]) -> dict[str, int]:
    """HMGET's answers for the statuses, in ``Status`` order, as status -> n (0 if missing)."""
    return {str(s): int(v) if v else 0 for s, v in zip(Status, values, strict=True)}


def ms_or_none(value: Any) -> int | None:
    """A stored ms value ('' / None when there is none): ZSCORE's and HGET's form."""
    if value is None or value == b"" or value == "":
        return None
    return int(float(text(value)))


def session_tallies(sessions: list[str], payload: list[Any]) -> list[SessionTally]:
    """tally.lua's payload, one row a session asked for, in its order."""
    out = []
    for ses, (by, oldest, sent, lockval, pttl) in zip(sessions, payload, strict=True):
        out.append(
            SessionTally(
                ses,
                Tally(counts(by), ms_or_none(oldest)),
                ms_or_none(sent),
                text(lockval),
                int(pttl),
            )
        )
    return out
