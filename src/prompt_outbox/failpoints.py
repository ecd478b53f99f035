"""Named crash points, for the chaos suite's crash-point scenario.

With ``PROMPT_OUTBOX_CRASH_AT=<name>`` in its environment, a process exits at once
(``os._exit``, as abrupt as a SIGKILL: no cleanup, no finally) the first time it reaches that
point. Unset, which is always the case outside that test, a point costs one comparison.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
POINTS = (
    "after-acquire",  # the lock is held, nothing staged
    "after-stage",  # staged, the agent not called yet
    "after-deliver",  # the agent answered, nothing recorded
    "after-complete",  # claimed, OnDelivered not fired
    "after-hook",  # OnDelivered fired, its record not cleared
    "after-restore",  # the failure recorded, the lock not released
    "after-verify",  # the verdict known, nothing recorded
    "after-requeue",  # recovered to verifying, the lock not released
    "retry-before-write",  # retry read the entry, not yet rewritten
    "dismiss-before-write",  # dismiss read the entry, not yet removed
    "park-between-sessions",  # one session parked, the next not yet
    "sweep-after-probe",  # the ledger answered, nothing recorded
)
_TARGET = os.environ.get("PROMPT_OUTBOX_CRASH_AT", "")


def reached(name: str) -> None:
    """Crash here if the environment asked for this point."""
    if name == _TARGET:
        os._exit(CRASH_EXIT_CODE)
