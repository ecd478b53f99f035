"""The Lua sources: one file per transition in ``lua/``, each run behind the shared prelude."""

from __future__ import annotations

from importlib import resources

from ..core.entry import Status
from ..core.keys import COUNT_SEP, COUNT_TOTAL

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

MARKED = ("accept", "replace", "seed")
"""Transitions that may make work due sooner. On a standalone server each also runs as
``<name>_marked``: the transition and its due mark in one script (``lua/marked.lua``)."""


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text()


def prelude(event_log_len: int, event_log_ttl_ms: int) -> str:
    """``lib.lua`` with the event log's bounds, the count's total field, the tally's field
    separator and the statuses defined above it (what every script starts with)."""
    head = f"local EVENTS_MAXLEN, EVENTS_TTL_MS = {event_log_len}, {event_log_ttl_ms}\n"
    head += f"local COUNT_TOTAL, COUNT_SEP = '{COUNT_TOTAL}', '{COUNT_SEP}'\n"
    head += "local STATUSES = {" + ", ".join(f"'{s}'" for s in Status) + "}\n"
    return head + _read("lib")


def sources(event_log_len: int, event_log_ttl_ms: int) -> dict[str, str]:
    """Every script's full source: the prelude, then its own file."""
    head = prelude(event_log_len, event_log_ttl_ms)
    out = {name: head + "\n" + _read(name) for name in NAMES}
    for name in MARKED:
        # The transition's file as a function of its own KEYS and ARGV, then the mark.
        body = f"local function transition(KEYS, ARGV)\n{_read(name)}\nend\n"
        out[f"{name}_marked"] = head + "\n" + body + _read("marked")
    return out
