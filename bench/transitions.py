"""Server time per transition against the session's queue length (the target: O(1),
no full-queue decode per call).

    .venv/bin/python -m bench.transitions [--lengths 1,25,1000] [--rounds 200] [--out FILE]

For each length L, one session is filled with L pending entries; then, ``rounds`` times, one
more prompt is accepted at the tail and the head is delivered with ``deliver_once`` (acquire,
stage, complete, the OnDelivered record cleared, release), so the queue stays L long. Valkey's
own accounting (INFO commandstats, reset before the rounds) gives the server time of those
script calls: microseconds per call, and per delivered prompt. The figure to read is the ratio
of each row to the L=1 row, measured in the same run: 1.0 is O(1).

Runs on the bundled server (127.0.0.1), started and stopped here.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import valkey.asyncio as valkey_async

from bench.output import publish, verdict
from prompt_outbox import Entry, Outbox, Tunables
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.connect import connect

WS, SES = "bench", "queue"


@dataclass
class Row:
    length: int
    usec_per_call: float
    calls_per_prompt: float
    usec_per_prompt: float


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def markdown(self) -> str:
        base = self.rows[0].usec_per_prompt if self.rows else 1.0
        lines = [
            "| queue length | server µs per script call | script calls per prompt "
            "| server µs per delivered prompt | vs the shortest |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.length} | {r.usec_per_call:.1f} | {r.calls_per_prompt:.1f} "
            f"| {r.usec_per_prompt:.0f} | {r.usec_per_prompt / base:.2f}x |"
            for r in self.rows
        ]
        return "\n".join(lines) + "\n"


async def _scripts(client: valkey_async.Valkey) -> tuple[int, float]:
    """(calls, usec) of EVALSHA and EVAL since the last CONFIG RESETSTAT."""
    stats = await client.info("commandstats")
    calls, usec = 0, 0.0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        if name in stats:
            calls += int(stats[name]["calls"])
            usec += float(stats[name]["usec"])
    return calls, usec


async def measure(client: valkey_async.Valkey, length: int, rounds: int) -> Row:
    await client.flushall()
    outbox = Outbox(client, Tunables(cap=length + 10, accept_durability="none"))
    delivered: list[str] = []

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        delivered.append(entry.id)

    async def agent(ws: str, ses: str, entry: Entry) -> None:
        return None

    outbox.set_on_delivered(on_delivered)  # the hook's record is part of the hot path
    for i in range(length):
        await outbox.accept(WS, SES, "u", f"fill-{i}", f"prompt {i}")
    await client.config_resetstat()
    for i in range(rounds):
        await outbox.accept(WS, SES, "u", f"more-{i}", f"prompt {length + i}")
        assert await outbox.deliver_once(WS, SES, agent)
    calls, usec = await _scripts(client)
    await outbox.aclose()
    assert len(delivered) == rounds, (len(delivered), rounds)
    return Row(length, usec / calls, calls / rounds, usec / rounds)


async def run(lengths: list[int], rounds: int) -> Report:
    report = Report()
    with (
        tempfile.TemporaryDirectory(prefix="bench-transitions-") as tmp,
        EmbeddedValkey(tmp) as server,
    ):
        client = connect(server.url)
        try:
            for length in lengths:
                row = await measure(client, length, rounds)
                report.rows.append(row)
                print(
                    f"queue length {length}: {row.usec_per_call:.1f} µs per script call, "
                    f"{row.usec_per_prompt:.0f} µs per delivered prompt",
                    flush=True,
                )
        finally:
            await client.aclose()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1,25,1000")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    parser.add_argument("--results", type=Path, help="append the target verdict (JSON lines)")
    args = parser.parse_args()
    started = time.monotonic()
    lengths = [int(n) for n in args.lengths.split(",")]
    report = asyncio.run(run(lengths, args.rounds))
    publish(report.markdown(), args.out)
    first, last = report.rows[0], report.rows[-1]
    ratio = last.usec_per_prompt / first.usec_per_prompt
    verdict(
        args.results,
        target="Server time per transition against queue length",
        bar=f"O(1): length {last.length} within 1.5x of length {first.length}",
        ours=" / ".join(f"{r.usec_per_prompt:.0f}" for r in report.rows)
        + f" µs per prompt at lengths {args.lengths} ({ratio:.2f}x)",
        met=ratio <= 1.5,
        note="before, when every call decoded the whole queue: 19.6x at length 1 000",
    )
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
