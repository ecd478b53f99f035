"""Bounds on open event streams: per process and per token, each with a clear refusal.

Every open stream costs the process a follower of its shared event feed (``storage/feed.py``,
docs/design.md "Streams share connections"): no Valkey connection of its own (the process's
streams share one subscription connection per node and a bounded pool of reads), but a task,
a shard-channel subscription and a buffer of at most ``FeedLimits.max_behind`` unread events
and ``max_behind_bytes`` bytes (``max_buffered_bytes`` for all of them). These bounds cap how
many there are. Past ``per_process`` a new stream gets 503 (this replica
is full: retry later, or on another one); past ``per_token`` a 429 (this caller holds too many:
close one). Both carry ``Retry-After``. A stream gives its slot back however it ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .auth import Principal
from .errors import ApiError

RETRY_AFTER_S = "5"
DEFAULT_PER_PROCESS = 2000
DEFAULT_PER_TOKEN = 500


@dataclass(frozen=True, slots=True)
class Bounds:
    """A bound for a whole process and one for each token, whole numbers >= 1 (what
    ``StreamLimits`` and ``answers.AnswerLimits`` count, each in its own unit)."""

    per_process: int
    per_token: int

    def __post_init__(self) -> None:
        for name in ("per_process", "per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                kind = type(self).__name__
                raise ValueError(f"{kind}.{name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class StreamLimits(Bounds):
    """How many event streams one process serves, and one token may hold at once."""

    per_process: int = DEFAULT_PER_PROCESS
    per_token: int = DEFAULT_PER_TOKEN


class StreamGate:
    """Counts the open streams of one app, by caller."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self.open = 0
        self._by_caller: Counter[Principal] = Counter()

    def enter(self, caller: Principal) -> Callable[[], None]:
        """Take a slot for ``caller`` (or refuse: 503, 429); returns the idempotent release."""
        if self.open >= self.limits.per_process:
            raise ApiError(
                503,
                "too_many_streams",
                f"this replica serves {self.open} event streams, its limit: retry later",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        if self._by_caller[caller] >= self.limits.per_token:
            raise ApiError(
                429,
                "too_many_streams",
                f"this token holds {self.limits.per_token} event streams, its limit: close one",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        self.open += 1
        self._by_caller[caller] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.open -= 1
            self._by_caller[caller] -= 1
            if not self._by_caller[caller]:
                del self._by_caller[caller]

        return release


async def get_gate(request: Request) -> StreamGate:
    """The app's gate (``create_app`` puts it on ``app.state``)."""
    gate: StreamGate = request.app.state.streams
    return gate


GateDep = Annotated[StreamGate, Depends(get_gate)]


class GatedStream(StreamingResponse):
    """A StreamingResponse that releases its slot (or its hold on the answer budgets,
    ``answers.py``) however the response ends: finished, failed, or cancelled by a client
    that went away (even before the body started)."""

    def __init__(
        self, content: AsyncIterable[str | bytes], release: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
