"""A clock the test moves, for the code that takes ``clock=`` (``Outbox``, the model checker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """A clock the test moves: due times and backoff become exact, not slept for."""

    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
