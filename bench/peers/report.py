"""The comparison tables: throughput (one row per system and size, ours' rate against each
peer's, and whether our bar is met), memory (the server's bytes per queued job and
what holds them; the worker's RSS) and latency (a trickle into an idle worker). Figures are
read against each other within one run on one server, never as absolutes (shared, noisy
machines)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bench.peers.runner import LatencyOutcome, MemoryOutcome, Outcome, Size
from bench.peers.server import KeyKind, Memory
from bench.peers.systems import OURS, System
from bench.scale import Latency

COLUMNS = (
    "sessions",
    "jobs",
    "system",
    "enqueue/s",
    "process/s",
    "ours ÷ it",
    "target",
    "met",
    "commands/job (enqueue + work)",
    "script calls/job",
    "worker RSS",
    "order violations / overlaps",
)


@dataclass(frozen=True)
class Measured:
    """One system's figures at one size."""

    system: System
    size: Size
    enqueue_rate: float
    process_rate: float | None  # None: the worker did not finish every job in time
    done: int
    commands: tuple[float, float]  # per job: enqueue phase, work phase
    scripts: tuple[float, float]
    rss_mib: float
    order_violations: int
    overlaps: int

    @classmethod
    def of(cls, system: System, size: Size, outcome: Outcome) -> Measured:
        work, jobs = outcome.work, size.jobs
        finished = work["done"] >= jobs and not work["timed_out"] and work["seconds"] > 0
        return cls(
            system=system,
            size=size,
            enqueue_rate=jobs / max(outcome.enqueue["seconds"], 1e-9),
            process_rate=jobs / work["seconds"] if finished else None,
            done=work["done"],
            commands=(outcome.enqueue_commands.total / jobs, outcome.work_commands.total / jobs),
            scripts=(outcome.enqueue_commands.scripts / jobs, outcome.work_commands.scripts / jobs),
            rss_mib=work["rss_kb"] / 1024,
            order_violations=work["order_violations"],
            overlaps=work["overlaps"],
        )


