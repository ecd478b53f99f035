"""Against the peers: end-to-end throughput, memory and latency of prompt-outbox, SAQ, BullMQ
(Python), streaq and arq on one Valkey, in one run.

    .venv/bin/python -m bench.peers [--sessions 100,1000] [--jobs N] [--concurrency 50]
                                    [--memory 10000/400] [--latency 200/10]
                                    [--phases throughput,memory,latency]
                                    [--fsync no|always] [--only ours,saq,...]
                                    [--out FILE] [--results FILE]

For each size (N no-op jobs over S sessions) and each system, on the same server, wiped
between systems: enqueue every job (50 tasks), then start a worker of concurrency 50 in a
process of its own, with a completion hook wired, and let it work the queue off. Reported per
system: enqueue rate, processing rate (first job started -> Nth completion hook), ours ÷ it
against our bar (>= 2x SAQ, BullMQ, streaq; >= 4x arq), Valkey commands per job (INFO
commandstats: every command, those run inside scripts included; and the EVAL/EVALSHA/FCALL
calls), the worker's RSS when it finished, and per-session order violations / overlaps.

Memory (``--memory JOBS/SESSIONS``): on the wiped server, INFO memory before and after
enqueueing the jobs (the server's bytes per queued job), every key's MEMORY USAGE by kind
(what holds them), and once the worker has done them all; the worker's VmRSS at its first
start with every job queued and its peak (VmHWM), beside a process that only imported the
system and the idle worker of the latency phase. Latency (``--latency SAMPLES/SECONDS``): an
idle worker, then jobs added one at a time from its process, each waited for until its handler
starts (at most SECONDS of them): p50 / p95 / p99.

Each peer runs in a venv of its own under .cache/bench-peers/ (bench/peers/venvs.py), built on
first use. Everything runs on 127.0.0.1, against a server this starts and stops.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from bench.output import publish, verdict
from bench.peers import venvs
from bench.peers.report import (
    LatencyMeasured,
    LatencyTable,
    Measured,
    MemoryMeasured,
    MemoryTable,
    Table,
    mib,
)
from bench.peers.runner import (
    ROOT,
    DriverFailed,
    Size,
    run_latency,
    run_memory,
    run_system,
)
from bench.peers.server import Fsync, Server, valkey_server
from bench.peers.systems import OURS, SYSTEMS, System, by_names
from bench.scale import LATENCY_BAR, LATENCY_TARGET

T = TypeVar("T")

# Our accept level on each server setting: what the server can keep, chosen explicitly (the
# default, fsync, would step down on a server with no AOF and say so at every start).
DURABILITY: dict[Fsync, str] = {"no": "none", "always": "fsync"}
PHASES = ("throughput", "memory", "latency")
MEMORY_TARGET = "Memory: Valkey bytes per queued entry"
RSS_TARGET = "Memory: worker RSS at 10 000 queued"


def default_jobs(sessions: int) -> int:
    """2 000 jobs at 100 sessions, 5 jobs a session at 1 000: a few minutes for the lot."""
    return max(2000, 5 * sessions)


def commit() -> str:
    """The commit measured; "-dirty" when the tree had changes on top of it."""
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def bare_rss_kb() -> int:
    """VmRSS of this Python doing nothing (no import beyond its start-up): the floor under
    every worker's RSS (each venv runs the same interpreter)."""
    code = "import re; print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(done.stdout.strip() or 0)


@dataclass
class Report:
    """What one run measured: a table per phase, and the header naming what ran against what."""

    table: Table = field(default_factory=Table)
    memory: MemoryTable = field(default_factory=MemoryTable)
    latency: LatencyTable = field(default_factory=LatencyTable)
    header: str = ""
    bare_rss_kb: int = 0

    def markdown(self) -> str:
        parts = [f"{self.header}\n"]
        if self.table.rows:
            parts.append(self.table.markdown())
        if self.memory.measured or self.memory.missing:
            parts.append(
                "Memory: the server's bytes per queued job (INFO memory around the enqueue, on a "
                "wiped server), and MEMORY USAGE of its keys by kind; the worker's RSS "
                f"(a bare `python -c pass`: {self.bare_rss_kb / 1024:.1f} MiB).\n\n"
                + self.memory.markdown()
            )
        if self.latency.measured or self.latency.missing:
            parts.append(
                "Latency: add -> handler start, one job at a time into an idle worker, each "
                "into a new session, from the worker's own process.\n\n" + self.latency.markdown()
            )
        return "\n".join(parts)


