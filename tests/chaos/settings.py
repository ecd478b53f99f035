"""Timings of the chaos runs: seconds where production has minutes, so faults resolve quickly."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from prompt_outbox import Tunables

CHAOS_TUNABLES = Tunables(
    max_attempts=8,
    delivery_timeout=5.0,
    retry_backoff=0.05,
    max_backoff=0.5,
    verify_delay=0.2,
    verify_backoff=0.1,
    max_verify_backoff=0.5,
    max_verify_attempts=60,
    max_transient_failures=200,
    lease_ttl=1.0,
    bookkeeping_timeout=10.0,
    hook_retry_after=12.0,
)
# The crash points wait for owed hooks to be made again: a shorter grace keeps them quick.
CRASH_TUNABLES = replace(CHAOS_TUNABLES, bookkeeping_timeout=1.0, hook_retry_after=1.5)
CHAOS_TUNABLES_JSON = json.dumps(asdict(CHAOS_TUNABLES))
WEBHOOK_TIMEOUT = 1.0
WORKER_SOCKET_TIMEOUT = 5.0  # a worker's Valkey command gives up after this long
AGENT_STALL = 1.5  # past the webhook timeout: an ambiguous send the agent DID record

# The agent's fates: every outcome class of the contract, recorded and not.
CHAOS_FAULTS = {
    "ok": 0.70,
    "cut_before_recording": 0.05,
    "cut_after_recording": 0.05,
    "stall_after_recording": 0.03,
    "error_503": 0.05,
    "busy_429": 0.07,
    "reject_400": 0.05,
}

# The worker-kill scenario with turns (tests/chaos/turn_agent.py): a turn nobody told the
# outbox the end of is checked with the agent every 0.3 s (production: a minute).
TURN_TUNABLES = replace(CHAOS_TUNABLES, turn_check_interval=0.3)
TURN_SECONDS = (0.05, 0.5)  # each turn's length, drawn
TURN_BY_CHECK_ONLY = 0.3  # the share of turns whose end the agent tells no one
