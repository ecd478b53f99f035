"""The held-turns benchmark: one worker holding 10,000 agent turns.

    .venv/bin/python -m bench.turns [--turns 10000] [--window 30] [--samples 200]
                                    [--check-interval 60]
                                    [--out FILE] [--results FILE]

A turn is a record in Valkey (the session's lock, core/turns.py), not a task: the worker's
deliverer answers each send with a Turn at once, and the session stays held until the turn
ends. This measures, in one run on the bundled server (ratios within the run; these machines
are shared and noisy):

- the worker's RSS per held turn beyond the same worker idle after the same sends (target:
  at most 1 KiB). The worker is a process of its own; its deliverer keeps a record per
  running turn, as a real watcher does (opencode's event-stream table), so the figure
  includes it.
- Valkey commands per second while the turns are held, against the idle worker's (no turn is
  renewed: the work is the checks of turns nobody heard end, one per turn per
  ``turn_check_interval``, 60 s by default).
- a fresh session's accept -> send p50 while the turns are held, against the same with none
  (target: at most 10 ms).

Everything runs on 127.0.0.1 against servers it starts itself and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import valkey.asyncio as valkey_async

from bench.output import verdict
from bench.scale import percentile
from prompt_outbox import Entry, Outbox, Tunables, Turn, TurnEnded, TurnState
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.connect import connect

FRESH_WS = "fresh"
TURN_TARGET = "Turns: 10,000 held by one worker"
TURN_BAR = "≤ 1 KiB RSS per held turn; fresh session accept → send p50 ≤ 10 ms"
RSS_MAX_BYTES, P50_MAX_MS = 1024, 10.0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class HeldAgent:
    """A deliverer whose turns run until the end of the benchmark: one record per running
    turn, as a watcher keeps. The ``fresh`` workspace's sends are timed instead, and hold no
    turn (each sample's session is new anyway)."""

    def __init__(self, sent: Any) -> None:
        self.running: dict[tuple[str, str], str] = {}
        self._sent = sent  # a multiprocessing queue: (entry text, wall time of the send)

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn | None:
        if ws == FRESH_WS:
            self._sent.put((entry.text, time.time()))
            return None
        if ws.startswith("warm-"):
            return None  # the baseline's fill: the same sends, no turn held
        self.running[(ws, ses)] = entry.id
        return Turn(entry.id)

    def watch_turns(self, ended: TurnEnded | None) -> None:
        return None  # the turns never end during the run

    async def turn_state(self, ws: str, ses: str, turn_id: str) -> TurnState:
        return TurnState.RUNNING if self.running.get((ws, ses)) == turn_id else TurnState.ENDED


def _worker(url: str, control: Connection, sent: Any, check_interval: float) -> None:
    """The worker process: ``Outbox.run`` with default Tunables (but ``turn_check_interval``);
    answers ``rss`` (after a GC) and ``turns`` (how many it holds) on ``control`` until
    ``stop``."""

    async def main() -> None:
        client = await connect(url)
        outbox = Outbox(client, Tunables(turn_check_interval=check_interval))
        agent = HeldAgent(sent)
        task = asyncio.create_task(outbox.run(agent, tick=1.0))
        loop = asyncio.get_running_loop()
        while True:
            ask = await loop.run_in_executor(None, control.recv)
            if ask == "stop":
                break
            if ask == "rss":
                gc.collect()
                control.send(rss_bytes())
            elif ask == "turns":
                control.send(len(agent.running))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()

    asyncio.run(main())


@contextlib.contextmanager
def worker(url: str, check_interval: float) -> Iterator[tuple[Connection, Any]]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    sent = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(url, child, sent, check_interval), daemon=True)
    proc.start()
    try:
        yield parent, sent
    finally:
        with contextlib.suppress(OSError):
            parent.send("stop")
        proc.join(20)
        if proc.is_alive():
            proc.kill()


def ask(control: Connection, what: str) -> int:
    control.send(what)
    return int(control.recv())


async def commands(client: valkey_async.Valkey) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))


async def commands_per_second(client: valkey_async.Valkey, window: float) -> float:
    before = await commands(client)
    started = time.monotonic()
    await asyncio.sleep(window)
    after = await commands(client)
    return (after - before - 1) / (time.monotonic() - started)  # less the second INFO


async def fresh_p50(outbox: Outbox, sent: Any, samples: int, tag: str) -> float:
    """accept -> send into a new session each time, one at a time (wall clock: the send is
    stamped in the worker process); the p50, ms."""
    loop = asyncio.get_running_loop()
    waits = []
    for i in range(samples):
        text = f"{tag}-{i}"
        t0 = time.time()
        await outbox.accept(FRESH_WS, text, "bench", text, text)
        while True:
            got, at = await loop.run_in_executor(None, sent.get, True, 30)
            if got == text:
                break
        waits.append((at - t0) * 1000)
    return percentile(sorted(waits), 0.5)