def pythons(systems: list[System], report: Report, sizes: list[Size]) -> dict[str, Path]:
    """Each system's interpreter, its venv built if need be; a peer that cannot be installed
    gets a row saying so in every table, and no interpreter."""
    found = {}
    for system in systems:
        try:
            found[system.name] = venvs.ensure(system)
        except venvs.PeerUnavailable as e:
            print(f"skipping {system.name}: {e}", flush=True)
            for size in sizes:
                report.table.add_missing(size, system, f"skipped: {e}")
            report.memory.add_missing(system, f"skipped: {e}")
            report.latency.add_missing(system, f"skipped: {e}")
    return found


def latency_phase(
    report: Report,
    interpreters: dict[str, Path],
    systems: list[System],
    server: Server,
    size: Size | None,
    level: str,
) -> dict[str, int]:
    """Each system's latency row; the idle worker's RSS (KiB) of each that ran."""
    idle: dict[str, int] = {}
    if size is None:
        return idle
    runs = each_system(
        systems,
        interpreters,
        lambda python, system: run_latency(python, system, server, size, level),
        report.latency.add_missing,
    )
    for system, outcome in runs:
        idle[system.name] = outcome.idle_rss_kb
        report.latency.add(LatencyMeasured.of(system, outcome))
    return idle


def memory_phase(
    report: Report,
    interpreters: dict[str, Path],
    systems: list[System],
    server: Server,
    size: Size | None,
    level: str,
    idle: dict[str, int],
) -> None:
    """Each system's memory row, with its idle worker's RSS from the latency phase."""
    if size is None:
        return
    runs = each_system(
        systems,
        interpreters,
        lambda python, system: run_memory(python, system, server, size, level),
        report.memory.add_missing,
    )
    for system, outcome in runs:
        report.memory.add(MemoryMeasured(system, size, outcome, idle.get(system.name)))


def each_system(
    systems: list[System],
    interpreters: dict[str, Path],
    measure: Callable[[Path, System], T],
    missing: Callable[[System, str], None],
) -> Iterator[tuple[System, T]]:
    """``measure`` each system that has an interpreter; one that fails gets a row saying so."""
    for system in systems:
        python = interpreters.get(system.name)
        if python is None:
            continue
        try:
            outcome = measure(python, system)
        except DriverFailed as e:
            print(f"{system.name} failed: {e}", flush=True)
            missing(system, f"failed: {e}")
            continue
        yield system, outcome


def run(
    sizes: list[Size],
    systems: list[System],
    fsync: Fsync,
    *,
    memory: Size | None = None,
    latency: Size | None = None,
    repeat: int = 1,
) -> Report:
    """Every system at every size on one fresh server (``repeat`` times, the median run
    kept), then (if given) the latency phase and the memory phase for each system; the
    tables, and the header naming what ran."""
    report = Report(bare_rss_kb=bare_rss_kb())
    interpreters = pythons(systems, report, sizes)
    level = DURABILITY[fsync]
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp,
        valkey_server(fsync, Path(tmp)) as server,
    ):
        setup = server.describe()
        for size in sizes:
            runs: dict[str, list[Measured]] = {}
            failed: dict[str, str] = {}
            # Round-robin over the systems, ``repeat`` times: a noisy moment of the shared
            # machine falls on one run of one system, and the median leaves it out.
            for _ in range(repeat):
                for system in systems:
                    python = interpreters.get(system.name)
                    if python is None or system.name in failed:
                        continue
                    try:
                        outcome = run_system(python, system, server, size, level)
                    except DriverFailed as e:
                        print(f"{system.name} failed: {e}", flush=True)
                        failed[system.name] = f"failed: {e}"
                        continue
                    runs.setdefault(system.name, []).append(Measured.of(system, size, outcome))
            for system in systems:
                if system.name in failed:
                    report.table.add_missing(size, system, failed[system.name])
                elif system.name in runs:
                    report.table.add(median_run(runs[system.name]))
        # Latency first: its idle worker's RSS goes in the memory table.
        idle = latency_phase(report, interpreters, systems, server, latency, level)
        memory_phase(report, interpreters, systems, server, memory, level, idle)
    concurrency = (sizes or [memory or latency or Size(0, 0, 0, 0)])[0].concurrency
    report.header = (
        f"Against the peers, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, code of commit {commit()}: "
        f"{setup}; worker concurrency {concurrency}; ours with accept_durability={level}; "
        f"throughput: the median of {repeat} runs per system and size."
    )
    return report


