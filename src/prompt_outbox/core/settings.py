"""Tunables: the seed's knobs (and a few of ours) in one frozen object passed to the Outbox."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

_MINUTE = 60.0
_HOUR = 60 * _MINUTE


@dataclass(frozen=True, slots=True)
class Tunables:
    """Every duration is float seconds. Defaults are the seed's; tests pass small values.

    ``lock_ttl`` 0 means "delivery_timeout + 2 min" (the seed's rule). Beyond the seed:
    ``lease_ttl`` is the short delivery-lock lease the living worker renews (a killed worker's
    session unfreezes after at most this long); ``lock_ttl`` is the hard ceiling on one hold.
    ``event_log_len`` / ``event_log_ttl`` bound each session's event log (``Outbox.watch``).
    ``hook_retry_after``: an OnDelivered owed by a worker that died after its claim is fired
    again by another worker after this long.
    """

    max_attempts: int = 5
    cap: int = 25
    dedupe_ttl: float = 24 * _HOUR
    delivery_timeout: float = 10 * _MINUTE
    retry_backoff: float = 10.0
    max_backoff: float = 2 * _MINUTE
    lock_ttl: float = 0.0
    verify_delay: float = 3.0
    verify_backoff: float = 3.0
    max_verify_backoff: float = 2 * _MINUTE
    max_verify_attempts: int = 40
    max_transient_failures: int = 20
    parked_sweep_interval: float = 60.0
    # Ours: the lease, the worker pool, and the safety nets.
    lease_ttl: float = 30.0
    concurrency: int = 64
    repair_interval: float = 5 * _MINUTE
    idle_workspace_ttl: float = _HOUR
    bookkeeping_timeout: float = 30.0
    # How long OnDelivered may take before another worker fires it again for a claim whose
    # worker vanished (killed between the claim and the hook): the hook is at-least-once.
    hook_retry_after: float = 60.0
    # The per-session event log behind SSE: its newest events, dropped after a quiet spell.
    event_log_len: int = 1000
    event_log_ttl: float = 24 * _HOUR

    def __post_init__(self) -> None:
        if self.lock_ttl == 0:
            object.__setattr__(self, "lock_ttl", self.delivery_timeout + 2 * _MINUTE)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Tunables.{f.name} must be a positive number, got {value!r}")
        if self.lock_ttl <= self.delivery_timeout:
            raise ValueError("Tunables.lock_ttl must exceed delivery_timeout")
        if self.lease_ttl > self.lock_ttl:
            raise ValueError("Tunables.lease_ttl must not exceed lock_ttl")
        if self.hook_retry_after <= self.bookkeeping_timeout:
            # Clearing a hook's record retries for bookkeeping_timeout: firing it again sooner
            # would duplicate hooks whose record is merely slow to clear.
            raise ValueError("Tunables.hook_retry_after must exceed bookkeeping_timeout")
        if self.max_backoff < self.retry_backoff or self.max_verify_backoff < self.verify_backoff:
            raise ValueError("Tunables: a max backoff must not be below its base")


def tunables_from_json(text: str) -> Tunables:
    """Tunables from a JSON object of field -> value (the CLI's ``PROMPT_OUTBOX_TUNABLES``);
    unknown fields and bad values raise ValueError."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("tunables must be a JSON object of field -> value")
    known = {f.name for f in fields(Tunables)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown tunables: {', '.join(unknown)}")
    return Tunables(**raw)
