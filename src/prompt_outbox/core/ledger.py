"""The agent-side delivery ledger's state names (the agent platform's enum names, which
the contract freezes: docs/contract.md)."""

from __future__ import annotations

LEDGER_STATE_LEDGERED = "LEDGER_STATE_LEDGERED"
LEDGER_STATE_ADMITTED = "LEDGER_STATE_ADMITTED"
LEDGER_STATE_PROMOTED = "LEDGER_STATE_PROMOTED"
LEDGER_STATE_TURN_ENDED = "LEDGER_STATE_TURN_ENDED"
LEDGER_STATE_STALLED = "LEDGER_STATE_STALLED"
LEDGER_STATE_FAILED = "LEDGER_STATE_FAILED"

LEDGER_STATES: tuple[str, ...] = (
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_TURN_ENDED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_FAILED,
)

NO_LEDGER_ROW = ""
"""What a probe returns when no row exists for (entry, attempt)."""

# What the parked-error sweep concludes from a probe answer (docs/design.md, "Ledger sweep").
LEDGER_DELIVERED = frozenset({LEDGER_STATE_PROMOTED, LEDGER_STATE_TURN_ENDED})
LEDGER_NOT_DELIVERED = frozenset({NO_LEDGER_ROW, LEDGER_STATE_FAILED})
