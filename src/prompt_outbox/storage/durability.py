"""Check that a Valkey server will keep what the outbox acknowledges.

An accept is only as durable as the server's configuration: ``appendfsync everysec`` can lose
about a second of acknowledged accepts on a crash, no persistence loses all of them on a
restart, and any eviction policy but ``noeviction`` may drop a queue to make room.
"""

from __future__ import annotations

from .store import Client, Store


class DurabilityError(RuntimeError):
    """The server could lose acknowledged accepts (strict mode refuses to start)."""


async def durability_problems(client: Client) -> list[str]:
    """Say what in the server's configuration could lose an acknowledged accept ([] = none)."""
    names = ("maxmemory-policy", "appendonly", "appendfsync", "save")
    config = await Store(client).server_config(*names)
    problems = []
    policy = config.get("maxmemory-policy", "")
    if policy != "noeviction":
        problems.append(
            f"maxmemory-policy is {policy!r}: Valkey may evict queued prompts; use noeviction"
        )
    if config.get("appendonly") != "yes":
        if config.get("save"):
            problems.append(
                "appendonly is off: a crash loses every accept since the last RDB snapshot"
            )
        else:
            problems.append("no persistence (appendonly no, save ''): a restart loses every accept")
    elif config.get("appendfsync") != "always":
        problems.append(
            f"appendfsync is {config.get('appendfsync')!r}: a crash can lose about a second of "
            "acknowledged accepts; use appendfsync always"
        )
    return problems


async def check_durability(client: Client, *, strict: bool) -> list[str]:
    """Return the problems; with ``strict``, raise DurabilityError if there are any."""
    problems = await durability_problems(client)
    if problems and strict:
        raise DurabilityError("; ".join(problems))
    return problems
