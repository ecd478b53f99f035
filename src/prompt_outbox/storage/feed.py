"""The event feed: every open watch of a process follows its session's log through one feed,
over shared connections, instead of holding a connection blocked in XREAD each.

Each script that logs an event also SPUBLISHes its ID on a shard channel named like the log's
key (``emit`` in ``lua/lib.lua``). The feed subscribes the channel of every followed session
(ref-counted over its followers, through a ``ShardSubscriber``: one connection per node) and,
on a notice, wakes that session's followers; each then reads what is new with a NON-blocking
XREAD through the shared client, at most ``FeedLimits.reads`` reads at a time across the
process, so the connection pool stays small however many streams are open.

Nothing is lost to pub/sub's at-most-once delivery: a follower reads once as it starts (what
came between the caller's snapshot and the subscription), again whenever its channel's
subscription is (re)confirmed (a dropped connection, a slot that moved), and a quiet follower
reads every ``safety_poll`` anyway. A lost notice costs latency, never an event.

Each follower buffers what it read and its reader has not taken yet, at most ``max_behind``
events; full, it stops reading and counts the notices it could not follow. Once buffered plus
announced pass ``max_behind`` the reader fell behind: it gets what is buffered, then
``FellBehind``, so a slow reader holds neither memory nor anyone else up, and each cut-off
still moves it forward. It resumes after the last event it got, like any reconnecting client
(the capped log and the reset rule decide what it sees: ``core/events.missed_events``). A
resume's backlog (no notices: it was logged before) is read a buffer at a time as the reader
takes it, never counted against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from types import TracebackType

from ..core.events import parse_event_id
from ..core.keys import SessionKeys
from .replies import Snapshot
from .shardsub import ShardSubscriber
from .store import UNAVAILABLE, Store

Event = tuple[str, dict[str, str]]
"""One logged event: its ID and its fields (kind, id, entry)."""


class StreamEnded(Exception):
    """The feed ended this stream; the reader resumes after the last event it got."""


class FellBehind(StreamEnded):
    """The reader left more than ``max_behind`` events unread: its stream ends."""


READ_RETRIES = 5
READ_RETRY_AFTER = 0.05
"""A read that finds Valkey unavailable is tried again after 0.05, 0.1 ... 0.8 s (about 1.5 s
in all) before the stream ends with that error (a client then resumes by its ID)."""


@dataclass(frozen=True, slots=True)
class FeedLimits:
    """The bounds of one process's event feed.

    ``reads``: reads in flight at once across all followers (each XREAD, and each opening
    snapshot, holds a pooled connection for one round trip). ``batch``: events per XREAD.
    ``max_behind``: events a reader may leave unread before its stream ends. ``safety_poll``:
    seconds after which a quiet follower reads anyway (the longest a lost notice can delay an
    event; each quiet stream costs one XREAD per period).
    """

    reads: int = 12
    batch: int = 100
    max_behind: int = 1000
    safety_poll: float = 30.0

    def __post_init__(self) -> None:
        for name in ("reads", "batch", "max_behind"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FeedLimits.{name} must be a whole number >= 1, got {value!r}")
        if not self.safety_poll > 0:
            raise ValueError(f"FeedLimits.safety_poll must be > 0, got {self.safety_poll!r}")


class EventFeed:
    """One process's followers of session event logs (see the module docstring). Subscribes
    nothing and holds no connection while nobody follows; ``aclose`` ends every follower."""

    def __init__(self, store: Store, limits: FeedLimits | None = None) -> None:
        self.store = store
        self.limits = limits or FeedLimits()
        self.subscriber = ShardSubscriber(store.client, self._notice)
        self._followers: dict[str, set[Follower]] = {}
        self._reads: asyncio.Semaphore | None = None

    @property
    def following(self) -> int:
        """How many followers are open."""
        return sum(len(f) for f in self._followers.values())

    def follow(self, k: SessionKeys, after: str) -> Follower:
        """A follower of ``k``'s log from right after the event ID ``after``. Close it (or use
        it as a context manager) when done: the last one out unsubscribes the channel."""
        follower = Follower(self, k, after)
        followers = self._followers.setdefault(k.events, set())
        if not followers:
            self.subscriber.add(k.events)
        followers.add(follower)
        follower.poke()  # anything logged between the caller's snapshot and the subscription
        return follower

    def leave(self, follower: Follower) -> None:
        """Forget ``follower`` (idempotent); unsubscribe its channel if it was the last."""
        channel = follower.keys.events
        followers = self._followers.get(channel)
        if followers is None or follower not in followers:
            return
        followers.discard(follower)
        if not followers:
            del self._followers[channel]
            self.subscriber.discard(channel)

    async def snapshot(self, k: SessionKeys) -> Snapshot:
        """The session and its log's state (``Store.snapshot``), within the ``reads`` bound:
        a thousand streams opening at once must not grow the pool to a thousand connections."""
        async with self._bound():
            return await self.store.snapshot(k)

    async def read(self, k: SessionKeys, after: str, count: int) -> list[Event]:
        """One non-blocking XREAD of up to ``count`` events, within the ``reads`` bound."""
        async with self._bound():
            return await self.store.read_events(k, after, None, count)

    def _bound(self) -> asyncio.Semaphore:
        # Made on first use, inside the running loop that will wait on it.
        if self._reads is None:
            self._reads = asyncio.Semaphore(self.limits.reads)
        return self._reads

    async def aclose(self) -> None:
        """End every follower (their readers get ``StreamEnded``) and close the connections."""
        for followers in list(self._followers.values()):
            for follower in list(followers):
                follower.end(StreamEnded("the event feed closed"))
        await self.subscriber.aclose()

    def _notice(self, channel: str, message: str | None) -> None:
        for follower in list(self._followers.get(channel, ())):
            follower.poke(message)


class Follower:
    """One reader's view of one session log: ``next`` gives what was logged since the last
    call. The feed fills it as notices arrive, up to ``max_behind`` unread events; then it
    waits for the reader to take some, and counts the notices it could not read. Unread in
    all (buffered + announced) past ``max_behind``: the reader fell behind, and once it has
    taken what is buffered (so every cut-off still moves it forward), ``next`` raises."""

    def __init__(self, feed: EventFeed, k: SessionKeys, after: str) -> None:
        self.feed = feed
        self.keys = k
        self.position = after
        """The last event ID read into the buffer."""
        self._buffer: list[Event] = []
        self._announced = 0  # notices of events past the position, not read for want of room
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None
        self._dirty = False  # something may be logged past the position
        self._task: asyncio.Task[None] | None = None
        self._last_read = asyncio.get_running_loop().time()

    def poke(self, event_id: str | None = None) -> None:
        """Read soon: ``event_id`` was logged (ignored if already read), or ``None``: something
        may have been."""
        if self._failure is not None:
            return
        if event_id is not None and not _is_after(event_id, self.position):
            return
        self._dirty = True
        if event_id is not None and len(self._buffer) >= self.feed.limits.max_behind:
            self._announced += 1
            if len(self._buffer) + self._announced > self.feed.limits.max_behind:
                self.end(FellBehind(f"over {self.feed.limits.max_behind} events unread"))
            return
        self._start()

    def _start(self) -> None:
        if self._failure is None and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._fill())

    async def _fill(self) -> None:
        limits = self.feed.limits
        failures = 0
        try:
            while self._dirty and self._failure is None:
                room = min(limits.batch, limits.max_behind - len(self._buffer))
                if room <= 0:
                    return  # full: ``next`` starts this again when the reader takes
                self._dirty = False
                self._last_read = asyncio.get_running_loop().time()
                try:
                    rows = await self.feed.read(self.keys, self.position, room)
                except UNAVAILABLE:
                    # A slot half moved (TRYAGAIN past the client's retries), a failover: the
                    # log is still there, so read again a little later, a few times.
                    failures += 1
                    if failures > READ_RETRIES:
                        raise
                    self._dirty = True
                    await asyncio.sleep(READ_RETRY_AFTER * 2 ** (failures - 1))
                    continue
                failures = 0
                if rows:
                    self.position = rows[-1][0]
                    self._buffer.extend(rows)
                    self._ready.set()
                if len(rows) == room:
                    self._dirty = True  # more may be waiting
                    self._announced = max(0, self._announced - len(rows))
                else:
                    self._announced = 0  # caught up with the log
        except Exception as exc:  # a read error ends the stream, as a blocked read's did
            self.end(exc)

    def end(self, failure: BaseException) -> None:
        """Stop following; once the reader has taken what is buffered, ``next`` raises
        ``failure``."""
        if self._failure is None:
            self._failure = failure
        self._ready.set()
        self.feed.leave(self)

    async def next(self, quiet: float) -> list[Event]:
        """The events read since the last call, oldest first; ``[]`` after ``quiet`` seconds
        with none. Then raises ``FellBehind`` / ``StreamEnded``, or the error a read met."""
        if not self._buffer and self._failure is None:
            try:
                await asyncio.wait_for(self._ready.wait(), quiet)
            except TimeoutError:
                now = asyncio.get_running_loop().time()
                if now - self._last_read >= self.feed.limits.safety_poll:
                    self.poke()  # a notice may have been lost: look anyway
        self._ready.clear()
        if not self._buffer and self._failure is not None:
            raise self._failure
        out, self._buffer = self._buffer, []
        if self._dirty:
            self._start()  # it waited for room
        return out

    def close(self) -> None:
        """Stop following (idempotent)."""
        if self._task is not None:
            self._task.cancel()
        self._buffer = []
        self.end(StreamEnded("closed"))

    def __enter__(self) -> Follower:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _is_after(a: str, b: str) -> bool:
    """Whether stream ID ``a`` comes after ``b`` (when either is not an ID: assume it does)."""
    with contextlib.suppress(ValueError):
        return parse_event_id(a) > parse_event_id(b)
    return True
