"""What every driver shares: its command line, the job plan, the order check, the result line.

Standard library only: it runs inside each peer's own venv, where neither ``bench`` nor
``prompt_outbox`` is importable. A driver loads it by path (``load_proto`` in each driver), and
is run as ``python -P drivers/<system>.py {enqueue,work} ...``: ``-P`` keeps the drivers'
folder off ``sys.path``, so ``drivers/saq.py`` does not shadow the ``saq`` package it drives.

Phases, each its own process:

- ``enqueue``: N jobs over S sessions (job ``j`` is session ``j % S``, number ``j // S`` in it),
  added by ``--concurrency`` tasks; each session's jobs are added by one task, in order, so
  "in order" is defined for every system. Result: ``{"phase": "enqueue", "jobs", "seconds"}``.
- ``work``: a worker of ``--concurrency`` with a no-op handler and a completion hook wired;
  exits once the hook has seen N jobs (or at ``--timeout``). Result: ``{"phase": "work",
  "done", "seconds"`` (first handler start -> Nth completion) ``, "startup"`` (worker
  created -> first start) ``, "order_violations", "overlaps", "rss_kb", "timed_out"}``.

The harness (``bench/peers/runner.py``) reads the one line starting with ``RESULT_PREFIX``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "
QUEUE = "benchpeers"
TASK = "noop"


@dataclass(frozen=True)
class Args:
    mode: str
    url: str
    jobs: int
    sessions: int
    concurrency: int
    timeout: float
    durability: str


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """The driver's command line (the same for every system; ``--durability`` is ours only)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["enqueue", "work"])
    parser.add_argument("--url", required=True, help="redis://127.0.0.1:PORT/0")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--durability", default="none")
    ns = parser.parse_args(argv)
    return Args(ns.mode, ns.url, ns.jobs, ns.sessions, ns.concurrency, ns.timeout, ns.durability)


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


def rss_kb() -> int:
    """This process's resident set (VmRSS), in KiB; 0 where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Tracker:
    """What the work phase sees: starts (order, overlap), completions, the moment of the Nth.

    An order violation is a job started after a later job of its session had started (or a
    job started twice); an overlap is a job started while another of its session was still in
    its handler. Ours must show neither; the peers promise neither."""

    jobs: int
    created: float = field(default_factory=time.perf_counter)
    first_start: float | None = None
    finished_at: float | None = None
    done: int = 0
    order_violations: int = 0
    overlaps: int = 0
    rss: int = 0
    _highest: dict[int, int] = field(default_factory=dict)
    _busy: dict[int, int] = field(default_factory=dict)
    _all_done: asyncio.Event = field(default_factory=asyncio.Event)

    def started(self, session: int, number: int) -> None:
        """Call first thing in the handler."""
        if self.first_start is None:
            self.first_start = time.perf_counter()
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
            self._all_done.set()

    async def wait(self, seconds: float) -> bool:
        """Until the Nth completion (True) or ``seconds`` have passed (False)."""
        try:
            await asyncio.wait_for(self._all_done.wait(), seconds)
        except TimeoutError:
            return False
        return True

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
            timed_out=timed_out,
        )


async def handle(tracker: Tracker, session: int, number: int) -> None:
    """The no-op job: record the start, yield to the loop once (so an overlapping job of the
    same session could show), record the end."""
    tracker.started(session, number)
    await asyncio.sleep(0)
    tracker.ended(session)


def emit(phase: str, **fields: Any) -> None:
    print(RESULT_PREFIX + json.dumps({"phase": phase, **fields}), flush=True)


Phase = Callable[["Args"], Awaitable[None]]


def main(enqueue: Phase, work: Phase) -> None:
    """A driver's entry point: its mode from the command line, run to the end."""
    args = parse_args()
    asyncio.run(enqueue(args) if args.mode == "enqueue" else work(args))
