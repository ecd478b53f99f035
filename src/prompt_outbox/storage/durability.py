"""What an acknowledged accept promises on this server, decided at start.

``Tunables.accept_durability`` asks for a level: ``none`` (what the server's configuration
gives), ``fsync`` (WAITAOF 1 0: on the primary's disk) or ``replica`` (WAITAOF 1 1: also on a
replica's disk). ``resolve_durability`` tries the level on every primary with a throwaway
write and a WAITAOF, the same way each accept will. A level the caller chose that the server
cannot honour (no AOF, no replica that fsyncs) refuses to start; the default steps down to
what the server can do, and says what an acknowledgement then means.

It also names the settings that could still lose an acknowledged accept at the level in force:
any ``maxmemory-policy`` but ``noeviction`` (Valkey may evict a queue); at ``none``, no AOF or
an ``appendfsync`` other than ``always``; below ``replica``, replicas a failover could promote
before they received the newest accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.settings import DURABILITY_LEVELS, DurabilityLevel
from .client import Client
from .store import Store
from .waitaof import WaitAof, probe

MEANING: dict[DurabilityLevel, str] = {
    "none": "an acknowledged accept is in Valkey's memory; what reaches the disk is up to the "
    "server's appendfsync",
    "fsync": "an acknowledged accept is fsynced to the primary's AOF",
    "replica": "an acknowledged accept is fsynced to the primary's AOF and to at least one "
    "replica's",
}


class DurabilityError(RuntimeError):
    """The server cannot keep what the outbox would acknowledge: the ``accept_durability``
    the caller chose cannot be honoured, or (strict mode) a setting could lose accepts."""


@dataclass(frozen=True, slots=True)
class DurabilityReport:
    """The level in force and what could still lose an acknowledged accept."""

    asked: DurabilityLevel
    """The level configured (``Tunables.accept_durability``)."""
    chosen: bool
    """Whether the caller set it (a default that the server cannot honour steps down)."""
    level: DurabilityLevel
    """The level each accept waits for."""
    problems: list[str] = field(default_factory=list)
    """Settings that could lose an acknowledged accept at ``level`` (strict mode refuses)."""
    notes: list[str] = field(default_factory=list)
    """Why the level stepped down, and what the level costs on this server."""

    def summary(self) -> str:
        """One line for the start-up log."""
        how = "chosen" if self.chosen else "the default"
        down = f", stepped down from {self.asked}" if self.level != self.asked else ""
        return f"accept_durability={self.level} ({how}{down}): {MEANING[self.level]}"


async def durability_problems(client: Client, level: DurabilityLevel = "none") -> list[str]:
    """Say what in the server's configuration could lose an accept acknowledged at ``level``
    ([] = none). At ``none`` the AOF settings decide; above it each accept waits for its
    fsync, and below ``replica`` a replica could be promoted without the newest accepts."""
    store = Store(client)
    config = await store.server_config("maxmemory-policy", "appendonly", "appendfsync", "save")
    problems = []
    policy = config.get("maxmemory-policy", "")
    if policy != "noeviction":
        problems.append(
            f"maxmemory-policy is {policy!r}: Valkey may evict queued prompts; use noeviction"
        )
    if level == "none":
        if config.get("appendonly") != "yes":
            if config.get("save"):
                problems.append(
                    "appendonly is off: a crash loses every accept since the last RDB snapshot"
                )
            else:
                problems.append(
                    "no persistence (appendonly no, save ''): a restart loses every accept"
                )
        elif config.get("appendfsync") != "always":
            problems.append(
                f"appendfsync is {config.get('appendfsync')!r}: a crash can lose about a second "
                "of acknowledged accepts; use appendfsync always or accept_durability fsync"
            )
    if level != "replica":
        replicas = await store.replica_count()
        if replicas:
            problems.append(
                f"the primary has {replicas} replica(s): a failover can lose acknowledged "
                "accepts they had not received yet; use accept_durability replica"
            )
    return problems


async def check_durability(
    client: Client, *, strict: bool, level: DurabilityLevel = "none"
) -> list[str]:
    """Return the problems at ``level``; with ``strict``, raise DurabilityError if any."""
    problems = await durability_problems(client, level)
    if problems and strict:
        raise DurabilityError("; ".join(problems))
    return problems


async def _shortfall(client: Client, level: DurabilityLevel, wait_for: float) -> str:
    """'' when every primary honours ``level`` now, else why not."""
    wait = WaitAof.for_level(level, wait_for)
    if wait is None:
        return ""
    missing = []
    for node, seen in (await probe(client, wait)).items():
        if seen.error:
            missing.append(f"{node}: {seen.error}")
        elif seen.local < wait.local:
            missing.append(f"{node}: AOF not fsynced within {wait.timeout_ms} ms")
        elif seen.replicas < wait.replicas:
            missing.append(f"{node}: no replica fsynced its AOF within {wait.timeout_ms} ms")
    return "; ".join(missing)


async def resolve_durability(
    client: Client, level: DurabilityLevel, *, chosen: bool, wait_for: float
) -> DurabilityReport:
    """Decide the level each accept waits for on this server (see the module's docstring).

    Raises DurabilityError when the caller ``chosen`` a level the server cannot honour. A
    probe waits up to ``wait_for`` seconds per level tried (a replica on ``appendfsync everysec``
    fsyncs within about a second).
    """
    notes: list[str] = []
    in_force = level
    for candidate in reversed(DURABILITY_LEVELS[: DURABILITY_LEVELS.index(level) + 1]):
        in_force = candidate
        why = await _shortfall(client, candidate, wait_for)
        if not why:
            break
        if chosen:
            raise DurabilityError(f"accept_durability {candidate!r} cannot be honoured: {why}")
        notes.append(f"accept_durability {candidate!r} is not available ({why})")
    if in_force != "none":
        fsync = (await Store(client).server_config("appendfsync")).get("appendfsync")
        if fsync != "always" and in_force == "fsync":
            notes.append(
                f"appendfsync is {fsync!r}: each accept waits for the primary's next fsync "
                "(up to about a second); appendfsync always answers at once"
            )
    problems = await durability_problems(client, in_force)
    return DurabilityReport(level, chosen, in_force, problems, notes)
