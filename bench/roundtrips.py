"""Round trips per delivered prompt, and what they allow: the target "≤ 3 round trips per
delivered prompt at steady state with hooks wired, that is ≥ 1/3 of the raw rate of one
valkey-py client calling a no-op script, measured in the same run".

    .venv/bin/python -m bench.roundtrips [--out FILE] [--results FILE]

One server without persistence (as the peer benchmark), 127.0.0.1, started here. Three parts:

- *round trips*, counted at the client (one packed send is one round trip; a pipeline is one):
  the accepts of one session's backlog, then its delivery by ``Outbox.running`` with
  OnDelivered wired, at two backlog sizes; the steady-state figure is the difference between
  them divided by the extra prompts, so what a drain or a run-loop pass costs once is not
  counted per prompt. One session, so that no other session's calls share a send (with many
  in flight, auto-pipelining makes the sends per prompt fewer still);
- *the raw rate*: one valkey-py client calling a no-op script (``return 1``) for a few
  seconds, one call at a time and then from 50 tasks;
- *our rate*: prompts accepted and then delivered (no-op deliverer, OnDelivered wired) by one
  process at the same concurrency, over the whole time: N ÷ (accept time + delivery time).
  At three round trips per prompt and nothing else, it would be 1/3 of the raw rate.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.output import publish, verdict
from bench.peers.server import valkey_server
from prompt_outbox import Entry, Outbox, Tunables
from prompt_outbox.storage.connect import connect

WS = "bench"


# The connection connect() gives a standalone client (valkey-py's, packing in C), as every
# client here: ours and the raw rate's.
_CONNECTION = connect("valkey://127.0.0.1:1").connection_pool.connection_class


class Counting(_CONNECTION):  # type: ignore[valid-type,misc]  # a class known at run time
    """A connection that counts what it sends: one packed send is one round trip (a pipeline
    is one send). Class-wide: every connection of a client adds to ``sent``."""

    sent = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counting.sent += 1
        await super().send_packed_command(command, check_health)


@dataclass
class Backlog:
    """What one backlog cost: round trips of its accepts and of its delivery, and the times."""

    prompts: int
    accept_trips: int
    deliver_trips: int
    accept_seconds: float
    deliver_seconds: float


async def run_backlog(url: str, sessions: int, per_session: int, concurrency: int) -> Backlog:
    """Accept ``per_session`` prompts into each of ``sessions`` (``concurrency`` sessions at a
    time, each in order), then deliver them all with ``Outbox.running``."""
    client = connect(url, connection_class=Counting)
    await client.flushall()
    tunables = Tunables(concurrency=concurrency, cap=per_session + 1, accept_durability="none")
    outbox = Outbox(client, tunables)
    n = sessions * per_session
    hooked = 0
    done = asyncio.Event()

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        return None

    async def delivered(ws: str, ses: str, entry: Entry) -> None:
        nonlocal hooked
        hooked += 1
        if hooked == n:
            done.set()

    outbox.set_on_delivered(delivered)
    gate = asyncio.Semaphore(concurrency)

    async def fill(s: int) -> None:
        async with gate:
            for i in range(per_session):
                await outbox.accept(WS, f"s{s}", "bench", f"s{s}-{i}", str(i))

    try:
        await outbox.check_durability()  # its probe and script loads are not per prompt
        Counting.sent = 0
        started = time.perf_counter()
        await asyncio.gather(*(fill(s) for s in range(sessions)))
        accept_seconds = time.perf_counter() - started
        accept_trips = Counting.sent
        async with outbox.running(deliver, tick=60.0):  # no tick pass inside the window
            started = time.perf_counter()
            await asyncio.wait_for(done.wait(), 120)
            deliver_seconds = time.perf_counter() - started
            await asyncio.sleep(0.2)  # the drains' last calls
            deliver_trips = Counting.sent - accept_trips
    finally:
        await outbox.aclose()
        await client.aclose()
    return Backlog(n, accept_trips, deliver_trips, accept_seconds, deliver_seconds)


async def raw_rate(url: str, concurrency: int, seconds: float) -> float:
    """No-op script calls per second of one valkey-py client from ``concurrency`` tasks."""
    client = connect(url)
    script = client.register_script("return 1")
    await script(keys=["k"], args=[1])
    calls = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal calls
        while time.perf_counter() < deadline:
            await script(keys=["k"], args=[1])
            calls += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await client.aclose()
    return calls / elapsed


@dataclass
class Report:
    accept_per_prompt: float
    deliver_per_prompt: float  # steady state: the marginal round trips per extra prompt
    deliver_total_per_prompt: float  # the larger backlog, everything counted
    rates: list[tuple[int, float, float]]  # (concurrency, raw calls/s, our prompts/s)

    @property
    def per_prompt(self) -> float:
        return self.accept_per_prompt + self.deliver_per_prompt

    def markdown(self) -> str:
        lines = [
            "| measure | ours | bar | |",
            "|---|---|---|---|",
            f"| round trips per delivered prompt, steady state (accept + delivery) "
            f"| {self.accept_per_prompt:.2f} + {self.deliver_per_prompt:.2f} = "
            f"{self.per_prompt:.2f} (all counted: {self.deliver_total_per_prompt:.2f} "
            f"for delivery) | ≤ 3 | {'met' if self.per_prompt <= 3.005 else 'not met'} |",
        ]
        for concurrency, raw, ours in self.rates:
            ratio = ours / (raw / 3)
            lines.append(
                f"| concurrency {concurrency}: prompts/s accepted and delivered, vs the raw "
                f"rate ÷ 3 ({raw:,.0f} no-op script calls/s ÷ 3 = {raw / 3:,.0f}) "
                f"| {ours:,.0f} ({ratio:.2f}x) | ≥ 1.00x | "
                f"{'met' if ratio >= 1 else 'not met'} |"
            )
        return "\n".join(lines) + "\n"


async def measure(url: str, seconds: float) -> Report:
    # One session: its round trips are what each prompt waits for in turn. With many sessions
    # in flight, auto-pipelining puts several sessions' calls in one send (``rates`` below).
    small, large = 200, 400
    a = await run_backlog(url, 1, small, 1)
    b = await run_backlog(url, 1, large, 1)
    extra = b.prompts - a.prompts
    accept = (b.accept_trips - a.accept_trips) / extra
    deliver = (b.deliver_trips - a.deliver_trips) / extra
    rates = []
    for concurrency, sessions, per in ((1, 1, 400), (50, 100, 20)):
        raw = await raw_rate(url, concurrency, seconds)
        run = await run_backlog(url, sessions, per, concurrency)
        rates.append((concurrency, raw, run.prompts / (run.accept_seconds + run.deliver_seconds)))
    return Report(accept, deliver, b.deliver_trips / b.prompts, rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="each raw-rate window")
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the target verdicts (JSON lines)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, valkey_server("no", Path(root)) as server:
        report = asyncio.run(measure(server.url, args.seconds))
    title = "Round trips per delivered prompt (`bench/roundtrips.py`), no persistence:\n\n"
    publish(title + report.markdown(), args.out)
    verdict(
        args.results,
        target="Round trips per delivered prompt",
        bar="≤ 3 at steady state, hooks wired",
        ours=f"{report.per_prompt:.2f}",
        met=report.per_prompt <= 3.005,
        note=f"accept {report.accept_per_prompt:.2f} + delivery {report.deliver_per_prompt:.2f}",
    )
    for concurrency, raw, ours in report.rates:
        verdict(
            args.results,
            target=f"Rate vs a no-op script ÷ 3, concurrency {concurrency}",
            bar="≥ 1/3 of one valkey-py client's no-op script calls/s",
            ours=f"{ours:,.0f} prompts/s ({ours / (raw / 3):.2f}x)",
            peers=f"raw {raw:,.0f} calls/s",
            met=ours >= raw / 3,
        )


if __name__ == "__main__":
    main()
