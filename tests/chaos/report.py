"""The chaos summary table: every scenario that ran adds a row; pytest prints it at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from .history import History, Verdict, check
from .settings import CHAOS_FAULTS

ROWS: list[tuple[str, str, Verdict]] = []


def faults(counts: Counter[str]) -> str:
    """``kill 6 | agent 414``: process kills and the agent's faults, in one short cell."""
    agent = sum(v for k, v in counts.items() if k in CHAOS_FAULTS)
    others = [f"{k} {v}" for k, v in sorted(counts.items()) if k not in CHAOS_FAULTS]
    return " | ".join([*others, f"agent {agent}"])


def add(scenario: str, faults: str, verdict: Verdict) -> None:
    ROWS.append((scenario, faults, verdict))


def judge(scenario: str, history: History) -> Verdict:
    """Check a run's history and add its row (with the faults injected) to the summary."""
    verdict = check(history)
    add(scenario, faults(history.faults), verdict)
    return verdict


def render() -> str:
    if not ROWS:
        return ""
    names = list(asdict(ROWS[0][2]))
    headers = ["scenario", "faults injected", *names]
    # None: a column the scenario does not measure (sent_in_turn, for an agent without turns).
    body = [
        [s, f, *("-" if v is None else str(v) for v in asdict(verdict).values())]
        for s, f, verdict in ROWS
    ]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    head = "  ".join(c.ljust(w) for c, w in zip(headers, widths, strict=True))
    return "\n".join([head, "  ".join("-" * w for w in widths), *lines])


CRASH_POINTS: list[tuple[str, str]] = []


def add_crash_point(point: str, outcome: str) -> None:
    CRASH_POINTS.append((point, outcome))


def render_crash_points() -> str:
    if not CRASH_POINTS:
        return ""
    width = max(len(p) for p, _ in CRASH_POINTS)
    rows = [f"{p.ljust(width)}  {o}" for p, o in CRASH_POINTS]
    return "\n".join([f"{'crash point'.ljust(width)}  outcome", "-" * (width + 16), *rows])


LINES: list[str] = []


def add_line(line: str) -> None:
    """A one-line result of a scenario that has no history to check (fuzzing, the model)."""
    LINES.append(line)


def render_lines() -> str:
    return "\n".join(LINES)
