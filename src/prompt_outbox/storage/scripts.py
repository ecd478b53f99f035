"""The Lua sources: one file per transition in ``lua/``, each run behind the shared prelude."""

from __future__ import annotations

from importlib import resources

NAMES = (
    "accept",
    "confirm",
    "acquire",
    "stage",
    "complete",
    "restore",
    "requeue",
    "replace",
    "renew",
    "release",
    "lock",
    "snapshot",
    "seed",
    "repair",
    "prune_workspace",
    "mark",
    "unmark",
    "notified",
    "take_notices",
)


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text()


def prelude(event_log_len: int, event_log_ttl_ms: int) -> str:
    """``lib.lua`` with the event log's bounds defined above it (what every script starts with)."""
    return f"local EVENTS_MAXLEN, EVENTS_TTL_MS = {event_log_len}, {event_log_ttl_ms}\n" + _read(
        "lib"
    )


def sources(event_log_len: int, event_log_ttl_ms: int) -> dict[str, str]:
    """Every script's full source: the prelude, then its own file."""
    head = prelude(event_log_len, event_log_ttl_ms)
    return {name: head + "\n" + _read(name) for name in NAMES}
