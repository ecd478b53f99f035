"""The response shapes (and the park body) the OpenAPI declares, with the library's own limits.
The prompt body's shape is ``prompts.PromptIn``, next to the raw parse it documents."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.validate import MAX_REASON, MAX_USER_ID, VISIBLE_CHARACTER


class Accepted(BaseModel):
    id: str
    status: str | None = None
    duplicate: bool = False


class EntryOut(BaseModel):
    """One listed entry, under the contract's field names (docs/contract.md). Optional fields
    are omitted, never null."""

    id: str
    clientMessageID: str
    userID: str = Field(max_length=MAX_USER_ID)
    text: str
    model: Any = None
    acceptedAt: datetime
    attempts: int
    lastAttemptAt: datetime | None = None
    verifyAttempts: int | None = None
    transientFails: int | None = None
    nextAttemptAt: datetime | None = None
    lastError: str | None = None
    status: Literal["pending", "delivering", "verifying", "error", "parked"]
    blockedByInFlight: bool | None = None
    inFlightFor: int | None = Field(default=None, description="nanoseconds the lock is held")
    inTurnFor: int | None = Field(
        default=None,
        description="nanoseconds the session has been in turn: the agent works on a delivered "
        "prompt, and this entry waits for the turn to end",
    )
    turnWhy: str | None = Field(
        default=None,
        description="why that turn is still held: the agent could not say whether it ended",
    )


class EntryList(BaseModel):
    entries: list[EntryOut]


class EditedOut(BaseModel):
    id: str
    edited: Literal[True] = True


class TurnOut(BaseModel):
    """The session's turn (``GET .../turn``): the agent works on a delivered prompt."""

    turn: str = Field(description="the turn ID the deliverer handed back")
    entry: str = Field(description="the ID of the entry delivered, whose turn it is")
    seconds: float = Field(description="how long the turn has lasted")
    why: str = Field(description="why it is still held when the agent could not say; or ''")


class TurnEndOut(BaseModel):
    """A turn ended (``POST .../turns/{turn}/end``)."""

    ended: Literal[True] = Field(description="the turn was held, and is over now")
    seconds: float = Field(description="how long the turn lasted")


class Retried(BaseModel):
    id: str
    status: Literal["pending"]


class ParkIn(BaseModel):
    # Unknown fields are refused, not ignored: a typo, or a NaN in a field nobody reads, is
    # the caller's to hear about (422), as every other body's.
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(
        max_length=MAX_REASON,
        pattern=VISIBLE_CHARACTER,
        description="why, shown on each entry: at least one visible character",
    )


class CountsOut(BaseModel):
    """Entries by status."""

    pending: int
    delivering: int
    verifying: int
    error: int
    parked: int


_NANOS = "nanoseconds, as inFlightFor"


class WorkspaceOut(BaseModel):
    id: str
    sessions: int = Field(description="sessions holding entries")
    entries: int
    counts: CountsOut
    oldestPendingFor: int | None = Field(
        default=None, description=f"how long the oldest pending entry has waited ({_NANOS})"
    )


class WorkspacePage(BaseModel):
    workspaces: list[WorkspaceOut]
    next: str | None = Field(description="the next page's cursor; null after the last page")


class SessionOut(BaseModel):
    id: str
    entries: int
    counts: CountsOut
    oldestPendingFor: int | None = Field(
        default=None, description=f"how long the oldest pending entry has waited ({_NANOS})"
    )
    deliveringFor: int | None = Field(
        default=None, description=f"how long the entry in flight has been with the agent ({_NANOS})"
    )
    blockedFor: int | None = Field(
        default=None,
        description=f"how long pending entries have waited behind a delivery's lock ({_NANOS})",
    )
    inTurnFor: int | None = Field(
        default=None,
        description="how long the session has been in turn: the agent works on a delivered "
        f"prompt, and the next entry waits for the turn to end ({_NANOS})",
    )


class SessionPage(BaseModel):
    sessions: list[SessionOut]
    next: str | None = Field(description="the next page's cursor; null after the last page")


class BulkOut(BaseModel):
    done: int = Field(description="entries changed")
    busy: list[str] = Field(description="sessions skipped: a delivery held them (try again)")


class MeOut(BaseModel):
    user: str
    admin: bool
    workspaces: list[str] = Field(description="the workspaces the token may use (admin: any)")


class MinuteOut(BaseModel):
    """One minute of a workspace's series."""

    at: str = Field(description="the minute's start, RFC 3339")
    accepted: int = Field(description="prompts accepted in the minute")
    delivered: int = Field(description="prompts claimed delivered in the minute")
    failed: int = Field(description="prompts moved into error in the minute")
    oldestPendingFor: int | None = Field(
        description=f"how long the oldest pending entry had waited at the minute's end ({_NANOS});"
        " 0 when none was pending, null when not known"
    )


class SeriesOut(BaseModel):
    minutes: list[MinuteOut] = Field(description="oldest first, the current minute last")


class BudgetOut(BaseModel):
    """What a workspace holds against its byte budget (docs/configuration.md, "Byte
    budgets"), in bytes."""

    used: int = Field(description="what counts against the budget: the three parts below")
    queued: int = Field(description="what its queued and staged entries take in Valkey")
    logs: int = Field(description="what its event logs took, in the windows still counted")
    markers: int = Field(description="what its dedupe and claim markers took, likewise")
    limit: int = Field(
        description="its budget (workspace_budget_share of its node's memory); 0: none "
        "(Valkey says nothing of its memory)"
    )


class DeliveredOut(BaseModel):
    """A delivered prompt of a session's recent history."""

    id: str = Field(description="the entry ID")
    sentAt: str = Field(description="when its send was claimed (RFC 3339, Valkey's clock)")
    turn: str | None = Field(description="the agent turn it started; null: none")
    turnFor: int | None = Field(
        description=f"how long its turn took ({_NANOS}); null while it runs or when unknown"
    )
    turnEnded: str | None = Field(
        description="why its turn ended (ended, ceiling, unreachable...); null while it runs"
    )


class HistoryOut(BaseModel):
    delivered: list[DeliveredOut] = Field(description="newest first")
