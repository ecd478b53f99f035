"""The tunables most tests run with."""

from __future__ import annotations

from prompt_outbox import Tunables

# Small timings, so retries, verifies, parking and leases show in seconds rather than minutes.
FAST = Tunables(
    max_attempts=3,
    cap=25,
    dedupe_ttl=60.0,
    delivery_timeout=2.0,
    retry_backoff=0.05,
    max_backoff=0.2,
    verify_delay=0.05,
    verify_backoff=0.05,
    max_verify_backoff=0.2,
    max_verify_attempts=3,
    max_transient_failures=3,
    parked_sweep_interval=0.3,
    lease_ttl=1.0,
    bookkeeping_timeout=2.0,
)
