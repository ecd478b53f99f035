"""Named crash points, for the chaos suite's crash-point scenario.

With ``PROMPT_OUTBOX_CRASH_AT=<point>`` in its environment, a process exits at once
(``os._exit``, as abrupt as a SIGKILL: no cleanup, no finally) the first time it reaches that
point. Unset, which is always the case outside that test, ``reached`` is a function that does
nothing: the check is made once, at import.
"""

from __future__ import annotations

import os
from enum import StrEnum

CRASH_EXIT_CODE = 86


class CrashPoint(StrEnum):
    """Where a process may be told to die; the value is what the environment names."""

    AFTER_ACQUIRE = "after-acquire"  # the lock is held, nothing staged
    AFTER_STAGE = "after-stage"  # staged, the agent not called yet
    AFTER_DELIVER = "after-deliver"  # the agent answered, nothing recorded
    AFTER_COMPLETE = "after-complete"  # claimed (and the next head leased), OnDelivered not fired
    AFTER_HOOK = "after-hook"  # OnDelivered fired, its record not cleared
    AFTER_RESTORE = "after-restore"  # the failure recorded, the lock not released
    AFTER_VERIFY = "after-verify"  # the verdict known, nothing recorded
    AFTER_REQUEUE = "after-requeue"  # recovered to verifying, the lock not released
    RETRY_BEFORE_WRITE = "retry-before-write"  # retry read the entry, not yet rewritten
    DISMISS_BEFORE_WRITE = "dismiss-before-write"  # dismiss read the entry, not yet removed
    PARK_BETWEEN_SESSIONS = "park-between-sessions"  # one session parked, the next not yet
    SWEEP_AFTER_PROBE = "sweep-after-probe"  # the ledger answered, nothing recorded


_TARGET = os.environ.get("PROMPT_OUTBOX_CRASH_AT", "")


def _crash_at(point: CrashPoint) -> None:
    if point == _TARGET:
        os._exit(CRASH_EXIT_CODE)


def _nothing(point: CrashPoint) -> None:
    return None


reached = _crash_at if _TARGET else _nothing
"""``reached(point)``: crash here if the environment asked for this point."""
