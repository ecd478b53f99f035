"""What an acknowledged accept promises on this server, decided at start.

``Tunables.accept_durability`` asks for a level: ``none`` (what the server's configuration
gives), ``fsync`` (on the primary's disk) or ``replica`` (also on a replica's disk).
``resolve_durability`` checks each primary's configuration and tries the level's wait on it
with a throwaway write, the way each accept will. A level the caller chose that the server
cannot honour refuses to start; the default steps down to what the server can do, and says
what an acknowledgement then means.

``fsync`` needs ``appendfsync always``: on ``everysec`` this Valkey's WAITAOF counts a local
fsync before it happens (measured here: 50 answers in a second with 2 fdatasync calls; the
bug Redis fixed in redis/redis#13793), so only ``always`` keeps that promise.

It also names the settings that could still lose an acknowledged accept at the level in force:
any ``maxmemory-policy`` but ``noeviction`` (Valkey may evict a queue); at ``none``, no AOF or
an ``appendfsync`` other than ``always``; at ``replica``, a primary on ``everysec`` (restarted
after a crash instead of failed over, it comes back without its last second, and its replicas
resync to it) and a replica on ``everysec`` (its fsync count reaches the primary early too:
the accept is in its memory, on its disk within a second); below ``replica``, replicas a
failover could promote without the newest accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from valkey.asyncio import SSLConnection, Valkey
from valkey.exceptions import ValkeyError

from ..core.settings import DURABILITY_LEVELS, DurabilityLevel
from .client import Client
from .replies import text
from .topology import Topology, topology_of
from .waitaof import WaitAof, probe

MEANING: dict[DurabilityLevel, str] = {
    "none": "an acknowledged accept is in Valkey's memory; what reaches the disk is up to the "
    "server's appendfsync",
    "fsync": "an acknowledged accept is fsynced to the primary's AOF",
    "replica": "an acknowledged accept is on at least one replica that writes an AOF (and on "
    "disk there and on the primary where they run appendfsync always)",
}
_CONFIG = ("maxmemory-policy", "appendonly", "appendfsync", "save")


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
    """Why the level stepped down."""

    def summary(self) -> str:
        """One line for the start-up log."""
        how = "chosen" if self.chosen else "the default"
        down = f", stepped down from {self.asked}" if self.level != self.asked else ""
        return f"accept_durability={self.level} ({how}{down}): {MEANING[self.level]}"


async def _configs(topology: Topology) -> dict[str, dict[str, str]]:
    """The settings that decide durability, per primary (by address)."""
    raw = await topology.config_per_primary(*_CONFIG)
    return {node: {text(k): text(v) for k, v in cfg.items()} for node, cfg in raw.items()}


async def _replicas(topology: Topology) -> dict[str, list[str]]:
    """The replicas connected to each primary (their addresses)."""
    raw = await topology.info_per_primary("replication")
    return {
        node: [
            f"{value['ip']}:{value['port']}"
            for key, value in info.items()
            if key.startswith("slave") and isinstance(value, dict) and "ip" in value
        ]
        for node, info in raw.items()
    }


async def _replica_fsync(topology: Topology, replica: str) -> str:
    """A replica's ``appendfsync``, asked of the replica itself (with the client's credentials),
    or why it could not be asked."""
    kwargs, kind = topology.connection_settings()
    # Over TLS when the client speaks it, with its CA and certificate (ssl_* options).
    tls: dict[str, Any] = {}
    if isinstance(kind, type) and issubclass(kind, SSLConnection):
        tls = {k: v for k, v in kwargs.items() if k.startswith("ssl_")} | {"ssl": True}
    host, _, port = replica.rpartition(":")
    username, password = kwargs.get("username"), kwargs.get("password")
    try:
        async with Valkey(
            host=host,
            port=int(port),
            username=username,
            password=password,
            socket_timeout=5,
            **tls,
        ) as node:
            return text((await node.config_get("appendfsync")).get("appendfsync", "?"))
    except (ValkeyError, OSError) as exc:
        return f"unknown ({exc})"


async def durability_problems(client: Client, level: DurabilityLevel = "none") -> list[str]:
    """Say what in the configuration of each primary could lose an accept acknowledged at
    ``level`` ([] = none); see the module's docstring."""
    return await _problems(topology_of(client), level)


