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
events and about ``max_behind_bytes`` bytes; full, it stops reading and counts the notices it
could not follow. Once buffered plus announced pass ``max_behind``, or a notice comes while the
bytes are full, the reader fell behind: it gets what is buffered, then ``FellBehind``, so a
slow reader holds neither memory nor anyone else up, and each cut-off still moves it forward.
It resumes after the last event it got, like any reconnecting client (the capped log and the
reset rule decide what it sees: ``core/events.missed_events``). So does a follower whose
session's log expired and began again past its position (``LogBegan``): a log lives
``event_log_ttl`` from its first event, and the old log's last events may have gone unread.
A resume's backlog (no notices: it was logged before) is read a buffer at a time as the
reader takes it, never counted against it.

Bytes are also bounded across the process: the buffers of all followers of one feed hold at
most ``max_buffered_bytes``. Past it the feed sheds the followers holding the most (those whose
reader already fell behind or stopped taking first, a reader waiting for events last): each
loses its buffer at once (a reader that never takes would keep it forever) and gets
``FellBehind``; nothing is lost, it resumes after the last event it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from dataclasses import dataclass
from types import TracebackType

from ..core.events import parse_event_id
from ..core.keys import SessionKeys
from ..core.metrics import Metrics
from .replies import Snapshot
from .shardsub import ShardSubscriber
from .store import UNAVAILABLE, Store

Event = tuple[str, dict[str, str]]
"""One logged event: its ID and its fields (kind, id, entry)."""


class StreamEnded(Exception):
    """The feed ended this stream; the reader resumes after the last event it got."""


class FellBehind(StreamEnded):
    """The reader left more than ``max_behind`` events unread: its stream ends."""


class LogBegan(StreamEnded):
    """The session's log expired (it lives ``event_log_ttl`` from its first event) and began
    again past the reader's position: the old log's last events may have gone unread, so the
    stream ends, and a resume from that position gets a reset (``missed_events``)."""


MIB = 1024 * 1024

FIRST_READ = 16
"""Until a follower has seen its session's events, it assumes each may be as large as
1/FIRST_READ of its byte bound: a first read (a resume's backlog of large events) cannot
overshoot the bound by a whole batch."""


def event_bytes(event: Event) -> int:
    """The memory one buffered event holds: its ID, its field names and values, and the dict
    (``sys.getsizeof``: a string of non-ASCII text counts its 2 or 4 bytes per character)."""
    event_id, fields = event
    size = sys.getsizeof(event_id) + sys.getsizeof(fields)
    for name, value in fields.items():
        size += sys.getsizeof(name) + sys.getsizeof(value)
    return size


READ_RETRIES = 5
READ_RETRY_AFTER = 0.05
"""A read that finds Valkey unavailable is tried again after 0.05, 0.1 ... 0.8 s (about 1.5 s
in all) before the stream ends with that error (a client then resumes by its ID)."""


@dataclass(frozen=True, slots=True)
class FeedLimits:
    """The bounds of one process's event feed.

    ``reads``: reads in flight at once across all followers (each XREAD, and each opening
    snapshot, holds a pooled connection for one round trip). ``batch``: events per XREAD.
    ``max_behind``: events a reader may leave unread before its stream ends.
    ``max_behind_bytes``: the bytes (``event_bytes``) a reader may leave unread before its
    stream ends: 4 MiB, about 40 prompts at the 100 KB text limit, thousands of ordinary ones.
    ``max_buffered_bytes``: the bytes all followers of the feed may hold at once: 64 MiB, the
    byte bound of 16 readers fallen behind together (past it, the ones holding the most are cut
    off). ``safety_poll``: seconds after which a quiet follower reads anyway (the longest a lost
    notice can delay an event; each quiet stream costs one XREAD per period).
    """

    reads: int = 12
    batch: int = 100
    max_behind: int = 1000
    max_behind_bytes: int = 4 * MIB
    max_buffered_bytes: int = 64 * MIB
    safety_poll: float = 30.0

    def __post_init__(self) -> None:
        for name in ("reads", "batch", "max_behind", "max_behind_bytes", "max_buffered_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FeedLimits.{name} must be a whole number >= 1, got {value!r}")
        if not self.safety_poll > 0:
            raise ValueError(f"FeedLimits.safety_poll must be > 0, got {self.safety_poll!r}")