async def fill(outbox: Outbox, count: int, workspaces: int, prefix: str) -> None:
    """``count`` prompts, each into a session of its own, spread over ``workspaces``."""
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            ws = f"{prefix}-{i % workspaces}"
            await outbox.accept(ws, f"s{i}", "bench", f"c{i}", "work")

    await asyncio.gather(*(one(i) for i in range(count)))


async def run(turns: int, window: float, samples: int, check_interval: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedValkey(Path(tmp)) as server:
        client = await connect(server.url)
        outbox = Outbox(client, Tunables())
        with worker(server.url, check_interval) as (control, sent):
            await asyncio.sleep(2.0)  # the worker's start-up recovery pass
            await fresh_p50(outbox, sent, 20, "warm")  # the worker's paths are warm
            # The baseline: the same sends, turns ended at once (the worker's allocator keeps
            # what their peak took, so "idle" means after the same work, none of it held).
            workspaces = max(1, turns // 100)
            await fill(outbox, turns, workspaces, "warm")
            for _ in range(600):
                if not sum((await outbox.count_by_status()).values()):
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            idle_rss = ask(control, "rss")
            idle_cps = await commands_per_second(client, window)
            idle_p50 = await fresh_p50(outbox, sent, samples, "idle")
            started = time.monotonic()
            await fill(outbox, turns, workspaces, "tenant")
            for _ in range(600):  # each fill is sent within a minute on these machines
                if ask(control, "turns") >= turns:
                    break
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"the worker held {ask(control, 'turns')} of {turns} turns")
            filled = time.monotonic() - started
            # The steady state: every turn's first check has come (they are staggered as
            # the sends were), so the window below holds their share of the checks.
            await asyncio.sleep(check_interval + 5.0)
            held_rss = ask(control, "rss")
            held_cps = await commands_per_second(client, window)
            held_p50 = await fresh_p50(outbox, sent, samples, "held")
        await client.aclose()
    return {
        "turns": turns,
        "check_interval": check_interval,
        "fill_s": filled,
        "rss_per_turn": (held_rss - idle_rss) / turns,
        "idle_rss": idle_rss,
        "held_rss": held_rss,
        "idle_cps": idle_cps,
        "held_cps": held_cps,
        "idle_p50": idle_p50,
        "held_p50": held_p50,
    }


def markdown(f: dict[str, float], window: float) -> str:
    rows = [
        "## Held turns (bench/turns.py)",
        "",
        f"One worker, default Tunables, {f['turns']:,.0f} turns held (sent and started in "
        f"{f['fill_s']:.1f} s; measured once every turn had had its first check, "
        f"turn_check_interval {f['check_interval']:.0f} s), against the same worker idle after "
        "the same sends, in one run.",
        "",
        "| figure | idle worker | turns held | ratio |",
        "|---|---|---|---|",
        f"| worker RSS | {f['idle_rss'] / 2**20:.1f} MiB | {f['held_rss'] / 2**20:.1f} MiB | "
        f"{f['rss_per_turn']:+.0f} B per turn |",
        f"| Valkey commands/s ({window:.0f} s window) | {f['idle_cps']:.1f} | "
        f"{f['held_cps']:.1f} | {f['held_cps'] / max(f['idle_cps'], 0.1):.2f}x |",
        f"| fresh session accept → send p50 | {f['idle_p50']:.2f} ms | {f['held_p50']:.2f} ms "
        f"| {f['held_p50'] / max(f['idle_p50'], 0.001):.2f}x |",
        "",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--check-interval", type=float, default=Tunables().turn_check_interval)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    figures = asyncio.run(run(args.turns, args.window, args.samples, args.check_interval))
    text = markdown(figures, args.window)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(text + "\n")
    met = figures["rss_per_turn"] <= RSS_MAX_BYTES and figures["held_p50"] <= P50_MAX_MS
    verdict(
        args.results,
        target=TURN_TARGET,
        bar=TURN_BAR,
        ours=f"{figures['rss_per_turn']:.0f} B per turn, p50 {figures['held_p50']:.2f} ms",
        peers=f"idle worker: p50 {figures['idle_p50']:.2f} ms; Valkey "
        f"{figures['held_cps']:.0f} vs {figures['idle_cps']:.0f} commands/s",
        met=met,
    )


if __name__ == "__main__":
    main()
