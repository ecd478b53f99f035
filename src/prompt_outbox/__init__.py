"""prompt-outbox: a durable outbox for prompts sent to AI-agent sessions, on Valkey.

Accept a prompt into Valkey and answer at once; a detached worker delivers it later. Killed
clients, workers, agents or Valkey never lose an accepted prompt (see the README).
"""

from .core.callbacks import (
    Aborter,
    BulkResult,
    Deliverer,
    DismissResult,
    EditResult,
    Hook,
    LedgerProbe,
    RetryResult,
    Turn,
    TurnEnd,
    TurnEnded,
    TurnState,
    TurnWatcher,
    Verdict,
    Verifier,
)
from .core.entry import Entry, Status
from .core.errors import (
    AmbiguousError,
    Duplicate,
    IdempotencyKeyReused,
    InvalidEventId,
    InvalidId,
    InvalidInput,
    NotDurable,
    OutboxFull,
    PriorAttemptPendingError,
    SessionBusy,
    StorageFull,
    TextTooLarge,
    TransientDeliveryError,
    WorkspaceBytesFull,
    WorkspaceFull,
    ambiguous,
    prior_attempt_pending,
    transient,
)
from .core.ledger import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_TURN_ENDED,
    LEDGER_STATES,
)
from .core.settings import DurabilityLevel, Tunables
from .core.turns import TurnInfo
from .outbox import Outbox
from .storage.connect import connect
from .storage.feed import FeedLimits, FellBehind, StreamEnded

__all__ = [
    "LEDGER_STATES",
    "LEDGER_STATE_ADMITTED",
    "LEDGER_STATE_FAILED",
    "LEDGER_STATE_LEDGERED",
    "LEDGER_STATE_PROMOTED",
    "LEDGER_STATE_STALLED",
    "LEDGER_STATE_TURN_ENDED",
    "Aborter",
    "AmbiguousError",
    "BulkResult",
    "Deliverer",
    "DismissResult",
    "Duplicate",
    "DurabilityLevel",
    "EditResult",
    "Entry",
    "FeedLimits",
    "FellBehind",
    "Hook",
    "IdempotencyKeyReused",
    "InvalidEventId",
    "InvalidId",
    "InvalidInput",
    "LedgerProbe",
    "NotDurable",
    "Outbox",
    "OutboxFull",
    "PriorAttemptPendingError",
    "RetryResult",
    "SessionBusy",
    "Status",
    "StorageFull",
    "StreamEnded",
    "TextTooLarge",
    "TransientDeliveryError",
    "Tunables",
    "Turn",
    "TurnEnd",
    "TurnEnded",
    "TurnInfo",
    "TurnState",
    "TurnWatcher",
    "Verdict",
    "Verifier",
    "WorkspaceBytesFull",
    "WorkspaceFull",
    "ambiguous",
    "connect",
    "prior_attempt_pending",
    "transient",
]
__version__ = "0.1.0"
