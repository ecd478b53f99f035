"""The Lua sources: one file per transition in ``lua/``, each run behind the shared prelude."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from ..core.entry import Status
from ..core.keys import BYTES_TOTAL, COUNT_SEP, COUNT_TOTAL

NAMES = (
    "accept",
    "confirm",
    "acquire",
    "stage",
    "complete",
    "restore",
    "requeue",
    "replace",
    "edit",
    "renew",
    "release",
    "lock",
    "snapshot",
    "tally",
    "holding",
    "history",
    "entry",
    "entries",
    "seed",
    "repair",
    "prune_workspace",
    "mark",
    "unmark",
    "notified",
    "take_notices",
    "turn_end",
    "turn_check",
    "owner_claim",
    "format",
)

READS = frozenset({"snapshot", "tally", "holding", "history", "entry", "entries"})
"""Scripts that write nothing (no storage format check before them)."""

MARKED = ("accept", "replace", "seed")
"""Transitions that may make work due sooner. On a standalone server each also runs as
``<name>_marked``: the transition and its due mark in one script (``lua/marked.lua``)."""


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text()


CLAIM_MARKER_TTL_MS = 3_600_000
"""How long a claim marker lives (complete.lua): far longer than any retry of one completion."""


@dataclass(frozen=True, slots=True)
class LogBounds:
    """What the scripts are built with: each session's event log keeps at most ``length``
    events and about ``max_bytes`` bytes, for ``ttl_ms`` from its first event; a dedupe
    marker lives ``dedupe_ttl_ms``."""

    length: int = 1000
    ttl_ms: int = 86_400_000
    max_bytes: int = 1024 * 1024
    dedupe_ttl_ms: int = 86_400_000

    @property
    def markers_ttl_ms(self) -> int:
        """The longest a dedupe or claim marker lives: the width of the windows counting them."""
        return max(self.dedupe_ttl_ms, CLAIM_MARKER_TTL_MS)


def prelude(bounds: LogBounds) -> str:
    """``lib.lua`` with the event log's bounds, the markers' lifetime, the count's total
    fields, the tally's field separator and the statuses defined above it (what every
    script starts with)."""
    head = f"local EVENTS_MAXLEN, EVENTS_TTL_MS = {bounds.length}, {bounds.ttl_ms}\n"
    head += (
        f"local EVENTS_MAX_BYTES, MARKERS_TTL_MS = {bounds.max_bytes}, {bounds.markers_ttl_ms}\n"
    )
    head += f"local COUNT_TOTAL, BYTES_TOTAL = '{COUNT_TOTAL}', '{BYTES_TOTAL}'\n"
    head += f"local COUNT_SEP = '{COUNT_SEP}'\n"
    head += "local STATUSES = {" + ", ".join(f"'{s}'" for s in Status) + "}\n"
    return head + _read("lib")


def sources(bounds: LogBounds) -> dict[str, str]:
    """Every script's full source: the prelude, then its own file."""
    head = prelude(bounds)
    out = {name: head + "\n" + _read(name) for name in NAMES}
    for name in MARKED:
        # The transition's file as a function of its own KEYS and ARGV, then the mark.
        body = f"local function transition(KEYS, ARGV)\n{_read(name)}\nend\n"
        out[f"{name}_marked"] = head + "\n" + body + _read("marked")
    return out
