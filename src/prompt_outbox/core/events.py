"""The session event log's shapes: what ``Outbox.watch`` yields and SSE sends.

Every transition script appends its event to a capped per-session stream in the same script
(lib.lua ``emit``), so the log and the queue never disagree. An event ID is the stream ID
(``<ms>-<seq>``): a reader resumes after the last one it saw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .entry import Entry, decode_entry
from .errors import InvalidEventId
from .turns import ENDED, decode_turn

_EVENT_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")  # ASCII only: \d takes any digits
_MAX_PART = 2**64 - 1  # a stream ID's parts are unsigned 64-bit: Valkey refuses the rest


@dataclass(frozen=True, slots=True)
class TurnNews:
    """A ``turn`` event (a delivery's turn began) or ``turn_ended`` (with how long it lasted
    and why it ended: ``ended``, ``ceiling``, ``unreachable``; core/turns.py)."""

    turn: str
    seconds: float = 0.0
    why: str = ""

    def to_json(self) -> str:
        return json.dumps({"id": self.turn, "seconds": self.seconds, "why": self.why})


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One change of one entry. ``kind`` is ``accepted``, ``sent`` (delivered and gone),
    ``dismissed``, or the entry's new status; ``entry`` is its new state, None once gone.
    ``turn`` and ``turn_ended`` (the entry delivered, its agent turn began / ended) carry
    ``turn`` and no entry."""

    event_id: str
    kind: str
    entry_id: str
    entry: Entry | None
    turn: TurnNews | None = None


@dataclass(frozen=True, slots=True)
class QueueReset:
    """The whole queue as of ``event_id``: sent first, and whenever a resume point is gone
    from the capped log (so a reader replaces its state instead of missing changes)."""

    event_id: str
    entries: list[Entry]


def parse_event_id(value: str) -> tuple[int, int]:
    """``"<ms>-<seq>"`` as a comparable pair; raises InvalidEventId for anything else."""
    m = _EVENT_ID.fullmatch(value)
    if m is None or int(m.group(1)) > _MAX_PART or int(m.group(2)) > _MAX_PART:
        raise InvalidEventId(
            f"an event ID looks like <ms>-<seq>, each below 2^64, got {value[:64]!r}"
        )
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True, slots=True)
class EventLogState:
    """A session event log as read with the queue: first and last IDs ('' if there is no
    log), length, events ever added (minus length: what the cap trimmed), server time (ms);
    and, when its first event began it again past its bytes (``lua/lib.lua`` ``emit``), the
    last ID of the log it followed (``first_after``; '' otherwise): a reader that stood
    there has missed nothing."""

    first: str
    last: str
    length: int
    added: int
    now_ms: int
    first_after: str = ""

    def position(self) -> str:
        """Where a reader that has the current queue stands. With no log yet, "0-<now>": every
        future event is after it, and it remembers when the log was seen missing."""
        return self.last or f"0-{self.now_ms}"


def missed_events(after: str, log: EventLogState, ttl_ms: int) -> bool:
    """Could a reader that saw everything up to ``after`` have missed events still to come
    from the log? Conservative: when in doubt the reader gets a reset, never a silent gap."""
    ms, seq = parse_event_id(after)
    if log.first_after and after == log.first_after:
        return False  # the log began again right after what the reader saw
    seen_at = seq if ms == 0 else ms  # "0-<t>": the log was missing at t
    if seen_at < log.now_ms - ttl_ms:
        return True  # older than a log lives: it may have expired and started again since
    if not log.first:
        return ms != 0  # the log is gone (cleanup) though this reader had one
    if ms == 0:
        return log.added > log.length  # it needs every event since the log began
    if (ms, seq) > parse_event_id(log.last):
        return True  # a position the log never reached (made up): from there it would skip
    return (ms, seq) < parse_event_id(log.first)  # its position was trimmed away


def queue_event(event_id: str, fields: Mapping[str, str]) -> QueueEvent:
    """A logged event (lib.lua ``emit``'s fields) as ``watch`` yields it."""
    kind, entry_id, raw = fields.get("kind", ""), fields.get("id", ""), fields.get("entry", "")
    if kind == "turn":
        hold = decode_turn(raw)
        return QueueEvent(event_id, kind, entry_id, None, TurnNews(hold.turn if hold else ""))
    if kind == "turn_ended":
        try:
            ended = json.loads(raw)
            news = TurnNews(str(ended["turn"]), float(ended["seconds"]), str(ended["why"]))
        except (ValueError, TypeError, KeyError):
            news = TurnNews("", 0.0, ENDED)
        return QueueEvent(event_id, kind, entry_id, None, news)
    return QueueEvent(event_id, kind, entry_id, decode_entry(raw) if raw else None)
