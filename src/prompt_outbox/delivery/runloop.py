"""The run loop: scheduling only. It finds due workspaces through the due index, visits each
(its due sessions go to the engine, ``Engine.drain``, in parallel; its owed OnDelivered calls
to a maintenance pass), starts the slow passes when they are due, and joins everything it
started when it stops.

A tick costs one read per due-index bucket plus one visit per workspace with due work
(storage/dueindex.py): idle workspaces cost nothing. An accept wakes the loop at once
(``Wakeups`` in this process, a published message across processes), so an idle loop starts
delivering within milliseconds; ``tick`` only bounds a sleep.

Fair share (docs/design.md, "Fair share"): the ``concurrency`` slots go round-robin across
the workspaces with due sessions, one session each per round, the workspace this loop served
least recently first (then the one whose due mark is oldest). One workspace's backlog takes
one slot per round, however long it is, and a workspace that a fresh accept woke takes one of
the next slots. A pass starts at most ``START_BURST`` drains and reads only what it may start
(``_limit``), so a loop holding 1,000 drains costs no more per pass than one holding ten, and
a full loop reads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.callbacks import Deliverer, Wiring
from ..core.keys import SessionKeys, WorkspaceKeys
from ..core.logctx import log_context
from ..core.settings import Tunables
from ..core.stopping import loss_level
from ..storage.dueindex import Mark, Visit, parse_abort
from ..storage.shardsub import ShardSubscriber
from ..storage.store import TRANSIENT_ERRORS, Store
from .engine import Engine
from .maintenance import Maintenance
from .tasks import Detached, join

log = logging.getLogger("prompt_outbox.worker")

STOP_GRACE = 5.0
"""Seconds ``RunLoop.stop`` gives the maintenance passes, owed OnDelivered calls and aborts
it started (capped by ``Tunables.bookkeeping_timeout``) before it cancels them: each can take
as long as an agent or a hook does, and each is safe to cut (a pass is redone, an owed call
stays owed and another worker makes it)."""

START_BURST = 32
"""Drains one pass starts at most; with more due and slots free, the next pass follows at
once. Started a thousand at a time, every drain's round trips waited behind a thousand
others' (one auto-pipelined batch): behind a backlog of short sends a fresh prompt waited
0.1-0.7 s to be sent, 20-40 ms paced, and the backlog went no slower (docs/design.md)."""

MIN_READ = 16
"""The fewest marks per bucket and due sessions per workspace a pass reads, however few slots
are free: enough to see past workspaces whose marks stay old (a writer marking between the
loop's read and its move keeps the old one), so a waiting workspace is not hidden behind them."""

ROTATION_MEMORY = 4096
"""Workspaces a loop remembers serving (the least recent forgotten first, which puts them
where they were already: at the front of the rotation)."""


class Wakeups:
    """The wake events of the run loops of one process; an accept sets them all."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def notify(self) -> None:
        for event in self._events:
            event.set()

    def add(self, event: asyncio.Event) -> None:
        self._events.add(event)

    def discard(self, event: asyncio.Event) -> None:
        self._events.discard(event)


class RunLoop:
    """One ``Outbox.run`` / ``Outbox.running``: its session tasks, wake-ups and passes.

    ``start`` it, then ``stop`` it: stopping starts nothing new and returns once every
    delivery it started has finished under its own context."""

    def __init__(
        self,
        *,
        store: Store,
        engine: Engine,
        maintenance: Maintenance,
        tunables: Tunables,
        wiring: Wiring,
        wakeups: Wakeups,
        detached: Detached,
        deliverer: Deliverer,
        tick: float,
    ) -> None:
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.store = store
        self.engine = engine
        self.maintenance = maintenance
        self.tunables = tunables
        self.wiring = wiring
        self.wakeups = wakeups
        self.detached = detached
        self.deliverer = deliverer
        self.tick = tick
        self.wake = asyncio.Event()
        self.active: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.stopping = False
        self.passes: dict[str, asyncio.Task[None]] = {}
        self.owed: dict[str, asyncio.Task[None]] = {}  # owed-hook passes, by workspace
        self.aborts: set[asyncio.Task[None]] = set()  # whileBusy interrupts asked of the agent
        # Sessions started by the last pass and by this one so far: their drains may not have
        # taken their locks yet, so the index may list them as due still (see _limit).
        self._started_before = self._started_now = 0
        # The last pass left due sessions it could not start: a wake-up then jumps no queue.
        self._backlog = False
        # Workspace -> when this loop last gave it a slot (a count of slots given), oldest
        # first: the rotation's order.
        self._served: OrderedDict[str, int] = OrderedDict()
        self._slots_given = 0
        self.woken: set[str] = set()  # workspaces named by wake-ups since the last pass
        # A wake channel was (re)subscribed: its node may have restarted and lost the tail of
        # its AOF (marks among it), which only a full repair pass finds.
        self.full_repair = False
        self._heard_from: set[str] = set()  # wake channels subscribed at least once
        self._loop: asyncio.Task[None] | None = None
        # Sharded pub/sub: one connection per node owning a bucket's wake channel.
        self._listener = ShardSubscriber(store.topology, self._heard, retry_after=tick)

    def start(self) -> None:
        self.wakeups.add(self.wake)
        for channel in self.store.due.wake_channels():
            self._listener.add(channel)
        self._loop = asyncio.create_task(self._run())

    async def wait(self) -> None:
        """Until the loop ends by itself (only a bug ends it: this re-raises that)."""
        assert self._loop is not None
        # Wait without forwarding our cancellation into the loop: valkey-py 6.2 asyncio
        # commands sometimes swallow a CancelledError, so stopping must not rely on one.
        await asyncio.wait({self._loop})
        self.raise_failure()

    def raise_failure(self) -> None:
        """Re-raise what ended the loop, if a bug (not ``stop``) did."""
        loop = self._loop
        if loop is None or not loop.done() or loop.cancelled():
            return
        failure = loop.exception()
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        """Start nothing new, let every in-flight delivery finish (its step: a send, a
        verification), give the passes, owed calls and aborts it started ``STOP_GRACE``
        and cancel what is left of them, then return. A session held in turn holds nothing
        here: its turn goes on in the agent, and whichever loop runs next learns its end."""
        self.stopping = True
        self.wake.set()
        self.wakeups.discard(self.wake)
        await self._listener.aclose()
        # In a task of its own: a cancelled caller waits for it all the same (join).
        await join([self.detached.start(self._wind_down())])

    async def _wind_down(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.cancel()
            await asyncio.wait({loop})  # it checks ``stopping`` on every pass, too
        cut = self.detached.start(self._cut_side_tasks())
        await asyncio.wait({cut, *self.active.values()})

    async def _cut_side_tasks(self) -> None:
        """Wait for the passes, owed calls and aborts for the grace, then cancel the rest
        (and wait as long again: a Valkey call may swallow a cancel, so never for ever)."""
        grace = min(STOP_GRACE, self.tunables.bookkeeping_timeout)
        late = {t for t in (*self.passes.values(), *self.owed.values(), *self.aborts)}
        for attempt in ("wait", "cancel"):
            late = {t for t in late if not t.done()}
            if not late:
                return
            if attempt == "cancel":
                for task in late:
                    task.cancel()
            _, late = await asyncio.wait(late, timeout=grace)
        if late:
            log.warning("stopped with %d maintenance tasks still running", len(late))

    async def _run(self) -> None:
        t = self.tunables
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self.maintenance.recover()
        last_sweep = last_repair = time.monotonic()
        while not self.stopping:
            self.wake.clear()  # before the read, so a wake-up during it is not lost
            sleep_for = self.tick
            try:
                sleep_for = await self._start_due_sessions()
                now = time.monotonic()
                if (
                    self.wiring.ledger_probe is not None
                    and now - last_sweep >= t.parked_sweep_interval
                ):
                    last_sweep = now
                    self._start_pass("ledger sweep", self._ledger_sweep)
                if (now - last_repair >= t.repair_interval or self.full_repair) and (
                    self._start_pass("repair", self._repair)
                ):
                    last_repair = now
            except TRANSIENT_ERRORS as exc:
                log.log(loss_level(self.stopping), "valkey unavailable, retrying: %s", exc)
            except Exception:
                log.exception("run loop pass failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the wake event is set, and the loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, sleep_for)):
                    await self.wake.wait()

    async def _start_due_sessions(self) -> float:
        """Visit the workspaces a wake-up named, then every workspace marked due, sharing the
        free slots among them (``_share``); seconds until the next pass is due."""
        self._started_before, self._started_now = self._started_now, 0
        if self._free() <= 0 or self.stopping:
            # Full: no read at all. Marks stay due, for other loops and for this one's next
            # pass, which a finishing drain starts (it sets the wake event); that pass reads
            # the workspaces woken meanwhile (past ROTATION_MEMORY of them, its scan finds
            # them in time).
            if len(self.woken) > ROTATION_MEMORY:
                self.woken.clear()
            self._backlog = True
            return self.tick
        woken, self.woken = self.woken, set()
        due = self.store.due
        now_ms = self.engine.now_ms()
        left, later = False, None
        if woken and not self._backlog:
            # Nobody was left waiting here: no bucket scan first, the delivery starts one
            # round trip sooner.
            limit = self._limit()
            left, later = await self._visit(
                await due.visits_of(sorted(woken), now_ms, limit), now_ms, limit
            )
            woken = set()
        limit = self._limit()
        # With a backlog a wake-up jumps no queue: the woken workspaces (those served least
        # recently, as many as the pass may start) are read with the scan, and all share.
        named = sorted(woken, key=lambda ws: (self._served.get(ws, -1), ws))[:limit]
        (found, next_ms), named_found = await asyncio.gather(
            due.due_visits(now_ms, limit), due.visits_of(named, now_ms, limit)
        )
        every = {mark.ws: (mark, visit) for mark, visit in named_found}
        every.update((mark.ws, (mark, visit)) for mark, visit in found)
        found_left, found_later = await self._visit(list(every.values()), now_ms, limit)
        self._backlog = left or found_left or next_ms == now_ms
        if self._free() <= 0:
            return self.tick  # a finishing drain sets the wake event
        if self._backlog:
            return 0.0  # a read held fewer due sessions or marks than there are: read on
        times = [t for t in (next_ms, later, found_later) if t is not None]
        if not times:
            return self.tick
        return min(self.tick, max(0.0, (min(times) - now_ms) / 1000))

    def _free(self) -> int:
        return self.tunables.concurrency - len(self.active)

    def _limit(self) -> int:
        """The marks per bucket and due sessions per workspace a pass reads: what it may start
        (its free slots, at most ``START_BURST``), not ``concurrency`` (a loop holding 1,000
        drains that has one slot free reads a few members, not a thousand), plus the sessions
        started just before, which the index may still list as due; at least ``MIN_READ``."""
        starts = min(self._free(), START_BURST)
        return max(MIN_READ, starts + self._started_before + self._started_now)

    async def _visit(
        self, found: list[tuple[Mark, Visit]], now_ms: int, limit: int
    ) -> tuple[bool, int | None]:
        """Start what the visits found (``_share``), then move their marks: whether due
        sessions were left waiting, and the earliest new mark (ms)."""
        moves, left = self._share(found, now_ms, limit)
        await self.store.due.unmark(moves, grace_ms=self.engine.lease_ms)
        return left, min((m for _, m in moves if m is not None and m > now_ms), default=None)

    def _share(
        self, found: list[tuple[Mark, Visit]], now_ms: int, limit: int
    ) -> tuple[list[tuple[Mark, int | None]], bool]:
        """Start the due sessions round-robin across the workspaces found, one session each
        per round while slots are free, the workspace served least recently first (then the
        oldest mark). The marks to move (a workspace served that has more stays due now,
        behind the marks of those not served; one with nothing left moves to when it next
        needs a visit, or goes), and whether any workspace was left with due sessions. A
        workspace not served that has due sessions keeps its mark as it is."""
        order = sorted(found, key=lambda f: (self._served.get(f[0].ws, -1), f[0].score_ms))
        waiting = [deque(s for s in v.due if (m.ws, s) not in self.active) for m, v in order]
        served = [False] * len(order)
        turn = deque(i for i, w in enumerate(waiting) if w)
        while turn and not self.stopping and self._free() > 0 and self._started_now < START_BURST:
            i = turn.popleft()
            self._start_drain(SessionKeys(order[i][0].ws, waiting[i].popleft()))
            served[i] = True
            if waiting[i]:
                turn.append(i)
        moves: list[tuple[Mark, int | None]] = []
        left = False
        for i, (mark, visit) in enumerate(order):
            later = self._later(mark.ws, visit, now_ms)
            # A read that filled its limit may have left more due sessions unread.
            if waiting[i] or len(visit.due) >= limit:
                left = True
                if served[i]:
                    moves.append((mark, now_ms))
            else:
                moves.append((mark, later))
        return moves, left

    def _later(self, ws: str, visit: Visit, now_ms: int) -> int | None:
        """When the workspace next needs a visit, as far as this one saw (ms), firing its owed
        OnDelivered calls if they are due."""
        later = [x for x in (visit.next_ready_ms,) if x is not None]
        if visit.next_notice_ms is not None:
            if visit.next_notice_ms <= now_ms and not self.stopping:
                self._fire_owed_hooks(WorkspaceKeys(ws))  # it takes them for hook_retry_after
                later.append(now_ms + round(self.tunables.hook_retry_after * 1000))
            else:
                later.append(visit.next_notice_ms)
        if any((ws, ses) in self.active for ses in visit.due):
            # Held now: due again at its lease's expiry, unless its drain lets go sooner (and
            # then marks the workspace itself, see Store.release).
            later.append(now_ms + self.engine.lease_ms)
        return min(later, default=None)

    def _start_drain(self, k: SessionKeys) -> None:
        key = (k.ws, k.ses)
        task = self.detached.start(self._drain(k))
        self.active[key] = task
        task.add_done_callback(self._on_finished(key))
        self._started_now += 1
        self._slots_given += 1
        self._served[k.ws] = self._slots_given
        self._served.move_to_end(k.ws)
        if len(self._served) > ROTATION_MEMORY:
            self._served.popitem(last=False)

    def _fire_owed_hooks(self, w: WorkspaceKeys) -> None:
        """Start the workspace's owed-hooks pass unless one is still running."""
        if self.wiring.on_delivered is None:
            return
        running = self.owed.get(w.ws)
        if running is not None and not running.done():
            return
        task = self.detached.start(
            self._logged("owed hooks", lambda: self.maintenance.fire_owed_hooks(w))
        )
        self.owed[w.ws] = task
        task.add_done_callback(lambda _t: self.owed.pop(w.ws, None))

    async def _ledger_sweep(self) -> int:
        return await self.maintenance.sweep_ledger_everywhere(lambda: self.stopping)

    def _on_finished(self, key: tuple[str, str]) -> Callable[[asyncio.Task[None]], None]:
        def finished(_task: asyncio.Task[None]) -> None:
            self.active.pop(key, None)
            self.wake.set()

        return finished

    async def _drain(self, k: SessionKeys) -> None:
        # Every record of the step (the engine's, the deliverer's) names its session.
        with log_context(workspace=k.ws, session=k.ses):
            try:
                await self.engine.drain(k, self.deliverer, stopping=lambda: self.stopping)
            except TRANSIENT_ERRORS as exc:
                log.log(loss_level(self.stopping), "session step interrupted: %s", exc)
            except Exception:
                log.exception("session step failed")

    def _heard(self, channel: str, ws: str | None) -> None:
        """A mark published its workspace (visit it at once), an interrupt asks for an abort
        (``DueIndex.ask_abort``), or a wake channel was (re)subscribed (``None``: a message
        may have been missed, so scan the buckets; and when subscribed AGAIN, its node may
        have restarted, so repair everything once)."""
        abort = parse_abort(ws) if ws else None
        if abort is not None:
            if abort[:2] in self.active and not self.stopping:  # the engine checks the entry
                task = self.detached.start(self._logged("abort", lambda: self._abort(*abort)))
                self.aborts.add(task)
                task.add_done_callback(self.aborts.discard)
            return
        if ws:
            self.woken.add(ws)
        elif channel in self._heard_from:
            self.full_repair = True
        self._heard_from.add(channel)
        self.wake.set()

    async def _abort(self, ws: str, ses: str, entry_id: str) -> int:
        await self.engine.abort(ws, ses, entry_id)
        return 0

    def _start_pass(self, name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> bool:
        """Start a maintenance pass unless the last one of its kind is still running (then
        False). Detached: its I/O is the caller's (ledger probes, hooks) and must never hold
        up delivery."""
        running = self.passes.get(name)
        if running is not None and not running.done():
            return False
        self.passes[name] = self.detached.start(self._logged(name, body))
        return True

    async def _repair(self) -> int:
        """A repair pass, full if one was asked for; a full one that fails is asked again."""
        full, self.full_repair = self.full_repair, False
        try:
            return await self.maintenance.repair(full=full)
        except BaseException:
            self.full_repair = self.full_repair or full
            raise

    @staticmethod
    async def _logged(name: str, body: Callable[[], Coroutine[Any, Any, int]]) -> None:
        try:
            await body()
        except Exception:
            log.exception("%s pass failed", name)