class EventFeed:
    """One process's followers of session event logs (see the module docstring). Subscribes
    nothing and holds no connection while nobody follows; ``aclose`` ends every follower.
    ``metrics``: where the readers that fell behind are counted, and the bytes buffered shown."""

    def __init__(
        self, store: Store, limits: FeedLimits | None = None, metrics: Metrics | None = None
    ) -> None:
        self.store = store
        self.limits = limits or FeedLimits()
        self.metrics = metrics
        if metrics is not None:
            metrics.stream_buffer_bytes.set_function(lambda: self.buffered)
        self.subscriber = ShardSubscriber(store.topology, self._notice)
        self._followers: dict[str, set[Follower]] = {}
        self._reads: asyncio.Semaphore | None = None
        self.buffered = 0
        """Bytes the followers' buffers hold (``event_bytes``), ended followers' included."""
        self._holders: set[Follower] = set()  # followers whose buffer holds something

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

    def hold(self, follower: Follower, size: int) -> None:
        """``follower`` buffered ``size`` more bytes: past the process budget, shed."""
        self.buffered += size
        self._holders.add(follower)
        if self.buffered > self.limits.max_buffered_bytes:
            self._shed()

    def release(self, follower: Follower, size: int) -> None:
        """``follower``'s reader took (or it dropped) ``size`` buffered bytes."""
        self.buffered -= size
        if not follower.buffered:
            self._holders.discard(follower)

    def _shed(self) -> None:
        # The readers that took nothing for longest hold the most; a reader waiting for events
        # is about to take its buffer (it is keeping up), so it goes last.
        def order(f: Follower) -> tuple[bool, bool, bool, int]:
            return (f.waiting, f.failure is None, not f.full, -f.buffered)

        for follower in sorted(self._holders, key=order):
            if self.buffered <= self.limits.max_buffered_bytes:
                return
            self.fell_behind("process")
            follower.drop(
                FellBehind(
                    f"this process's event streams hold over {self.limits.max_buffered_bytes} "
                    "bytes unread"
                )
            )

    def fell_behind(self, bound: str) -> None:
        """Count a reader cut off at ``bound`` (events, bytes or process)."""
        if self.metrics is not None:
            self.metrics.streams_fell_behind.labels(bound=bound).inc()

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
    call. The feed fills it as notices arrive, up to ``max_behind`` unread events and
    ``max_behind_bytes`` bytes; then it waits for the reader to take some, and counts the
    notices it could not read. Unread in all (buffered + announced) past ``max_behind``, or a
    notice while the bytes are full: the reader fell behind, and once it has taken what is
    buffered (so every cut-off still moves it forward), ``next`` raises."""

    def __init__(self, feed: EventFeed, k: SessionKeys, after: str) -> None:
        self.feed = feed
        self.keys = k
        self.position = after
        """The last event ID read into the buffer."""
        self.buffered = 0
        """Bytes the buffer holds (``event_bytes`` of each event)."""
        self.waiting = False
        """Whether the reader is waiting in ``next`` (so it takes what comes at once)."""
        self._buffer: deque[tuple[Event, int]] = deque()  # each event with its size
        self._largest = 0  # the largest event read so far, in bytes (0: none yet)
        self._announced = 0  # notices of events past the position, not read for want of room
        self._ready = asyncio.Event()
        self._failure: BaseException | None = None
        self._dropped = False  # shed by the process budget: what it reads is not kept
        self._dirty = False  # something may be logged past the position
        self._task: asyncio.Task[None] | None = None
        self._last_read = asyncio.get_running_loop().time()

    @property
    def failure(self) -> BaseException | None:
        """Why the follower ended (``next`` raises it once the buffer is taken), or None."""
        return self._failure

    @property
    def full(self) -> bool:
        """Whether the buffer is at a bound (events or bytes): it reads no more until taken."""
        limits = self.feed.limits
        return len(self._buffer) >= limits.max_behind or self.buffered >= limits.max_behind_bytes

    def poke(self, event_id: str | None = None) -> None:
        """Read soon: ``event_id`` was logged (ignored if already read), or ``None``: something
        may have been."""
        if self._failure is not None:
            return
        if event_id is not None and not _is_after(event_id, self.position):
            return
        self._dirty = True
        if event_id is not None and self.full:
            limits = self.feed.limits
            self._announced += 1
            if self.buffered >= limits.max_behind_bytes:
                self.feed.fell_behind("bytes")
                self.end(FellBehind(f"over {limits.max_behind_bytes} bytes unread"))
            elif len(self._buffer) + self._announced > limits.max_behind:
                self.feed.fell_behind("events")
                self.end(FellBehind(f"over {limits.max_behind} events unread"))
            return
        self._start()

    def _start(self) -> None:
        if self._failure is None and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._fill())

    def _room(self) -> int:
        """How many events the next read may ask for: within both bounds, at least one."""
        limits = self.feed.limits
        room = min(limits.batch, limits.max_behind - len(self._buffer))
        free = limits.max_behind_bytes - self.buffered
        if room <= 0 or free <= 0:
            return 0
        largest = self._largest or -(-limits.max_behind_bytes // FIRST_READ)
        return max(1, min(room, free // largest))

    async def _fill(self) -> None:
        failures = 0
        try:
            while self._dirty and self._failure is None:
                room = self._room()
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
                if self._dropped:
                    return  # shed while it read: its reader only gets the failure now
                # One log's events, oldest first: its first event can only be rows[0].
                if rows and _began_after(rows[0], self.position):
                    self.end(LogBegan("the session's event log expired and began again"))
                    return
                if rows:
                    self.position = rows[-1][0]
                    added = 0
                    for row in rows:
                        size = event_bytes(row)
                        self._largest = max(self._largest, size)
                        self._buffer.append((row, size))
                        added += size
                    self.buffered += added
                    self._ready.set()
                    self.feed.hold(self, added)
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

    def drop(self, failure: BaseException) -> None:
        """Stop following and free the buffer now: ``next`` raises ``failure`` (or the
        failure the follower had already ended with) at once."""
        self._dropped = True
        self._take(len(self._buffer))
        self.end(failure)

    def _take(self, count: int) -> list[Event]:
        out, size = [], 0
        for _ in range(count):
            event, n = self._buffer.popleft()
            out.append(event)
            size += n
        if size:
            self.buffered -= size
            self.feed.release(self, size)
        return out

    async def next(self, quiet: float, limit: int | None = None) -> list[Event]:
        """The events read since the last call, oldest first (at most ``limit``: the rest stay
        buffered, and counted); ``[]`` after ``quiet`` seconds with none. Then raises
        ``FellBehind`` / ``StreamEnded``, or the error a read met."""
        if not self._buffer and self._failure is None:
            self.waiting = True
            try:
                await asyncio.wait_for(self._ready.wait(), quiet)
            except TimeoutError:
                now = asyncio.get_running_loop().time()
                if now - self._last_read >= self.feed.limits.safety_poll:
                    self.poke()  # a notice may have been lost: look anyway
            finally:
                self.waiting = False
        if not self._buffer and self._failure is not None:
            raise self._failure
        out = self._take(len(self._buffer) if limit is None else min(limit, len(self._buffer)))
        if not self._buffer:
            self._ready.clear()
        if self._dirty:
            self._start()  # it waited for room
        return out

    def close(self) -> None:
        """Stop following (idempotent)."""
        if self._task is not None:
            self._task.cancel()
        self._take(len(self._buffer))
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


def _began_after(event: Event, position: str) -> bool:
    """Whether ``event`` began a log (``emit`` in ``lua/lib.lua`` marks a log's first event)
    while the reader stood in an earlier one, short of its end: a log that began again past
    its bytes names the last ID of the one before (``after``), and a reader that stood there
    missed nothing. A ``0-<t>`` position (no log when the reader read the queue) is before
    any log: nothing of an earlier one can be missing."""
    fields = event[1]
    if fields.get("began") != "1" or fields.get("after") == position:
        return False
    with contextlib.suppress(ValueError):
        return parse_event_id(position)[0] != 0
    return True


def _is_after(a: str, b: str) -> bool:
    """Whether stream ID ``a`` comes after ``b`` (when either is not an ID: assume it does)."""
    with contextlib.suppress(ValueError):
        return parse_event_id(a) > parse_event_id(b)
    return True
