"""One system at one size: its enqueue phase, then its work phase, each a process of the
system's own venv, with the server's command counts taken around each. Also the memory
phase (the server's memory per queued job, and the worker's RSS working them off) and the
latency phase (a trickle of jobs into an idle worker)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.server import Commands, KeyKind, Memory, Server
from bench.peers.systems import System

ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "BENCH-RESULT "  # drivers/_proto.py prints it (it cannot import this module)


class DriverFailed(RuntimeError):
    """A driver exited badly or printed no result line (the message has its stderr's tail)."""


@dataclass(frozen=True)
class Size:
    jobs: int
    sessions: int
    concurrency: int
    timeout: float


@dataclass(frozen=True)
class Outcome:
    """What one system did at one size: each phase's result line and its command counts."""

    enqueue: dict[str, Any]
    work: dict[str, Any]
    enqueue_commands: Commands
    work_commands: Commands


@dataclass(frozen=True)
class MemoryOutcome:
    """The memory phase: the server's memory on a wiped server, with every job queued, and
    once all are done; the keys by kind at both moments; the work phase's result line (its
    RSS figures); the RSS of a process that only imported the driver."""

    empty: Memory
    queued: Memory
    done: Memory
    keys: dict[str, KeyKind]
    done_keys: dict[str, KeyKind]
    work: dict[str, Any]
    imports_rss_kb: int


@dataclass(frozen=True)
class LatencyOutcome:
    """The latency phase: each job's add -> handler start (ms), and the idle worker's RSS."""

    waits_ms: list[float]
    idle_rss_kb: int


def _result(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line.removeprefix(RESULT_PREFIX))
            return result
    return None


def run_phase(
    python: Path, system: System, mode: str, server: Server, size: Size, durability: str
) -> tuple[dict[str, Any], Commands]:
    """Run one phase as a process of ``python``; its result line and the commands it cost."""
    cmd = [
        str(python),
        "-P",  # the drivers' folder stays off sys.path (drivers/saq.py is not the saq package)
        str(system.driver),
        mode,
        "--url", server.url,
        "--jobs", str(size.jobs),
        "--sessions", str(size.sessions),
        "--concurrency", str(size.concurrency),
        "--timeout", str(size.timeout),
        "--durability", durability,
    ]  # fmt: skip
    before = server.commands()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=size.timeout + 60
        )
    except subprocess.TimeoutExpired as e:
        raise DriverFailed(f"{system.name} {mode}: no exit within {size.timeout + 60:.0f} s") from e
    commands = server.since(before)
    result = _result(done.stdout)
    if done.returncode != 0 or result is None:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise DriverFailed(f"{system.name} {mode}: exit {done.returncode}\n{tail}")
    return result, commands


def run_system(
    python: Path, system: System, server: Server, size: Size, durability: str
) -> Outcome:
    """Both phases on a wiped server: enqueue all the jobs, then work them off."""
    server.reset()
    enqueue, enqueue_commands = run_phase(python, system, "enqueue", server, size, durability)
    work, work_commands = run_phase(python, system, "work", server, size, durability)
    return Outcome(enqueue, work, enqueue_commands, work_commands)


def run_memory(
    python: Path, system: System, server: Server, size: Size, durability: str
) -> MemoryOutcome:
    """On a wiped server: INFO memory, enqueue every job, INFO memory and every key's MEMORY
    USAGE, then the work phase (its RSS at the first start and its peak), INFO memory and
    MEMORY USAGE again (what the system keeps of jobs done); and a process that only imports
    the driver, for the RSS of the interpreter and the system's libraries."""
    server.reset()
    empty = server.memory()
    run_phase(python, system, "enqueue", server, size, durability)
    queued = server.memory()
    keys = server.key_usage()
    work, _ = run_phase(python, system, "work", server, size, durability)
    done = server.memory()
    done_keys = server.key_usage()
    imports, _ = run_phase(python, system, "imports", server, size, durability)
    return MemoryOutcome(empty, queued, done, keys, done_keys, work, imports["rss_kb"])


def run_latency(
    python: Path, system: System, server: Server, size: Size, durability: str
) -> LatencyOutcome:
    """On a wiped server, an idle worker, then up to ``size.jobs`` jobs one at a time, each
    into a session of its own, for ``size.timeout`` seconds at most."""
    server.reset()
    result, _ = run_phase(python, system, "latency", server, size, durability)
    return LatencyOutcome(result["waits_ms"], result["idle_rss_kb"])
