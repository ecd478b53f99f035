"""What every driver shares: its command line, the job plan, the order check, the result line.

Standard library only: it runs inside each peer's own venv, where neither ``bench`` nor
``prompt_outbox`` is importable. A driver imports it from its own folder (appended last to
``sys.path``), and is run as ``python -P drivers/<system>.py MODE ...``: ``-P`` keeps the
drivers' folder off ``sys.path``, so ``drivers/saq.py`` does not shadow the ``saq`` package it
drives. A driver supplies two things and ``main`` builds every mode from them: ``adding(args)``,
a context that yields ``add(session, number)``, and ``working(args, tracker)``, a context inside
which the system's worker runs, its handler calling ``handle`` and its completion hook
``tracker.completed``.

Modes, each its own process:

- ``enqueue``: N jobs over S sessions (job ``j`` is session ``j % S``, number ``j // S`` in it),
  added by ``--concurrency`` tasks; each session's jobs are added by one task, in order, so
  "in order" is defined for every system. Result: ``{"phase": "enqueue", "jobs", "seconds"}``.
- ``work``: a worker of ``--concurrency`` with a no-op handler and a completion hook wired;
  exits once the hook has seen N jobs (or at ``--timeout``). Result: ``{"phase": "work",
  "done", "seconds"`` (first handler start -> Nth completion) ``, "startup"`` (worker
  created -> first start) ``, "order_violations", "overlaps", "rss_kb"`` (VmRSS at the Nth
  completion) ``, "rss_start_kb"`` (VmRSS at the first start) ``, "hwm_kb"`` (VmHWM, the peak,
  at the Nth completion) ``, "timed_out"}``.
- ``latency``: a worker on an empty queue, idle for a second; then up to N jobs added one at a
  time from the same process (job ``i`` is session ``i``, number 0), each waited for until its
  handler starts, for at most ``--timeout`` seconds in all. Result: ``{"phase": "latency",
  "waits_ms"`` (add called -> handler started, per job) ``, "idle_rss_kb"}``.
- ``imports``: nothing but the driver's imports. Result: ``{"phase": "imports", "rss_kb"}``.

``--tracemalloc N`` (by hand, not in ``make bench``: it slows the worker) traces the work
mode's allocations from before the worker starts; its result then also holds ``"traced"``:
the traced current and peak (KiB) at the Nth completion, and the N source lines holding most.

The harness (``bench/peers/runner.py``) reads the one line starting with ``RESULT_PREFIX``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "
QUEUE = "benchpeers"
TASK = "noop"
MODES = ("enqueue", "work", "latency", "imports")
IDLE_FIRST = 1.0  # seconds the latency mode's worker idles before the first job: its start-up


@dataclass(frozen=True)
class Args:
    mode: str
    url: str
    jobs: int
    sessions: int
    concurrency: int
    timeout: float
    durability: str
    tracemalloc: int = 0


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """The driver's command line (the same for every system; ``--durability`` is ours only)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--url", required=True, help="redis://127.0.0.1:PORT/0")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--durability", default="none")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N")
    ns = parser.parse_args(argv)
    return Args(
        ns.mode,
        ns.url,
        ns.jobs,
        ns.sessions,
        ns.concurrency,
        ns.timeout,
        ns.durability,
        ns.tracemalloc,
    )


def session_name(session: int) -> str:
    return f"s{session}"