@dataclass
class Table:
    """Rows as they come (printed at once), and the table in markdown at the end."""

    rows: list[list[str]] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)

    def _ours(self, size: Size) -> Measured | None:
        found = [m for m in self.measured if m.size == size and m.system.name == OURS]
        return found[0] if found else None

    def add(self, m: Measured) -> None:
        self.measured.append(m)
        process = f"{m.done}/{m.size.jobs} done (timed out)"
        if m.process_rate is not None:
            process = f"{m.process_rate:,.0f}"
        ratio, target, met = "—", "—", "—"
        ours = self._ours(m.size)
        if m.system.target is not None:
            target = f">= {m.system.target:g}x"
            if ours and ours.process_rate and m.process_rate:
                value = ours.process_rate / m.process_rate
                ratio = f"{value:.2f}x"
                met = "met" if value >= m.system.target else "not met"
        self._row(
            m.size,
            m.system,
            [
                f"{m.enqueue_rate:,.0f}",
                process,
                ratio,
                target,
                met,
                f"{m.commands[0]:.1f} + {m.commands[1]:.1f}",
                f"{m.scripts[0]:.1f} + {m.scripts[1]:.1f}",
                f"{m.rss_mib:.0f} MiB",
                f"{m.order_violations} / {m.overlaps}",
            ],
        )

    def add_missing(self, size: Size, system: System, reason: str) -> None:
        """A system that did not run at this size (skipped or failed): the reason, in a row."""
        self._row(size, system, [_first_line(reason), *(["—"] * (len(COLUMNS) - 4))])

    def _row(self, size: Size, system: System, cells: list[str]) -> None:
        row = [str(size.sessions), str(size.jobs), system.title, *cells]
        self.rows.append(row)
        print(" | ".join(row), flush=True)

    def markdown(self) -> str:
        lines = [f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
        lines += [f"| {' | '.join(row)} |" for row in self.rows]
        return "\n".join(lines) + "\n"


def mib(kb: float) -> str:
    return f"{kb / 1024:.1f} MiB"


@dataclass(frozen=True)
class MemoryMeasured:
    """One system's memory phase: the server's bytes per queued job, by key kind, and once
    every job is done; the worker's RSS after its imports, idle (from the latency phase, when
    it ran), at the first start with every job queued, and its peak."""

    system: System
    size: Size
    outcome: MemoryOutcome
    idle_rss_kb: int | None

    def per_job(self, value: float) -> float:
        return value / self.size.jobs

    @property
    def queued(self) -> Memory:
        return self.outcome.queued - self.outcome.empty

    @property
    def retained(self) -> Memory:
        return self.outcome.done - self.outcome.empty

    def kinds(self, least_share: float = 0.01) -> list[tuple[str, KeyKind, KeyKind]]:
        """Per key kind: its keys with every job queued, and once all are done. The kinds
        holding at least ``least_share`` of used_memory at either moment, largest (queued)
        first, then the rest summed as "(other keys)"."""
        empty = KeyKind(0, 0)
        queued, done = self.outcome.keys, self.outcome.done_keys
        whole = max(self.queued.used, self.retained.used, 1)
        rows, rest = [], []
        for kind in dict.fromkeys([*queued, *done]):  # queued's order, then kinds made later
            then, after = queued.get(kind, empty), done.get(kind, empty)
            if max(then.bytes, after.bytes) / whole >= least_share:
                rows.append((kind, then, after))
            else:
                rest.append((then, after))
        if rest:
            rows.append(("(other keys)", _summed(t for t, _ in rest), _summed(a for _, a in rest)))
        return rows

    @property
    def rss(self) -> tuple[int, int, int]:
        """The work phase's VmRSS at the first start, VmHWM at the end, and VmRSS at the end."""
        work = self.outcome.work
        return work["rss_start_kb"], work["hwm_kb"], work["rss_kb"]

    def rss_text(self) -> str:
        start, peak, _ = self.rss
        return f"start {mib(start)}, peak {mib(peak)}"


MEMORY_COLUMNS = (
    "system",
    "jobs / sessions",
    "Valkey bytes per queued job (used_memory)",
    "per queued job (used_memory_dataset)",
    "per job once all are done (used_memory)",
    "worker RSS: after imports",
    "idle worker",
    "jobs queued: at the first start",
    "peak (VmHWM)",
)
KIND_COLUMNS = (
    "system",
    "key kind",
    "keys",
    "MEMORY USAGE per queued job",
    "share of used_memory",
    "once all are done: keys",
    "MEMORY USAGE per job",
)


M = TypeVar("M")


@dataclass
class PerSystem(Generic[M]):
    """A phase's table with one row per system: rows printed as they come, and the systems
    that did not run, with why."""

    measured: list[M] = field(default_factory=list)
    missing: list[tuple[System, str]] = field(default_factory=list)

    def add(self, m: M) -> None:
        self.measured.append(m)
        print(" | ".join(self._row(m)), flush=True)

    def add_missing(self, system: System, reason: str) -> None:
        self.missing.append((system, _first_line(reason)))

    def _row(self, m: M) -> list[str]:
        raise NotImplementedError


@dataclass
class MemoryTable(PerSystem[MemoryMeasured]):
    """The memory phase: one row per system, and the breakdown of its keys by kind."""

    def _row(self, m: MemoryMeasured) -> list[str]:
        start, peak, _ = m.rss
        idle = "—" if m.idle_rss_kb is None else mib(m.idle_rss_kb)
        return [
            m.system.title,
            f"{m.size.jobs} / {m.size.sessions}",
            f"{m.per_job(m.queued.used):,.0f} B",
            f"{m.per_job(m.queued.dataset):,.0f} B",
            f"{m.per_job(m.retained.used):,.0f} B",
            mib(m.outcome.imports_rss_kb),
            idle,
            mib(start),
            mib(peak),
        ]

    def markdown(self) -> str:
        lines = _header(MEMORY_COLUMNS)
        lines += [f"| {' | '.join(self._row(m))} |" for m in self.measured]
        for system, reason in self.missing:
            cells = [system.title, reason, *(["—"] * (len(MEMORY_COLUMNS) - 2))]
            lines.append(f"| {' | '.join(cells)} |")
        lines += ["", *_header(KIND_COLUMNS)]
        for m in self.measured:
            whole = max(m.queued.used, 1)
            for kind, then, after in m.kinds():
                cells = [
                    m.system.title,
                    f"`{kind}`",
                    f"{then.keys:,}",
                    f"{m.per_job(then.bytes):,.0f} B",
                    f"{then.bytes / whole:.0%}",
                    f"{after.keys:,}",
                    f"{m.per_job(after.bytes):,.0f} B",
                ]
                lines.append(f"| {' | '.join(cells)} |")
        return "\n".join(lines) + "\n"


LATENCY_COLUMNS = ("system", "samples", "p50", "p95", "p99", "max")


@dataclass(frozen=True)
class LatencyMeasured:
    """One system's latency phase: the quantiles, the largest wait, the idle worker's RSS."""

    system: System
    latency: Latency
    largest: float
    idle_rss_kb: int

    @classmethod
    def of(cls, system: System, outcome: LatencyOutcome) -> LatencyMeasured:
        waits = outcome.waits_ms or [float("nan")]
        return cls(system, Latency.of(waits), max(waits), outcome.idle_rss_kb)

    def short(self) -> str:
        """p50 / p99 and the sample count, for the targets table's peers cell."""
        lat = self.latency
        return f"{self.system.title} {lat.p50:.1f} / {lat.p99:.1f} ms ({lat.samples})"


@dataclass
class LatencyTable(PerSystem[LatencyMeasured]):
    """The latency phase: one row per system."""

    def _row(self, m: LatencyMeasured) -> list[str]:
        lat = m.latency
        return [
            m.system.title,
            str(lat.samples),
            f"{lat.p50:.1f} ms",
            f"{lat.p95:.1f} ms",
            f"{lat.p99:.1f} ms",
            f"{m.largest:.1f} ms",
        ]

    def markdown(self) -> str:
        lines = _header(LATENCY_COLUMNS)
        lines += [f"| {' | '.join(self._row(m))} |" for m in self.measured]
        for system, reason in self.missing:
            cells = [system.title, reason, *(["—"] * (len(LATENCY_COLUMNS) - 2))]
            lines.append(f"| {' | '.join(cells)} |")
        return "\n".join(lines) + "\n"


def _summed(kinds: Iterable[KeyKind]) -> KeyKind:
    keys = list(kinds)
    return KeyKind(sum(k.keys for k in keys), sum(k.bytes for k in keys))


def _header(columns: tuple[str, ...]) -> list[str]:
    return [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]


def _first_line(reason: str) -> str:
    first = reason.strip().splitlines()[0] if reason.strip() else "?"
    return first.replace("|", "\\|")  # a cell of a markdown table
