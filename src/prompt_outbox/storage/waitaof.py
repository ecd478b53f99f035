"""Wait until an accept is durable: ``WAITAOF`` on the connection that wrote it.

WAITAOF blocks until every earlier write *of the same connection* is fsynced to the AOF on
the primary (``numlocal``) and on ``numreplicas`` replicas, or until its timeout, and answers
the counts it reached. So the wait must ride the connection of a write that covers the
accept: ``confirm.lua`` writes the accept's dedupe marker again (same value, same expiry)
just before it. Each server's AOF and replication stream are in order, so once that write is
fsynced, the accept is too, whoever wrote it (a duplicate's first accept included).

On a standalone server no pair is needed: accept.lua itself writes a duplicate's marker
again (an accept that pushed has written anyway), and the wait rides the accept's own
pipeline (no extra round trip). A cluster client refuses scripts in a pipeline and spreads
calls over pooled connections, so there the pair is its own two-command pipeline aimed at the
node that owns the marker's slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from valkey.commands.core import AsyncScript
from valkey.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from ..core.settings import DurabilityLevel
from .replies import Confirm, Confirmation, parse, text
from .topology import Topology

_FSYNCS: dict[DurabilityLevel, tuple[int, int]] = {"fsync": (1, 0), "replica": (1, 1)}
_PAIR_ATTEMPTS = 3  # a slot that moved, a script cache emptied by a restart: then try again
_PROBE_TTL_MS = 60_000
_PROBE_KEYS = 100_000  # tags tried to find a key on each primary (16 384 slots)
_REDIRECTED = (MovedError, AskError, TryAgainError, NoScriptError)


@dataclass(frozen=True, slots=True)
class WaitAof:
    """What an acknowledged accept waits for: ``local`` fsyncs on the primary and
    ``replicas`` on replicas, for at most ``timeout_ms``. None for the level ``none``."""

    level: DurabilityLevel
    local: int
    replicas: int
    timeout_ms: int

    @classmethod
    def for_level(cls, level: DurabilityLevel, timeout: float) -> WaitAof | None:
        if level == "none":
            return None
        local, replicas = _FSYNCS[level]
        # WAITAOF's timeout 0 means "for ever": never send it.
        return cls(level, local, replicas, max(1, round(timeout * 1000)))

    def commands(self) -> list[tuple[Any, ...]]:
        """The wait. For replicas, ``WAIT`` first: it makes the primary ask its replicas for
        an acknowledgement now (REPLCONF GETACK), and a replica writes that answer after its
        own fsync of the same loop, so a replica on ``appendfsync always`` confirms in about a
        millisecond; ``WAITAOF`` alone waits for the replica's once-a-second report
        (measured: ~1 s either way). WAIT gets a quarter of the time: a replica that has not
        even received the write by then is down, and the whole wait stays within timeout."""
        if not self.replicas:
            return [("WAITAOF", self.local, 0, self.timeout_ms)]
        quarter = self.timeout_ms // 4
        return [
            ("WAIT", self.replicas, max(1, quarter)),
            ("WAITAOF", self.local, self.replicas, self.timeout_ms - quarter),
        ]

    def shortfall(self, seen: Confirmation, entry_id: str) -> str:
        """'' when ``seen`` confirms ``entry_id`` at this level, else what is missing."""
        if seen.error:
            return seen.error
        if seen.marker_id != entry_id:
            return "the entry is not on this server any more (a failover?)"
        if seen.local < self.local:
            return f"not fsynced on the primary within {self.timeout_ms} ms"
        if seen.replicas < self.replicas:
            return f"no replica fsynced it within {self.timeout_ms} ms"
        return ""


def waited(marker_id: str, answers: list[Any]) -> Confirmation:
    """What the wait's answers saw (any may be an error), after a write that left the
    marker naming ``marker_id``."""
    for answer in answers:
        if isinstance(answer, Exception):
            return Confirmation("", error=f"{type(answer).__name__}: {answer}")
    local, replicas = (int(n) for n in answers[-1])
    return Confirmation(marker_id, local, replicas)


def confirmation(answers: list[Any]) -> Confirmation:
    """The typed value of the answers to confirm.lua and the wait; any may be an error."""
    if isinstance(answers[0], Exception):
        return waited("", answers[:1])
    word, rest = parse(Confirm, answers[0])
    return waited(text(rest[0]) if word is Confirm.OK else "", answers[1:])


def redirected(answers: list[Any]) -> bool:
    """Whether a pair's write did not run (moved slot, empty script cache): send it again."""
    return bool(answers) and isinstance(answers[0], _REDIRECTED)


async def confirm(
    topology: Topology, script: AsyncScript, marker: str, wait: WaitAof
) -> Confirmation:
    """Confirm the accept that wrote ``marker`` as a pair of its own (a cluster, or a
    standalone pipeline whose pair met an empty script cache)."""
    answers: list[Any] = []
    for _ in range(_PAIR_ATTEMPTS):
        write = ("EVALSHA", script.sha, 1, marker)
        answers = await topology.on_one_connection(marker, write, *wait.commands())
        if not redirected(answers):
            break
        # Run it once through the script object: it loads the script, follows the MOVED and
        # patches the client's slot table; then the pair again (the write is idempotent).
        await script(keys=[marker])
    return confirmation(answers)


async def probe(topology: Topology, wait: WaitAof) -> dict[str, Confirmation]:
    """Can every primary honour ``wait``? A throwaway write, WAITAOF, and the write deleted,
    on each primary (the start-up check); the node's address -> what WAITAOF saw (error: no
    AOF there)."""
    targets = await topology.key_per_primary(_PROBE_KEYS)

    async def one(key: str) -> Confirmation:
        write = ("SET", key, "1", "PX", _PROBE_TTL_MS)
        answers = await topology.on_one_connection(key, write, *wait.commands(), ("DEL", key))
        errors = [answer for answer in answers if isinstance(answer, Exception)]
        if errors:
            return Confirmation("", error=str(errors[0]))
        local, replicas = (int(n) for n in answers[-2])
        return Confirmation(key, local, replicas)

    seen = await asyncio.gather(*(one(key) for key in targets.values()))
    return dict(zip(targets, seen, strict=True))