async def _problems(topology: Topology, level: DurabilityLevel) -> list[str]:
    problems = []
    configs = await _configs(topology)
    for node, config in configs.items():
        policy, fsync = config.get("maxmemory-policy", ""), config.get("appendfsync")
        if policy != "noeviction":
            problems.append(
                f"{node}: maxmemory-policy is {policy!r}: Valkey may evict queued prompts; "
                "use noeviction"
            )
        if level == "none" and config.get("appendonly") != "yes":
            problems.append(
                f"{node}: appendonly is off: a crash loses every accept since the last RDB snapshot"
                if config.get("save")
                else f"{node}: no persistence (appendonly no, save ''): a restart loses "
                "every accept"
            )
        elif level == "none" and fsync != "always":
            problems.append(
                f"{node}: appendfsync is {fsync!r}: a crash that restarts this primary (no "
                "failover) can lose about a second of acknowledged accepts; use appendfsync "
                "always"
            )
    replicas = await _replicas(topology)
    if level != "replica":
        for node, found in replicas.items():
            if found:
                problems.append(
                    f"{node} has {len(found)} replica(s): a failover can lose acknowledged "
                    "accepts they had not received yet; use accept_durability replica"
                )
        return problems
    # At replica: WAITAOF's count is only as good as each side's fsync (see the docstring).
    for node, config in configs.items():
        if config.get("appendfsync") != "always":
            problems.append(
                f"{node}: appendfsync is {config.get('appendfsync')!r}: a crash that restarts "
                "this primary (no failover) can lose about a second of acknowledged accepts, "
                "and its replicas resync to it; use appendfsync always"
            )
    for replica in (r for found in replicas.values() for r in found):
        fsync = await _replica_fsync(topology, replica)
        if fsync != "always":
            problems.append(
                f"replica {replica}: appendfsync is {fsync}: its fsync count reaches the "
                "primary before its fsync does, so an acknowledged accept is in its memory "
                "but on its disk only within about a second (a failover keeps it; a crash of "
                "the primary and this replica together may not); use appendfsync always"
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


# What to do about a server without AOF: the server's own WAITAOF error does not say.
_AOF_FIX = (
    "set appendonly yes (and appendfsync always) on the server, or choose accept_durability "
    "none (serve: --accept-durability none)"
)


async def _shortfall(
    topology: Topology, level: DurabilityLevel, wait_for: float
) -> tuple[str, str]:
    """('', '') when every primary honours ``level`` now, else why not, and the fix when
    there is one to say (``_AOF_FIX`` when a primary has no AOF)."""
    wait = WaitAof.for_level(level, wait_for)
    if wait is None:
        return "", ""
    missing = []
    fix = ""
    if level == "fsync":
        for node, config in (await _configs(topology)).items():
            fsync = config.get("appendfsync")
            if config.get("appendonly") == "yes" and fsync != "always":
                missing.append(
                    f"{node}: appendfsync is {fsync!r}, and there WAITAOF counts a local fsync "
                    "before it happens (redis/redis#13793): use appendfsync always"
                )
    for node, seen in (await probe(topology, wait)).items():
        if seen.error and "unknown command" in seen.error.lower():
            missing.append(
                f"{node}: this server has no WAITAOF (Redis before 7.2, Valkey before 7.2: "
                "docs/deploy.md, 'Redis 7.0'), which fsync and replica wait on"
            )
        elif seen.error:
            missing.append(f"{node}: {seen.error}")
            if "appendonly" in seen.error.lower():  # "... but appendonly is disabled"
                fix = _AOF_FIX
        elif seen.local < wait.local:
            missing.append(f"{node}: AOF not fsynced within {wait.timeout_ms} ms")
        elif seen.replicas < wait.replicas:
            missing.append(f"{node}: no replica fsynced its AOF within {wait.timeout_ms} ms")
    return "; ".join(missing), fix


async def resolve_durability(
    topology: Topology, level: DurabilityLevel, *, chosen: bool, wait_for: float
) -> DurabilityReport:
    """Decide the level each accept waits for on this server (see the module's docstring).

    Raises DurabilityError when the caller ``chosen`` a level the server cannot honour. A
    probe waits up to ``wait_for`` seconds per level tried.
    """
    notes: list[str] = []
    in_force = level
    for candidate in reversed(DURABILITY_LEVELS[: DURABILITY_LEVELS.index(level) + 1]):
        in_force = candidate
        why, fix = await _shortfall(topology, candidate, wait_for)
        if not why:
            break
        then = f"; {fix}" if fix else ""
        if chosen:
            raise DurabilityError(
                f"accept_durability {candidate!r} cannot be honoured: {why}{then}"
            )
        notes.append(f"accept_durability {candidate!r} is not available ({why}){then}")
    problems = await _problems(topology, in_force)
    return DurabilityReport(level, chosen, in_force, problems, notes)
