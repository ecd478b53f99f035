"""Against the peers: end-to-end throughput of prompt-outbox, SAQ, BullMQ (Python), streaq and
arq on one Valkey, in one run.

    .venv/bin/python -m bench.peers [--sessions 100,1000] [--jobs N] [--concurrency 50]
                                    [--fsync no|always] [--only ours,saq,...] [--out FILE]

For each size (N no-op jobs over S sessions) and each system, on the same server, wiped
between systems: enqueue every job (50 tasks), then start a worker of concurrency 50 in a
process of its own, with a completion hook wired, and let it work the queue off. Reported per
system: enqueue rate, processing rate (first job started -> Nth completion hook), ours ÷ it
against issue 12's bar (>= 2x SAQ, BullMQ, streaq; >= 4x arq), Valkey commands per job (INFO
commandstats: every command, those run inside scripts included; and the EVAL/EVALSHA/FCALL
calls), the worker's RSS when it finished, and per-session order violations / overlaps.

Each peer runs in a venv of its own under .cache/bench-peers/ (bench/peers/venvs.py), built on
first use. Everything runs on 127.0.0.1, against a server this starts and stops.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.peers import venvs
from bench.peers.report import Measured, Table
from bench.peers.runner import ROOT, DriverFailed, Size, run_system
from bench.peers.server import Fsync, valkey_server
from bench.peers.systems import SYSTEMS, System, by_names

# Our accept level on each server setting: what the server can keep, chosen explicitly (the
# default, fsync, would step down on a server with no AOF and say so at every start).
DURABILITY: dict[Fsync, str] = {"no": "none", "always": "fsync"}


def default_jobs(sessions: int) -> int:
    """2 000 jobs at 100 sessions, 5 jobs a session at 1 000: a few minutes for the lot."""
    return max(2000, 5 * sessions)


def commit() -> str:
    """The commit measured; "-dirty" when the tree had changes on top of it."""
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def pythons(systems: list[System], table: Table, sizes: list[Size]) -> dict[str, Path]:
    """Each system's interpreter, its venv built if need be; a peer that cannot be installed
    gets a row saying so at every size, and no interpreter."""
    found = {}
    for system in systems:
        try:
            found[system.name] = venvs.ensure(system)
        except venvs.PeerUnavailable as e:
            print(f"skipping {system.name}: {e}", flush=True)
            for size in sizes:
                table.add_missing(size, system, f"skipped: {e}")
    return found


def run(
    sizes: list[Size], systems: list[System], fsync: Fsync, table: Table | None = None
) -> tuple[Table, str]:
    """Every system at every size on one fresh server; the table, and the header naming what
    was run against what."""
    table = table or Table()
    interpreters = pythons(systems, table, sizes)
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp,
        valkey_server(fsync, Path(tmp)) as server,
    ):
        setup = server.describe()
        for size in sizes:
            for system in systems:
                python = interpreters.get(system.name)
                if python is None:
                    continue
                try:
                    outcome = run_system(python, system, server, size, DURABILITY[fsync])
                except DriverFailed as e:
                    print(f"{system.name} failed: {e}", flush=True)
                    table.add_missing(size, system, f"failed: {e}")
                    continue
                table.add(Measured.of(system, size, outcome))
    header = (
        f"Against the peers, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, code of commit {commit()}: "
        f"{setup}; worker concurrency {sizes[0].concurrency}; "
        f"ours with accept_durability={DURABILITY[fsync]}."
    )
    return table, header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="100,1000", help="comma-separated sizes")
    parser.add_argument("--jobs", type=int, help="jobs per size (default: max(2000, 5 x S))")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--fsync", choices=["no", "always"], default="no")
    parser.add_argument("--only", help="comma-separated systems (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per work phase, seconds")
    parser.add_argument("--out", type=Path, help="append the table here (markdown)")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [s.name for s in SYSTEMS]
    sizes = [
        Size(args.jobs or default_jobs(s), s, args.concurrency, args.timeout)
        for s in (int(x) for x in args.sessions.split(","))
    ]
    started = time.monotonic()
    table, header = run(sizes, by_names(names), args.fsync)
    print(header)
    if args.out:
        with args.out.open("a") as out:
            out.write(f"\n{header}\n\n{table.markdown()}")
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
