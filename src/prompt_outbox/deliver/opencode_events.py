"""Learn the ends of opencode turns from its event stream (docs/opencode-turns.md).

One ``GET {base}/event`` connection per opencode server (a base URL, however spelled: two
paths on one origin may be two servers behind a proxy), shared by every session of ours on
it, opened when the first turn there is watched and closed when the server is let go (idle
for the deliverer's ``idle_timeout``, or the idlest one when ``max_servers`` are kept:
``opencode_servers``), or at once by ``close``. A watched turn holds its server, so its
stream is never closed while it is watched. opencode reports ``session.status`` (busy /
idle) and ``session.idle`` for every session of the server; a session that goes idle ends
every turn of it that we watch and saw busy (an idle before that is an earlier turn's), and
``ended(ws, ses, turn)`` is awaited once per turn.

The stream has no replay, so after every (re)connect the server's ``GET /session/status``
(busy sessions only) is read before the stream counts as live: a watched turn whose session
is no longer busy there ended while nobody listened. A connection that is cut, refused or
silent past ``STREAM_READ_TIMEOUT`` (opencode sends a heartbeat every 10 s) is reopened after
a backoff that doubles from ``BACKOFF_MIN`` to ``BACKOFF_MAX``.

Every byte the agent sends is hostile: ``SSEParser`` holds at most ``max_bytes`` of a line
and of an event, and skips whatever is longer as it arrives, without buffering it; the status
answer is read through ``bounded_request``. The table of watched turns is a small record per
turn (a few hundred bytes), nothing else per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import httpx

from ..core.callbacks import TurnEnded, TurnState
from .opencode_servers import Servers, ServersFull
from .opencode_status import StatusReads
from .opencode_targets import Server
from .opencode_watches import ServerWatch, Watch
from .sse_events import EVENT_MAX_BYTES, SSEParser, session_change

log = logging.getLogger("prompt_outbox.opencode")

STREAM_READ_TIMEOUT = 30.0  # three missed heartbeats: a silent connection is reopened
BACKOFF_MIN, BACKOFF_MAX = 0.2, 5.0  # seconds between reconnects, doubling
REPORTS_AT_ONCE = 32  # ``ended`` calls in flight at once (a restart can end thousands)
# A turn that ended within this long of its send may not be held yet when it is reported
# (the engine claims after the deliverer returns): an ``ended`` that answers "no such turn"
# is asked again after these pauses.
EARLY_WINDOW = 5.0
EARLY_RETRIES = (0.05, 0.2, 0.5, 1.0, 2.0)
# prompt_async answers 204 before the turn is under way: on a server's first prompt opencode
# stored the message and went busy ~0.6 s after its 204 (1.18.33). A status read ends a turn
# only once its send answered this long ago; a younger one is read again when it comes of age.
SEND_GRACE = 5.0


class TurnStreams:
    """The turns watched on every opencode server, and one event stream per server.

    ``start(ended)`` begins reporting ends; ``watch`` a turn before its send, ``sent`` once
    the send answered 2xx, ``drop`` it if the send failed; ``state`` answers for a turn from
    the live stream, or from a status read; ``stop`` / ``close`` end every stream and forget
    every turn. Each watched turn holds its server in ``servers`` until it is forgotten."""

    def __init__(
        self,
        servers: Servers,
        *,
        timeout: float,
        connect_timeout: float,
        max_bytes: int = EVENT_MAX_BYTES,
    ) -> None:
        if max_bytes < 1:
            raise ValueError("event_max_bytes must be at least 1")
        self._registry = servers
        servers.on_let_go(self._let_go)
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_bytes = max_bytes
        self._ended: TurnEnded | None = None
        self._servers: dict[Server, ServerWatch] = {}
        self._turns: dict[tuple[str, str, str], Watch] = {}
        self._seq = 0
        self._reports: set[asyncio.Task[None]] = set()  # ``ended`` calls in flight
        self._chores: set[asyncio.Task[None]] = set()  # status reads asked for, cancelled by stop
        self._stopped: set[asyncio.Task[None]] = set()  # cancelled, not yet ended
        self._report_slots = asyncio.Semaphore(REPORTS_AT_ONCE)
        self._status = StatusReads(servers, timeout)

    # -- what the deliverer calls --

    def start(self, ended: TurnEnded) -> None:
        """Report turn ends to ``ended`` from now on."""
        self._ended = ended

    def watch(self, base: str, session: str, ws: str, ses: str, turn: str) -> Watch | None:
        """Watch a turn about to be sent (None when nobody is told of ends: not started).
        An idle of its session from now on counts: the turn may end before its send answers.
        ServersFull when its server is not kept and no room can be made for it."""
        if self._ended is None:
            return None
        watch = self._add(base, session, ws, ses, turn)
        watch.sending = True
        return watch

    def sent(self, watch: Watch | None) -> None:
        """The turn's send answered 2xx: its session's next idle ends it."""
        if watch is None or not watch.sending:
            return
        registered = watch.seq
        watch.sending = False
        watch.sent_at = time.monotonic()
        watch.seq = self._next()
        server = watch.server
        if watch.early:  # its session went idle while the send was on its way
            self._finish(watch)
        elif server.read_began > registered:
            # A status read began while it was being sent (a connect): that read skipped it,
            # and its idle may have come before the stream did. Read the status again.
            server.recheck = True
            self._recheck(server)

    def drop(self, watch: Watch | None) -> None:
        """The send failed: forget the turn (an ambiguous send that is verified delivered is
        watched anew, by ``state``, under the turn ID the outbox holds it by)."""
        if watch is not None:
            self._remove(watch)

    async def state(self, base: str, session: str, ws: str, ses: str, turn: str) -> TurnState:
        """What opencode says of the turn: from the live stream when it is connected and
        watches the turn, else from ``GET {base}/session/status`` (busy: RUNNING; absent or
        idle: ENDED; unreadable: UNKNOWN). A RUNNING or UNKNOWN turn is watched from then on."""
        watch = self._turns.get((ws, ses, turn))
        if watch is not None:
            if watch.early:
                return TurnState.ENDED
            if watch.sending or watch.server.connected:
                return TurnState.RUNNING
        busy = await self._status.shared(base)
        if busy is not None and session not in busy and not (watch and self._young(watch)):
            if watch is not None:
                self._remove(watch)  # the caller ends it: no report of ours as well
            return TurnState.ENDED
        if watch is None and self._ended is not None:
            with contextlib.suppress(ServersFull):  # asked again at the next check
                self._add(base, session, ws, ses, turn).busy = busy is not None
        return TurnState.UNKNOWN if busy is None else TurnState.RUNNING

    def stop(self) -> None:
        """Stop reporting: cancel every stream and forget every watched turn (``close``
        waits for what was cancelled)."""
        self._ended = None
        for chore in self._chores:
            self._cancel(chore)
        for watch in list(self._turns.values()):
            self._remove(watch)  # its server's hold let go
        for server in self._servers.values():
            if server.task is not None:
                self._cancel(server.task)
        self._servers.clear()

    def _cancel(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        self._stopped.add(task)
        task.add_done_callback(self._stopped.discard)

    def _let_go(self, key: Server) -> asyncio.Task[None] | None:
        """``Servers`` lets the server go (idle: no turn is watched there): stop its stream;
        the task to wait for, if one ran."""
        server = self._servers.pop(key, None)
        if server is None or server.task is None or server.task.done():
            return None
        self._cancel(server.task)
        return server.task

    async def close(self) -> None:
        """``stop``, then wait for the streams to end and for the reports begun (within the
        request timeout; those still running then are cancelled)."""
        self.stop()
        for task in list(self._stopped):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._reports:
            _, pending = await asyncio.wait(set(self._reports), timeout=self._timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def __len__(self) -> int:
        """How many turns are watched."""
        return len(self._turns)

    @property
    def streams(self) -> int:
        """How many event streams run (one per server kept with a turn watched, or since)."""
        return sum(s.task is not None and not s.task.done() for s in self._servers.values())

    # -- the table --

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _add(self, base: str, session: str, ws: str, ses: str, turn: str) -> Watch:
        key = (ws, ses, turn)
        if (old := self._turns.get(key)) is not None:
            self._remove(old)
        host = self._registry.hold(base)  # first: ServersFull leaves nothing half-made
        server = self._servers.get(host)
        if server is None:
            server = self._servers[host] = ServerWatch(host, base)
        watch = Watch(server, session, ws, ses, turn, self._next())
        self._turns[key] = watch
        server.sessions.setdefault(session, []).append(watch)
        self._ensure_stream(server)
        return watch

    def _remove(self, watch: Watch) -> None:
        key = (watch.ws, watch.ses, watch.turn)
        if self._turns.get(key) is watch:
            del self._turns[key]
        server = watch.server
        watches = server.sessions.get(watch.session)
        if watches is not None and watch in watches:
            watches.remove(watch)
            if not watches:
                del server.sessions[watch.session]
            self._registry.release(server.key)

    def _change(self, server: ServerWatch, session: str, idle: bool) -> None:
        """A busy marks the session's watched turns under way. An idle ends those (one being
        sent ends as soon as its send answers); before a turn was seen busy an idle is an
        earlier turn's (opencode sends two, and one more after an abort), so it ends nothing,
        and the status is read again once the turn is of age, in case it ended unseen."""
        unseen = False
        for watch in list(server.sessions.get(session, ())):
            if not idle:
                watch.busy = True
            elif not watch.busy:
                unseen = True
            elif watch.sending:
                watch.early = True
            else:
                self._finish(watch)
        if unseen:
            self._settle_later(server)

    def _finish(self, watch: Watch) -> None:
        self._remove(watch)
        if self._ended is not None:
            self._spawn(self._report(watch, self._ended, time.monotonic()), self._reports)

    @staticmethod
    def _spawn(work: Coroutine[Any, Any, None], into: set[asyncio.Task[None]]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        into.add(task)
        task.add_done_callback(into.discard)

    async def _report(self, watch: Watch, ended: TurnEnded, at: float) -> None:
        """``ended(ws, ses, turn)``, awaited; what it raises is logged. A turn that ended
        just after its send may not be held yet: "no such turn" is then asked again."""
        early = bool(watch.sent_at) and at - watch.sent_at < EARLY_WINDOW
        async with self._report_slots:
            for pause in (0.0, *(EARLY_RETRIES if early else ())):
                if pause:
                    await asyncio.sleep(pause)
                try:
                    result = await ended(watch.ws, watch.ses, watch.turn)
                except Exception:
                    log.warning(
                        "reporting the end of an opencode turn failed",
                        exc_info=True,
                        extra={"workspace": watch.ws, "session": watch.ses, "turn": watch.turn},
                    )
                    return
                if getattr(result, "ended", True) is not False:
                    return

    # -- the streams --

    def _ensure_stream(self, server: ServerWatch) -> None:
        if self._ended is None or self._servers.get(server.key) is not server:
            return
        if server.task is not None and not server.task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # the next watch made in a running loop starts it
        server.task = loop.create_task(self._follow(server), name=f"opencode events {server.base}")

    @staticmethod
    def _young(watch: Watch) -> bool:
        """Sent by us less than ``SEND_GRACE`` ago: it may not show as busy yet."""
        return bool(watch.sent_at) and time.monotonic() - watch.sent_at < SEND_GRACE

    def _kept(self, server: ServerWatch) -> bool:
        return self._ended is not None and self._servers.get(server.key) is server

    async def _follow(self, server: ServerWatch) -> None:
        """Keep the server's stream open while it is kept (a turn is watched there, or was
        within the idle timeout), reconnecting with backoff; what goes wrong is logged, never
        raised."""
        backoff = BACKOFF_MIN
        try:
            while self._kept(server):
                try:
                    if await self._connection(server):
                        backoff = BACKOFF_MIN
                except Exception as exc:
                    log.info("opencode event stream of %s: %r", server.base, exc)
                finally:
                    server.connected = False
                if not self._kept(server):
                    break
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        finally:
            server.connected = False

    async def _connection(self, server: ServerWatch) -> bool:
        """One connection of the stream, until it is cut or nothing is left to watch; True
        if it got as far as its status read (the backoff starts over)."""
        client = self._registry.stream_client(server.key)
        timeout = httpx.Timeout(
            connect=self._connect_timeout,
            read=STREAM_READ_TIMEOUT,
            write=self._timeout,
            pool=self._connect_timeout,
        )
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        async with client.stream(
            "GET", server.base + "/event", headers=headers, timeout=timeout
        ) as response:
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            encoding = response.headers.get("content-encoding", "").strip().lower()
            if response.status_code != 200 or kind != "text/event-stream":
                raise RuntimeError(f"GET /event answered {response.status_code} {kind!r}")
            if encoding not in ("", "identity"):
                raise RuntimeError(f"GET /event answered {encoding}-encoded: not decompressed")
            # Subscribed: what happens from now on comes on the stream; what happened while
            # nobody listened is in the status. It counts as live once that is read.
            if not await self._settle(server):
                return False
            while server.recheck:
                if not await self._settle(server):
                    return False
            server.connected, server.stale = True, False
            parser = SSEParser(self._max_bytes)
            async for chunk in response.aiter_raw():
                for event in parser.feed(chunk):
                    change = session_change(event.data)
                    if change is not None:
                        self._change(server, *change)
                if parser.skipped:
                    log.warning(
                        "opencode event stream of %s: %d events past %d bytes skipped",
                        server.base,
                        parser.skipped,
                        self._max_bytes,
                    )
                    parser.skipped = 0
                if server.stale or not self._kept(server):
                    break
        return True

    async def _settle(self, server: ServerWatch) -> bool:
        """Read the server's status and end every watched turn whose session is not busy
        there. Only turns sent before the read began count: one sent since may not show as
        busy yet (``sent`` asks for another read). False if the status was unreadable."""
        began = server.read_began = self._next()
        server.recheck = False
        busy = await self._status.busy(server.base)
        if busy is None:
            return False
        young = False
        for session, watches in list(server.sessions.items()):
            for watch in list(watches):
                if watch.sending or watch.seq >= began:
                    continue
                if session in busy:
                    watch.busy = True  # sent before the read: this busy is its turn
                elif self._young(watch):
                    young = True
                else:
                    self._finish(watch)
        if young:
            self._settle_later(server)
        return True

    def _settle_later(self, server: ServerWatch) -> None:
        """Read the status again once the youngest turn skipped now comes of age."""
        if server.settling_later:
            return
        server.settling_later = True

        async def run() -> None:
            try:
                await asyncio.sleep(SEND_GRACE)
            finally:
                server.settling_later = False
            server.recheck = True
            self._recheck(server)

        self._spawn(run(), self._chores)

    def _recheck(self, server: ServerWatch) -> None:
        """Read the status again while the stream is live (a stream not live yet reads it
        before it counts as live; the next connect reads it anyway). One at a time; one that
        fails makes the stream reconnect."""
        if not server.connected or server.rechecking:
            return
        server.rechecking = True

        async def run() -> None:
            try:
                while server.recheck and server.connected:
                    if not await self._settle(server):
                        server.connected, server.stale = False, True
            finally:
                server.rechecking = False

        self._spawn(run(), self._chores)
