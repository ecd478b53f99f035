"""The records of ``opencode_events.TurnStreams``: one per watched turn, one per opencode
server kept. Plain slotted records, a few hundred bytes each: 10,000 turns held cost a few MB."""

from __future__ import annotations

import asyncio

from .opencode_targets import Server


class Watch:
    """One watched turn: ours (ws, ses, turn) and where it runs (its server, the opencode
    session). ``sending`` until its send answered; ``busy`` once its session was seen busy
    since the watch began; ``early`` if its session went idle (after busy) while it was being
    sent; ``seq`` orders it against the status reads (``TurnStreams._settle``); ``sent_at``
    the monotonic time its send answered (0: not sent by us, or not yet)."""

    __slots__ = (
        "busy",
        "early",
        "sending",
        "sent_at",
        "seq",
        "server",
        "ses",
        "session",
        "turn",
        "ws",
    )

    def __init__(
        self, server: ServerWatch, session: str, ws: str, ses: str, turn: str, seq: int
    ) -> None:
        self.server = server
        self.session = session
        self.ws, self.ses, self.turn = ws, ses, turn
        self.seq = seq
        self.sending = self.early = self.busy = False
        self.sent_at = 0.0


class ServerWatch:
    """One opencode server (``key``; ``base``, its URL as the first turn watched there spelled
    it): its watched turns by opencode session, and its stream. ``connected``: the stream is
    open and its status read done (what it says is live); ``read_began``: the sequence number
    at which the latest status read began; ``recheck``: a turn was sent while a status read
    ran, so the status must be read again."""

    __slots__ = (
        "base",
        "connected",
        "key",
        "read_began",
        "recheck",
        "rechecking",
        "sessions",
        "settling_later",
        "stale",
        "task",
    )

    def __init__(self, key: Server, base: str) -> None:
        self.key = key
        self.base = base
        self.sessions: dict[str, list[Watch]] = {}
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.read_began = 0
        self.recheck = False
        self.rechecking = False
        self.settling_later = False
        self.stale = False  # a recheck failed: reconnect (and read the status again)
