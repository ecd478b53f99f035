"""The systems the benchmark compares, where each one's driver and pins live, and the bar ours
must clear against each (our target: at least 2x SAQ, BullMQ and streaq, 4x arq)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS = "ours"


@dataclass(frozen=True)
class System:
    name: str
    label: str
    target: float | None  # ours' jobs/s must be at least this many times the system's

    @property
    def driver(self) -> Path:
        return HERE / "drivers" / f"{self.name}.py"

    @property
    def requirements(self) -> Path | None:
        """The pinned requirements of the system's own venv; None for ours (the main .venv)."""
        return None if self.name == OURS else HERE / "requirements" / f"{self.name}.txt"

    @property
    def version(self) -> str:
        """The version the requirements pin the peer's own package to (``name==X``); ours:
        "" (the working tree: the report names its commit)."""
        if self.requirements is None:
            return ""
        text = self.requirements.read_text()
        found = re.search(rf"^{re.escape(self.name)}(\[[^\]]*\])?==(\S+)", text, re.MULTILINE)
        if found is None:
            raise ValueError(f"{self.requirements} pins no version of {self.name}")
        return found.group(2)

    @property
    def title(self) -> str:
        return f"{self.label} {self.version}".strip()


SYSTEMS = (
    System(OURS, "prompt-outbox", None),
    System("saq", "SAQ", 2.0),
    System("bullmq", "BullMQ (Python)", 2.0),
    System("streaq", "streaq", 2.0),
    System("arq", "arq", 4.0),
)


def by_names(names: list[str]) -> list[System]:
    """The systems named, in the benchmark's order (ours first: the ratios need its row).
    Unknown names raise ValueError."""
    known = [s.name for s in SYSTEMS]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown systems: {', '.join(unknown)} (known: {', '.join(known)})")
    return [s for s in SYSTEMS if s.name in names]