def median_run(runs: list[Measured]) -> Measured:
    """The run with the median process rate (one that timed out counts as the slowest)."""
    ranked = sorted(runs, key=lambda m: m.process_rate or 0.0)
    return ranked[len(ranked) // 2]


def throughput_verdicts(report: Report, results: Path | None) -> None:
    """The end-to-end target rows, one per size: ours against every peer's bar."""
    sizes = {m.size: None for m in report.table.measured}
    for size in sizes:
        here = [m for m in report.table.measured if m.size == size]
        ours = next((m for m in here if m.system.name == OURS), None)
        if ours is None or ours.process_rate is None:
            continue
        cells, met = [], True
        for m in here:
            if m.system.target is None:
                continue
            if m.process_rate is None:
                cells.append(f"{m.system.title}: timed out")
                continue
            ratio = ours.process_rate / m.process_rate
            met = met and ratio >= m.system.target
            cells.append(f"{m.system.title} {m.process_rate:,.0f} ({ratio:.2f}x)")
        verdict(
            results,
            target=f"End to end, {size.sessions} sessions x {size.jobs // size.sessions}",
            bar=">= 2x SAQ, BullMQ, streaq; >= 4x arq (process/s)",
            ours=f"{ours.process_rate:,.0f} prompts/s",
            peers="; ".join(cells) or "no peer ran",
            met=met if cells else None,
            note="library, no-op deliverer, OnDelivered wired, concurrency "
            f"{size.concurrency}, no persistence",
        )


# What our key kinds hold (src/prompt_outbox/core/keys.py), for the targets table.
OUR_KINDS = {
    "outboxev": "event log",
    "outboxq": "queue list",
    "outboxdedupe": "dedupe markers",
    "outboxdedupefp": "dedupe fingerprints",
    "outboxready": "ready index",
    "outboxsessions": "sessions index",
}


def memory_verdicts(report: Report, results: Path | None) -> None:
    """The two memory target rows (report-only: no bar), ours beside each peer's."""
    rows = {m.system.name: m for m in report.memory.measured}
    ours = rows.pop(OURS, None)
    if ours is None:
        return
    size = ours.size
    # The three largest kinds (the keys are largest first): what the doc says dominates.
    kinds = [
        f"{OUR_KINDS.get(kind.split(':')[0], kind)} {ours.per_job(usage.bytes):,.0f} B"
        for kind, usage in list(ours.outcome.keys.items())[:3]
    ]
    verdict(
        results,
        target=MEMORY_TARGET,
        bar="none: report it, and what dominates it",
        ours=f"{ours.per_job(ours.queued.used):,.0f} B per entry; MEMORY USAGE per entry: "
        + ", ".join(kinds),
        peers="; ".join(
            f"{m.system.title} {m.per_job(m.queued.used):,.0f} B" for m in rows.values()
        ),
        met=None,
        note=f"bench.peers, appendonly no: used_memory with {size.jobs:,} jobs queued over "
        f"{size.sessions} sessions less that of the wiped server, per job (ours at its default "
        "cap, 25 a session); MEMORY USAGE of each key, by kind. Once all are done: "
        + "; ".join(
            f"{m.system.title} {m.per_job(m.retained.used):,.0f} B" for m in report.memory.measured
        ),
    )
    idle = "—" if ours.idle_rss_kb is None else mib(ours.idle_rss_kb)
    verdict(
        results,
        target=RSS_TARGET,
        bar="none: report it, and what dominates it",
        ours=f"{ours.rss_text()} (after imports {mib(ours.outcome.imports_rss_kb)}, idle "
        f"worker {idle})",
        peers="; ".join(f"{m.system.title} {m.rss_text()}" for m in rows.values()),
        met=None,
        note=f"bench.peers: VmRSS at the first start with {size.jobs:,} queued over "
        f"{size.sessions} sessions, peak = VmHWM once all are done; a bare python: "
        f"{mib(report.bare_rss_kb)}",
    )


def latency_verdict(report: Report, results: Path | None) -> None:
    """The peers' figures for the latency target's row. bench.scale owns the row (ours on the
    embedded server, default Tunables): its last row is written again with the peers added.
    Without one (bench.scale did not run), ours as measured here stands in, and the note
    says so."""
    if results is None or not report.latency.measured:
        return
    rows = {m.system.name: m for m in report.latency.measured}
    here = rows.get(OURS)
    peers = "bench.peers, p50 / p99 (samples), appendonly no: " + "; ".join(
        m.short() for m in report.latency.measured
    )
    if "arq" in rows:
        peers += " (arq polls every 0.5 s; a job added just after a poll waits for the next)"
    earlier = []
    if results.exists():
        lines = results.read_text().splitlines()
        earlier = [json.loads(line) for line in lines if line.strip()]
    owned = [row for row in earlier if row.get("target") == LATENCY_TARGET]
    if owned:
        row = owned[-1]
        ours, met, note = row["ours"], row["met"], row.get("note", "")
    elif here is not None:
        ours = f"{here.latency} ({here.latency.samples} jobs)"
        met = here.latency.met
        note = "bench.peers alone (bench.scale did not run): appendonly no, accept_durability none"
    else:
        return
    verdict(
        results, target=LATENCY_TARGET, bar=LATENCY_BAR, ours=ours, peers=peers, met=met, note=note
    )


def _pair(text: str, what: str) -> tuple[int, int]:
    try:
        first, second = text.split("/")
        return int(first), int(second)
    except ValueError:
        raise SystemExit(f"{what} must look like N/M, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="100,1000", help="comma-separated sizes")
    parser.add_argument("--jobs", type=int, help="jobs per size (default: max(2000, 5 x S))")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--memory", default="10000/400", help="JOBS/SESSIONS queued at once")
    parser.add_argument("--latency", default="200/10", help="SAMPLES/SECONDS at most, per system")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of these")
    parser.add_argument("--fsync", choices=["no", "always"], default="no")
    parser.add_argument("--only", help="comma-separated systems (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per work phase, seconds")
    parser.add_argument("--out", type=Path, help="append the tables here (markdown)")
    parser.add_argument("--results", type=Path, help="append target verdicts (JSON lines)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="throughput runs per system and size (median kept)"
    )
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [s.name for s in SYSTEMS]
    phases = set(args.phases.split(","))
    if phases - set(PHASES):
        raise SystemExit(f"unknown phases: {', '.join(sorted(phases - set(PHASES)))}")
    sizes = [
        Size(args.jobs or default_jobs(s), s, args.concurrency, args.timeout)
        for s in (int(x) for x in args.sessions.split(","))
    ]
    jobs, sessions = _pair(args.memory, "--memory")
    samples, seconds = _pair(args.latency, "--latency")
    started = time.monotonic()
    report = run(
        sizes if "throughput" in phases else [],
        by_names(names),
        args.fsync,
        memory=Size(jobs, sessions, args.concurrency, args.timeout) if "memory" in phases else None,
        # One job at a time: each session is new, so there are as many sessions as jobs.
        latency=Size(samples, samples, args.concurrency, seconds) if "latency" in phases else None,
        repeat=args.repeat,
    )
    publish(report.markdown(), args.out)
    throughput_verdicts(report, args.results)
    memory_verdicts(report, args.results)
    latency_verdict(report, args.results)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
