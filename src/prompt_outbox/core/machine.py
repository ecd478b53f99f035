"""The entry state machine: every status change an entry can go through, as pure functions.

Scripts in ``lua/`` move whole entry strings atomically; this module decides what the new
string holds. Nothing here does I/O, so the reference model of the tests can check it.

    pending --stage--> delivering --ok--> (removed, OnDelivered)
                                  --definitive--> pending (+backoff) | error (max_attempts)
                                  --ambiguous--> verifying | error (no verifier: unverifiable)
                                  --transient / prior pending--> pending | error (budget)
    verifying --Delivered--> (removed)   --Absent--> pending | error
              --Inconclusive--> verifying (+backoff) | error
    pending / verifying --park--> parked --unpark--> pending / verifying
    error --retry--> pending          error (unverifiable) --sweep--> verifying
"""

from __future__ import annotations

import enum
from dataclasses import replace
from datetime import datetime, timedelta

from .entry import Entry, Status
from .errors import AmbiguousError, PriorAttemptPendingError, TransientDeliveryError
from .settings import Tunables

# lastError prefixes: the reason an entry stopped is part of its state (sweeps select by it).
UNVERIFIABLE = "unverifiable: "
ATTEMPTS_EXHAUSTED = "attempts exhausted: "
TRANSIENT_EXHAUSTED = "transient failures exhausted: "
PARKED = "parked: "
PARKED_WHILE_VERIFYING = "parked while verifying: "


class Outcome(enum.Enum):
    """The classes of a delivery attempt's result (docs/contract.md, Delivery outcomes)."""

    DELIVERED = "delivered"
    DEFINITIVE = "definitive"
    AMBIGUOUS = "ambiguous"
    TRANSIENT = "transient"


def classify(exc: BaseException | None) -> Outcome:
    """The outcome class of what a deliverer raised; wrappers are found along ``__cause__``.

    A timeout of the delivery is ambiguous: the agent may have persisted the prompt.
    """
    seen: set[int] = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, AmbiguousError | TimeoutError):
            return Outcome.AMBIGUOUS
        if isinstance(e, TransientDeliveryError | PriorAttemptPendingError):
            return Outcome.TRANSIENT
        e = e.__cause__
    return Outcome.DELIVERED if exc is None else Outcome.DEFINITIVE


def backoff(base: float, cap: float, n: int) -> float:
    """Delay before the next try after the n-th (1-based) failure: base * 2**(n-1), capped."""
    return float(min(cap, base * 2.0 ** max(0, min(n - 1, 60))))


def describe(exc: BaseException) -> str:
    err = (
        exc.err
        if isinstance(exc, AmbiguousError | TransientDeliveryError | PriorAttemptPendingError)
        else exc
    )
    text = str(err) or type(err).__name__
    return text[:1000]


