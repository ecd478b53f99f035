"""The rates and byte budgets per token: a token bucket for each bearer token, in this
process, for each route that makes the process work per request (the accept and the edit
share one; the turn end has its own), and a byte budget over the workspaces a token may
write to (what they hold together in Valkey).

The per-session cap and the workspace quota bound what a token can make Valkey HOLD; this
bounds how fast it can make the process WORK (each accept is a script, an fsync and, with a
replica, a WAITAOF). Past it an accept is answered 429 ``rate_limited`` with the seconds until
the bucket holds a token again in ``Retry-After``, before its body is parsed, so a flood costs
the process a dictionary lookup per request. A replay (same key) counts like any accept.

A turn end (``api/turns.py``) is a script per request; its bucket is its own, so a client
ending turns never spends its accepts, nor the reverse. A signed end carries no token: its
signer, the webhook receiver (one secret, one signer), has one bucket for every signed end
(``SIGNER``), taken only once the signature verified, so nobody without the secret can spend it.

The buckets live in the process: with N ``serve`` replicas behind a balancer, a token may send
up to N times the rate. That is the price of no extra Valkey round trip per accept; the
quotas in Valkey (``Tunables.workspace_cap``, the memory ceiling) hold across replicas.

Each workspace has a byte budget, kept by the scripts (``Tunables.workspace_budget_share``);
a token that may write to several workspaces has one more over them together
(``TokenBudgets``): ``share`` of Valkey's memory, checked here, before an accept, an edit or a
client's retry, against the workspaces' holdings read at most once per ``interval`` per token
(a few fields a workspace). Between two reads a token may go past it by what it writes in one
interval (its accept rate's worth).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ..overview import Overview
from .auth import Caller, Principal
from .errors import FULL_RETRY_AFTER, ApiError
from .params import OutboxDep, WorkspaceId

DEFAULT_RATE = 50.0
"""Accepts (and, in a bucket apart, turn ends) per second one token may sustain: far above
what a person types, low enough that one runaway client cannot take every worker's share
(docs/security.md)."""
DEFAULT_BURST = 200
"""Accepts one token may send at once after a quiet spell (a phone flushing its outbox)."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``per_second`` requests a token may sustain, up to ``burst`` at once. 0: no limit."""

    per_second: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_second) and self.per_second >= 0):
            raise ValueError(f"RateLimit.per_second must be >= 0, got {self.per_second!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"RateLimit.burst must be a whole number >= 1, got {self.burst!r}")


SIGNER = "the webhook signer"
"""The bucket of the signed turn ends: none carries a token, and one secret signs them all."""


class Rates:
    """One token bucket per caller; ``take`` spends one request or refuses it (429).
    ``work``: what a request is, for the refusal's words ("prompts", "turn ends")."""

    def __init__(
        self, limit: RateLimit, work: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.work = work
        self._clock = clock
        # Caller (a Principal, or SIGNER) -> (tokens left, when counted). One row per token of
        # the token file (or the one --no-auth principal), and the signer: bounded by the
        # file, not by the requests.
        self._buckets: dict[Hashable, tuple[float, float]] = {}

    def take(self, caller: Hashable, who: str = "this token") -> None:
        """Spend one request of ``caller``'s bucket; ApiError 429 with Retry-After when empty.
        ``who``: the caller, as the refusal names it."""
        rate = self.limit.per_second
        if rate == 0:
            return
        now = self._clock()
        burst = float(self.limit.burst)
        left, then = self._buckets.get(caller, (burst, now))
        left = min(burst, left + (now - then) * rate)
        if left < 1.0:
            self._buckets[caller] = (left, now)
            wait = math.ceil((1.0 - left) / rate)
            raise ApiError(
                429,
                "rate_limited",
                f"{who} sends more than {rate:g} {self.work} a second (bursts of "
                f"{self.limit.burst}): retry after {wait} s",
                headers={"Retry-After": str(wait)},
            )
        self._buckets[caller] = (left - 1.0, now)


DEFAULT_TOKEN_SHARE = 0.25
"""The share of Valkey's memory one token's workspaces may hold together: with accepts
stopping for all at 0.8 (``Tunables.accept_memory_ratio``), one token leaves more than half
to the others (docs/configuration.md, "Byte budgets")."""


class TokenBudgets:
    """A byte budget for each token over its workspaces together. ``share``: of the memory the
    written workspace's node has (its maxmemory, or the machine's); ``workspace_share``: each
    workspace's own (``Tunables.workspace_budget_share``): a token whose workspaces' budgets
    cannot pass its own together is never read for it. ``interval``: how long a token's
    holdings, once read, are trusted."""

    def __init__(
        self,
        share: float,
        workspace_share: float,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"a token's budget share must be above 0 and at most 1, got {share!r}")
        self.share, self.workspace_share, self.interval = share, workspace_share, interval
        self._clock = clock
        # Principal -> (when read, bytes its workspaces held, each one's node's memory): a row
        # per token of the file.
        self._held: dict[Principal, tuple[float, int, dict[str, int]]] = {}
        self._reads: dict[Principal, asyncio.Lock] = {}

    def bounds(self, caller: Principal) -> bool:
        """Whether ``caller``'s writes are checked: not an admin's (an operator's), and its
        workspaces' own budgets could together pass its share."""
        return not caller.admin and len(caller.workspaces) * self.workspace_share > self.share

    async def check(self, caller: Principal, ws: str, overview: Overview) -> None:
        """Refuse (429 ``token_bytes_full``) a write of ``caller`` to ``ws`` while its
        workspaces hold its budget or more (of the memory of ``ws``'s node)."""
        if not self.bounds(caller):
            return
        held, memory = await self._holding(caller, overview)
        limit = int(self.share * memory.get(ws, 0))
        if limit and held >= limit:  # no limit: Valkey says nothing of its memory
            raise ApiError(
                429,
                "token_bytes_full",
                f"this token's workspaces hold {held} bytes together (queued entries, event "
                f"logs, markers), at or past its budget of {limit} ({self.share:g} of Valkey's "
                "memory): accepts, edits and retries are refused until deliveries or time "
                "free room",
                headers=FULL_RETRY_AFTER,
            )

    async def _holding(self, caller: Principal, overview: Overview) -> tuple[int, dict[str, int]]:
        """What the caller's workspaces hold together, and the memory of each one's node, as
        read at most ``interval`` ago."""
        # One read per token at a time: its writes meanwhile wait for it, then share it.
        async with self._reads.setdefault(caller, asyncio.Lock()):
            seen = self._held.get(caller)
            now = self._clock()
            if seen is not None and now - seen[0] < self.interval:
                return seen[1], seen[2]
            names = sorted(caller.workspaces)
            uses = await asyncio.gather(*(overview.budget(ws) for ws in names))
            held = sum(use.used for use in uses)
            memory = {ws: use.memory for ws, use in zip(names, uses, strict=True)}
            self._held[caller] = (now, held, memory)
            return held, memory


class AcceptLimits:
    """What a token's write (an accept, an edit, a client's retry) must pass first: its
    accept rate, then its byte budget (``TokenBudgets``)."""

    def __init__(self, rates: Rates, budgets: TokenBudgets) -> None:
        self.rates, self.budgets = rates, budgets

    async def admit(self, caller: Principal, ws: str, overview: Overview) -> None:
        """Spend one of ``caller``'s writes, or refuse it (429)."""
        self.rates.take(caller)
        await self.budgets.check(caller, ws, overview)


async def get_limits(request: Request) -> AcceptLimits:
    """The app's write limits (``create_app`` puts them on ``app.state``)."""
    limits: AcceptLimits = request.app.state.accept_limits
    return limits


LimitsDep = Annotated[AcceptLimits, Depends(get_limits)]


async def _within_budget(
    ws: WorkspaceId, caller: Caller, outbox: OutboxDep, limits: LimitsDep
) -> None:
    await limits.budgets.check(caller, ws, outbox.overview)


WithinBudget = Depends(_within_budget)
"""A route's dependency: the caller's token budget (429 ``token_bytes_full``) before it runs:
a client's retry re-arms entries, each logging its whole entry at every move."""
