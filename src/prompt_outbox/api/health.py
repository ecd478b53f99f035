"""Unauthenticated probes: liveness, readiness (Valkey answers), and Prometheus metrics.

``/metrics`` costs O(1) in the data held: the process's counters, and the gauges from the last
count (entries by status, the oldest pending entry, the sessions in turn). Counting reads the
totals the transitions keep, a few fields a workspace (O(workspaces), never an entry), and
still runs at most once per
``EntryCounts.interval`` whatever the scrape rate: a scrape that finds the count older than
that recounts (one at a time; the scrapes meanwhile get the last count), and an attacker who
scrapes in a loop costs one count per interval, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Generic, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ..core.metrics import CONTENT_TYPE, FleetCounts
from ..storage.store import TRANSIENT_ERRORS
from .errors import ERROR_WHY, ErrorBody
from .params import OutboxDep

log = logging.getLogger("prompt_outbox.api")

DEFAULT_COUNT_INTERVAL = 30.0
"""Seconds between two counts of the entries by status (the gauge is at most this old)."""

router = APIRouter()
T = TypeVar("T")


class EntryCounts(Generic[T]):
    """The gauges' numbers, recounted at most once per ``interval`` seconds (0: never
    counted, no gauge). ``count`` is ``Outbox.overview.fleet_counts``, O(workspaces)."""

    def __init__(
        self,
        count: Callable[[], Awaitable[T]],
        interval: float = DEFAULT_COUNT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval >= 0:
            raise ValueError(f"the count interval must be >= 0 seconds, got {interval!r}")
        self.interval = interval
        self._count = count
        self._clock = clock
        self.latest: T | None = None
        """The last count, or None before the first."""
        self.counted_at = 0.0
        """When the last count was taken (wall clock, seconds since the epoch)."""
        self._taken = -float("inf")  # the monotonic clock's reading at the last count
        self._running: asyncio.Future[None] | None = None

    async def get(self) -> T | None:
        """The last count; a new one first when it is ``interval`` old. Only the first ever
        waits for its count; later scrapes get the last one while a single recount runs."""
        if not self.interval or self._clock() - self._taken < self.interval:
            return self.latest
        if self._running is None:
            self._running = asyncio.ensure_future(self._recount())
        if self.latest is None:
            await asyncio.shield(self._running)
        return self.latest

    async def _recount(self) -> None:
        try:
            self.latest = await self._count()
            self._taken, self.counted_at = self._clock(), time.time()
        except Exception as exc:  # the last count stays; a later scrape tries again
            if self.latest is None:
                raise  # the first scrape waits for it: its refusal (503) says why
            level = logging.WARNING if isinstance(exc, TRANSIENT_ERRORS) else logging.ERROR
            log.log(level, "counting the entries for /metrics failed: %r", exc)
        finally:
            self._running = None


async def get_counts(request: Request) -> EntryCounts[FleetCounts]:
    """The app's entry counts (``create_app`` puts them on ``app.state``)."""
    counts: EntryCounts[FleetCounts] = request.app.state.entry_counts
    return counts


CountsDep = Annotated[EntryCounts[FleetCounts], Depends(get_counts)]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorBody, "description": ERROR_WHY[503]}})
async def readyz(outbox: OutboxDep) -> dict[str, str]:
    """Valkey answers (503 otherwise, through the storage handler)."""
    await outbox.ping()
    return {"status": "ready"}


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(outbox: OutboxDep, counts: CountsDep) -> Response:
    """Prometheus text: this process's counters and histograms, its process metrics, and the
    entries by status, the oldest pending entry and the sessions in turn as last counted (at
    most ``--metrics-count-interval`` seconds ago)."""
    body = outbox.metrics.render(await counts.get(), counts.counted_at)
    return Response(body, media_type=CONTENT_TYPE)