def later(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


def staged(e: Entry, now: datetime) -> Entry:
    """Picked up for a send: the staging copy records the send window's start."""
    return replace(e, status=Status.DELIVERING, last_attempt_at=now)


def after_definitive(e: Entry, exc: BaseException, now: datetime, t: Tunables) -> Entry:
    """A proven-not-delivered failure mints an attempt; error once max_attempts are spent."""
    attempts = e.attempts + 1
    if attempts >= t.max_attempts:
        return replace(
            e,
            status=Status.ERROR,
            attempts=attempts,
            next_attempt_at=None,
            last_error=ATTEMPTS_EXHAUSTED + describe(exc),
        )
    return replace(
        e,
        status=Status.PENDING,
        attempts=attempts,
        next_attempt_at=later(now, backoff(t.retry_backoff, t.max_backoff, attempts)),
        last_error=describe(exc),
    )


def after_ambiguous(
    e: Entry, exc: BaseException, now: datetime, t: Tunables, *, verifier: bool
) -> Entry:
    """Unknown outcome: verify after verify_delay; without a verifier it cannot be resolved."""
    if not verifier:
        return replace(
            e, status=Status.ERROR, next_attempt_at=None, last_error=UNVERIFIABLE + describe(exc)
        )
    return replace(
        e,
        status=Status.VERIFYING,
        verify_attempts=0,
        next_attempt_at=later(now, t.verify_delay),
        last_error=describe(exc),
    )


def after_transient(e: Entry, exc: BaseException, now: datetime, t: Tunables) -> Entry:
    """No attempt was driven: no attempt number is minted; the own budget bounds the retries."""
    fails = e.transient_fails + 1
    if fails >= t.max_transient_failures:
        return replace(
            e,
            status=Status.ERROR,
            transient_fails=fails,
            next_attempt_at=None,
            last_error=TRANSIENT_EXHAUSTED + describe(exc),
        )
    return replace(
        e,
        status=Status.PENDING,
        transient_fails=fails,
        next_attempt_at=later(now, backoff(t.retry_backoff, t.max_backoff, fails)),
        last_error=describe(exc),
    )


def after_send_failure(
    e: Entry, exc: BaseException, now: datetime, t: Tunables, *, verifier: bool
) -> Entry:
    """The state after a failed send (the staging copy ``e``), by the failure's class."""
    outcome = classify(exc)
    if outcome is Outcome.AMBIGUOUS:
        return after_ambiguous(e, exc, now, t, verifier=verifier)
    if outcome is Outcome.TRANSIENT:
        return after_transient(e, exc, now, t)
    return after_definitive(e, exc, now, t)


def after_inconclusive(e: Entry, reason: str, now: datetime, t: Tunables) -> Entry:
    """The transcript could not be read: recheck with doubling backoff, bounded."""
    passes = e.verify_attempts + 1
    if passes >= t.max_verify_attempts:
        return replace(
            e,
            status=Status.ERROR,
            verify_attempts=passes,
            next_attempt_at=None,
            last_error=f"{UNVERIFIABLE}inconclusive after {passes} verification passes: {reason}",
        )
    return replace(
        e,
        status=Status.VERIFYING,
        verify_attempts=passes,
        next_attempt_at=later(now, backoff(t.verify_backoff, t.max_verify_backoff, passes)),
        last_error=reason[:1000],
    )


def after_absent(e: Entry, now: datetime, t: Tunables) -> Entry:
    """The transcript proves the send never persisted: a definitive failure, safe to re-send."""
    return after_definitive(
        replace(e, verify_attempts=0), RuntimeError("verifier: not in the transcript"), now, t
    )


def no_verifier(e: Entry) -> Entry:
    """A verifying entry met a service with no verifier wired."""
    return replace(
        e,
        status=Status.ERROR,
        next_attempt_at=None,
        last_error=UNVERIFIABLE + "no verifier wired",
    )


def recovered(e: Entry, now: datetime, t: Tunables) -> Entry:
    """A staged entry found without a living holder: its send's outcome is unknown."""
    return replace(
        e,
        status=Status.VERIFYING,
        verify_attempts=0,
        next_attempt_at=later(now, t.verify_delay),
        last_error="recovered from staging: the interrupted send's outcome is unknown",
    )


def retried(e: Entry) -> Entry:
    """Operator retry: an error entry back to pending with a fresh budget, due now."""
    return replace(_rearmed(e, Status.PENDING), attempts=0, verify_attempts=0, transient_fails=0)


def parked(e: Entry, reason: str) -> Entry:
    """Held visibly, with why; a verifying entry remembers that it must be verified first."""
    prefix = PARKED if e.status is Status.PENDING else PARKED_WHILE_VERIFYING
    return replace(e, status=Status.PARKED, next_attempt_at=None, last_error=prefix + reason)


def unparked(e: Entry) -> Entry:
    """Back to pending, or to verifying when it was parked with its outcome unknown."""
    if e.last_error.startswith(PARKED_WHILE_VERIFYING):
        return replace(_rearmed(e, Status.VERIFYING), verify_attempts=0)
    return _rearmed(e, Status.PENDING)


def is_unverifiable(e: Entry) -> bool:
    return e.status is Status.ERROR and e.last_error.startswith(UNVERIFIABLE)


def rearmed_for_verification(e: Entry) -> Entry:
    """Sweep of an unverifiable error: a fresh verify window, due at once."""
    return replace(_rearmed(e, Status.VERIFYING), verify_attempts=0)


def is_ledger_sweepable(e: Entry) -> bool:
    """Error entries whose outcome the ledger can still settle (not proven failures)."""
    return e.status is Status.ERROR and not e.last_error.startswith(ATTEMPTS_EXHAUSTED)


def rearmed_by_ledger(e: Entry) -> Entry:
    """The ledger has no row (or a failed one) for the attempt: safe to send again."""
    return replace(_rearmed(e, Status.PENDING), verify_attempts=0, transient_fails=0)


def _rearmed(e: Entry, status: Status) -> Entry:
    """Due now, with the stop reason cleared (callers reset the counters they mean to)."""
    return replace(e, status=status, next_attempt_at=None, last_error="")


def current_attempt(e: Entry) -> int:
    """The attempt number a deliverer drives (and the ledger probe is asked about)."""
    return e.attempts + 1
