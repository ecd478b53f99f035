"""The rates per token: a token bucket for each bearer token, in this process, for each route
that makes the process work per request (the accept and the edit share one; the turn end has
its own).

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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .errors import ApiError

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
