"""Unauthenticated probes: liveness, readiness (Valkey answers), and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ..core.metrics import CONTENT_TYPE
from .errors import ERROR_WHY, ErrorBody
from .params import OutboxDep

router = APIRouter()


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
async def metrics(outbox: OutboxDep) -> Response:
    """Prometheus text: this process's counters and histograms, and entries by status."""
    body = outbox.metrics.render(await outbox.count_by_status())
    return Response(body, media_type=CONTENT_TYPE)
