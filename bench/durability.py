"""What each accept level costs: accept latency and throughput, per level, per server setup.

    .venv/bin/python -m bench.durability [--seconds 4] [--out FILE]

For each setup (servers it starts itself on 127.0.0.1 and stops) and each level it can honour,
in one run, so the figures read against each other (never as absolutes: these machines are
shared and noisy):

- latency: sequential ``Outbox.accept`` calls for ``--seconds`` (at most 400), p50 / p99;
- throughput: 50 concurrent accepts into 500 sessions for ``--seconds``, accepts per second.

Setups: the embedded server's configuration (``appendfsync always``, no replica); a primary and
a replica both on ``appendfsync everysec`` (the usual replicated deployment, the one where
WAITAOF matters); a primary and a replica both on ``appendfsync always``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

from tests.replication import Fsync, ReplicatedPair

from bench.output import publish
from prompt_outbox import DurabilityLevel, Outbox, Tunables
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.connect import connect

CONCURRENCY = 50
SESSIONS = 500
MAX_SEQUENTIAL = 400


@dataclass(frozen=True)
class Setup:
    name: str
    levels: tuple[DurabilityLevel, ...]
    replica_fsync: Fsync | None  # None: no replica (the embedded server)
    primary_fsync: Fsync = "always"


SETUPS = (
    Setup("embedded (always, no replica)", ("none", "fsync"), None),
    # fsync is refused on everysec (WAITAOF counts the local fsync early there: durability.py).
    Setup("primary + replica, both everysec", ("none", "replica"), "everysec", "everysec"),
    Setup("primary + replica, both always", ("fsync", "replica"), "always", "always"),
)


@dataclass
class Report:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)

    def add(self, setup: str, level: str, latency: str, rate: str) -> None:
        self.rows.append((setup, level, latency, rate))
        print(f"{setup:36} {level:8} {latency:28} {rate}", flush=True)

    def markdown(self) -> str:
        lines = [
            "| setup | level | accept latency | accepts/s (50 concurrent) |",
            "|---|---|---|---|",
        ]
        lines += [f"| {' | '.join(row)} |" for row in self.rows]
        return "\n".join(lines) + "\n"


@contextlib.contextmanager
def servers(setup: Setup, root: Path) -> Iterator[str]:
    """The setup's primary URL, for as long as the block runs."""
    if setup.replica_fsync is None:
        with EmbeddedValkey(root) as server:
            yield server.url
        return
    fsyncs = {"primary_fsync": setup.primary_fsync, "replica_fsync": setup.replica_fsync}
    with ReplicatedPair(root, **fsyncs) as pair:
        yield pair.primary_url


async def measure(url: str, level: DurabilityLevel, seconds: float, tag: str) -> tuple[str, str]:
    client = connect(url, socket_timeout=30)
    # A run fills one workspace past any quota: the accepts are measured, not the quota.
    tunables = Tunables(
        cap=10_000,
        workspace_cap=10**9,
        accept_durability=level,
        durability_timeout=10.0,
    )
    outbox = Outbox(client, tunables)
    ids = count()
    try:
        assert (await outbox.check_durability()).level == level
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(latencies) < MAX_SEQUENTIAL:
            started = time.perf_counter()
            await outbox.accept(f"bench-{tag}", "seq", "u", f"s{next(ids)}", "hello")
            latencies.append((time.perf_counter() - started) * 1000)
        cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
        latency = f"p50 {cuts[49]:.1f} ms, p99 {cuts[98]:.1f} ms (n={len(latencies)})"

        done = 0
        deadline = time.perf_counter() + seconds

        async def one_worker(worker: int) -> None:
            nonlocal done
            n = worker
            while time.perf_counter() < deadline:
                ses = f"c{n % SESSIONS}"
                await outbox.accept(f"bench-{tag}", ses, "u", f"c{next(ids)}", "hello")
                done += 1
                n += CONCURRENCY

        started = time.perf_counter()
        await asyncio.gather(*(one_worker(w) for w in range(CONCURRENCY)))
        rate = f"{done / (time.perf_counter() - started):.0f}"
        return latency, rate
    finally:
        await outbox.aclose()
        await client.aclose()


async def run(seconds: float, setups: tuple[Setup, ...] = SETUPS) -> Report:
    report = Report()
    for setup in setups:
        with (
            tempfile.TemporaryDirectory(prefix="bench-durability-") as tmp,
            servers(setup, Path(tmp)) as url,
        ):
            for level in setup.levels:
                tag = f"{len(report.rows)}"
                latency, rate = await measure(url, level, seconds, tag)
                report.add(setup.name, level, latency, rate)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    args = parser.parse_args()
    started = time.monotonic()
    report = asyncio.run(run(args.seconds))
    publish(report.markdown(), args.out)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
