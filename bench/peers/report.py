"""The comparison table: one row per system and size, ours' rate against each peer's, and
whether issue 12's bar is met. Figures are ratios within one run on one server, never
absolutes (shared, noisy machines)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.peers.runner import Outcome, Size
from bench.peers.systems import OURS, System

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
        first_line = reason.strip().splitlines()[0] if reason.strip() else "?"
        first_line = first_line.replace("|", "\\|")  # a cell of a markdown table
        self._row(size, system, [first_line, *(["—"] * (len(COLUMNS) - 4))])

    def _row(self, size: Size, system: System, cells: list[str]) -> None:
        row = [str(size.sessions), str(size.jobs), system.title, *cells]
        self.rows.append(row)
        print(" | ".join(row), flush=True)

    def markdown(self) -> str:
        lines = [f"| {' | '.join(COLUMNS)} |", "|" + "---|" * len(COLUMNS)]
        lines += [f"| {' | '.join(row)} |" for row in self.rows]
        return "\n".join(lines) + "\n"
