"""Server-sent events from an agent, read under a bound (docs/opencode-turns.md): a parser
that holds at most ``max_bytes`` of a line and of an event and skips whatever is longer as it
arrives, without buffering it, and the one opencode event the turn watcher reads.

Every byte the agent sends is hostile. ``httpx-sse`` is not used: its line decoder holds a
whole line in memory however long it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .answer import MiB

EVENT_MAX_BYTES = MiB  # the default bound of one line, and of one event's data

_LF, _CR = 0x0A, 0x0D


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched server-sent event: its ``event`` field ("message" when none) and data."""

    event: str
    data: bytes


class SSEParser:
    """A text/event-stream parser (the WHATWG rules: lines end in CR, LF or CRLF, ``data``
    lines join with LF, a blank line dispatches, ``:`` starts a comment) that holds at most
    ``max_bytes`` of a line and of an event's data. A longer line is skipped as its bytes
    arrive and the event it belongs to is dropped whole (``skipped`` counts them): never a
    part of an event, never a buffer that grows with what the sender sends."""

    def __init__(self, max_bytes: int = EVENT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self.skipped = 0
        self._line = bytearray()
        self._skipping = False  # inside a line past the bound: drop bytes to its end
        self._after_cr = False  # the last chunk ended in CR: a leading LF belongs to it
        self._data = bytearray()
        self._has_data = False
        self._event = ""
        self._broken = False  # the event in progress lost a line: drop it at its end

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events that ``chunk`` completes, in order."""
        out: list[SSEEvent] = []
        pos, n = 0, len(chunk)
        if self._after_cr and n and chunk[0] == _LF:
            pos = 1
        self._after_cr = False
        next_cr = chunk.find(b"\r", pos)
        while pos < n:
            lf = chunk.find(b"\n", pos)
            if 0 <= next_cr < pos:
                next_cr = chunk.find(b"\r", pos)
            end = min(i for i in (lf, next_cr, n) if i >= 0)
            self._take(chunk, pos, end)
            if end == n:
                break
            pos = end + 1
            if chunk[end] == _CR:
                if pos < n and chunk[pos] == _LF:
                    pos += 1
                elif pos == n:
                    self._after_cr = True
            if (event := self._line_done()) is not None:
                out.append(event)
        return out

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        if self._skipping or start == end:
            return
        if len(self._line) + end - start > self.max_bytes:
            self._skipping, self._broken = True, True
            self._line.clear()
            return
        self._line += chunk[start:end]

    def _line_done(self) -> SSEEvent | None:
        if self._skipping:
            self._skipping = False
            return None
        line = bytes(self._line)
        self._line.clear()
        if not line:
            return self._dispatch()
        if line[0] == 0x3A:  # ":": a comment (opencode's /api streams send heartbeats so)
            return None
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            if len(self._data) + len(value) + 1 > self.max_bytes:
                self._broken = True
            elif not self._broken:
                if self._has_data:
                    self._data += b"\n"
                self._data += value
                self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", errors="replace")
        return None  # id, retry and unknown fields: nothing we use

    def _dispatch(self) -> SSEEvent | None:
        event = None
        if self._broken:
            self.skipped += 1
        elif self._has_data:
            event = SSEEvent(self._event or "message", bytes(self._data))
        self._data.clear()
        self._has_data, self._event, self._broken = False, "", False
        return event


def session_change(data: bytes) -> tuple[str, bool] | None:
    """``(sessionID, idle)`` from one opencode event's data, or None for anything else (an
    event of another type, data that is not JSON or not of the expected shape)."""
    if b'"session.' not in data:  # most events (message parts, deltas) go no further
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    props = value.get("properties")
    if not isinstance(props, dict):
        return None
    session = props.get("sessionID")
    if not isinstance(session, str) or not session:
        return None
    kind = value.get("type")
    if kind == "session.idle":
        return session, True
    if kind == "session.status":
        status = props.get("status")
        if isinstance(status, dict):
            return session, status.get("type") == "idle"
    return None