def plan(jobs: int, sessions: int, tasks: int) -> list[list[tuple[int, int]]]:
    """Per enqueuing task, its (session, number) pairs in the order it adds them. A session
    belongs to one task, so its jobs are added one after another, in number order."""
    lanes: list[list[tuple[int, int]]] = [[] for _ in range(tasks)]
    for j in range(jobs):
        session = j % sessions
        lanes[session % tasks].append((session, j // sessions))
    return [lane for lane in lanes if lane]


async def enqueue_all(args: Args, add: Callable[[int, int], Awaitable[None]]) -> None:
    """Add every job with ``add(session, number)`` from ``args.concurrency`` tasks; print the
    result line."""

    async def lane(pairs: list[tuple[int, int]]) -> None:
        for session, number in pairs:
            await add(session, number)

    lanes = plan(args.jobs, args.sessions, args.concurrency)
    started = time.perf_counter()
    await asyncio.gather(*(lane(pairs) for pairs in lanes))
    emit("enqueue", jobs=args.jobs, seconds=time.perf_counter() - started)


def status_kb(name: str = "VmRSS") -> int:
    """A size line of /proc/self/status, in KiB (VmRSS: resident now; VmHWM: the resident
    peak so far); 0 where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb() -> int:
    """This process's resident set (VmRSS), in KiB."""
    return status_kb("VmRSS")


@dataclass
class Tracker:
    """What the work phase sees: starts (order, overlap), completions, the moment of the Nth.

    An order violation is a job started after a later job of its session had started (or a
    job started twice); an overlap is a job started while another of its session was still in
    its handler. Ours must show neither; the peers promise neither.

    With ``watch`` (the latency mode) it also keeps when each job started; off otherwise, so
    the work mode's RSS holds no per-job record of ours."""

    jobs: int
    watch: bool = False
    created: float = field(default_factory=time.perf_counter)
    first_start: float | None = None
    finished_at: float | None = None
    done: int = 0
    order_violations: int = 0
    overlaps: int = 0
    rss: int = 0
    rss_start: int = 0
    hwm: int = 0
    traced: dict[str, Any] = field(default_factory=dict)
    top: int = 0  # with tracemalloc on: how many source lines to report
    starts: dict[tuple[int, int], float] = field(default_factory=dict)
    _highest: dict[int, int] = field(default_factory=dict)
    _busy: dict[int, int] = field(default_factory=dict)
    _all_done: asyncio.Event = field(default_factory=asyncio.Event)
    _a_start: asyncio.Event = field(default_factory=asyncio.Event)

    def started(self, session: int, number: int) -> None:
        """Call first thing in the handler."""
        now = time.perf_counter()
        if self.first_start is None:
            self.first_start = now
            self.rss_start = rss_kb()
        if self.watch:
            self.starts.setdefault((session, number), now)
            self._a_start.set()
        if number <= self._highest.get(session, -1):
            self.order_violations += 1
        self._highest[session] = max(number, self._highest.get(session, -1))
        if self._busy.get(session, 0):
            self.overlaps += 1
        self._busy[session] = self._busy.get(session, 0) + 1

    def ended(self, session: int) -> None:
        """Call last thing in the handler."""
        self._busy[session] -= 1

    def completed(self) -> None:
        """Call from the system's completion hook, once per job it reports done."""
        self.done += 1
        if self.done == self.jobs:
            self.finished_at = time.perf_counter()
            self.rss = rss_kb()
            self.hwm = status_kb("VmHWM")
            if tracemalloc.is_tracing():
                self.traced = _traced(self.top)
            self._all_done.set()

    async def wait(self, seconds: float) -> bool:
        """Until the Nth completion (True) or ``seconds`` have passed (False)."""
        try:
            await asyncio.wait_for(self._all_done.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def start_of(self, job: tuple[int, int], seconds: float) -> float | None:
        """When ``job``'s handler started (``watch`` on), waiting up to ``seconds``; None if
        it has not started by then."""
        deadline = time.perf_counter() + seconds
        while job not in self.starts:
            self._a_start.clear()
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self._a_start.wait(), left)
            except TimeoutError:
                return None
        return self.starts[job]

    def report(self, timed_out: bool) -> None:
        """Print the work phase's result line."""
        end = self.finished_at or time.perf_counter()
        first = self.first_start or end
        emit(
            "work",
            done=self.done,
            seconds=end - first,
            startup=first - self.created,
            order_violations=self.order_violations,
            overlaps=self.overlaps,
            rss_kb=self.rss or rss_kb(),
            rss_start_kb=self.rss_start,
            hwm_kb=self.hwm or status_kb("VmHWM"),
            timed_out=timed_out,
            **({"traced": self.traced} if self.traced else {}),
        )


def _traced(top: int) -> dict[str, Any]:
    """What tracemalloc holds now: current and peak (KiB), and the ``top`` lines holding most."""
    current, peak = tracemalloc.get_traced_memory()
    stats = tracemalloc.take_snapshot().statistics("lineno")[:top]
    lines = [[f"{s.traceback[0].filename}:{s.traceback[0].lineno}", s.size // 1024] for s in stats]
    return {"current_kb": current // 1024, "peak_kb": peak // 1024, "top": lines}


async def handle(tracker: Tracker, session: int, number: int) -> None:
    """The no-op job: record the start, yield to the loop once (so an overlapping job of the
    same session could show), record the end."""
    tracker.started(session, number)
    await asyncio.sleep(0)
    tracker.ended(session)


def emit(phase: str, **fields: Any) -> None:
    print(RESULT_PREFIX + json.dumps({"phase": phase, **fields}), flush=True)


Add = Callable[[int, int], Awaitable[None]]
Adding = Callable[["Args"], AbstractAsyncContextManager[Add]]
Working = Callable[["Args", Tracker], AbstractAsyncContextManager[None]]


async def trickle(args: Args, tracker: Tracker, add: Add) -> None:
    """The latency mode, once the worker runs: let it idle, then add up to ``args.jobs`` jobs
    one at a time, each waited for until its handler starts, for ``args.timeout`` seconds at
    most (a polling worker takes long per job: it gets fewer samples, not more time). Returns
    once the jobs added are done, so the worker stops with nothing in flight."""
    await asyncio.sleep(IDLE_FIRST)
    idle_rss = rss_kb()
    waits = []
    deadline = time.perf_counter() + args.timeout
    for i in range(args.jobs):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        t0 = time.perf_counter()
        await add(i, 0)  # a fresh session each time: nothing queued before it
        started = await tracker.start_of((i, 0), max(left, 5.0))
        if started is None:
            break
        waits.append((started - t0) * 1000)
    emit("latency", waits_ms=waits, idle_rss_kb=idle_rss)
    tracker.jobs = len(waits)
    if tracker.done < tracker.jobs:
        await tracker.wait(5.0)


async def _enqueue(args: Args, adding: Adding) -> None:
    async with adding(args) as add:
        await enqueue_all(args, add)


async def _work(args: Args, working: Working) -> None:
    if args.tracemalloc:
        tracemalloc.start()
    tracker = Tracker(args.jobs, top=args.tracemalloc)
    async with working(args, tracker):
        finished = await tracker.wait(args.timeout)
        tracker.report(timed_out=not finished)


async def _latency(args: Args, adding: Adding, working: Working) -> None:
    tracker = Tracker(args.jobs, watch=True)
    async with working(args, tracker), adding(args) as add:
        await trickle(args, tracker, add)


def main(adding: Adding, working: Working) -> None:
    """A driver's entry point: its mode from the command line, run to the end."""
    args = parse_args()
    if args.mode == "imports":
        emit("imports", rss_kb=rss_kb())
    elif args.mode == "enqueue":
        asyncio.run(_enqueue(args, adding))
    elif args.mode == "work":
        asyncio.run(_work(args, working))
    else:
        asyncio.run(_latency(args, adding, working))
