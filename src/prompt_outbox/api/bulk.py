"""Bulk actions on a session's or a workspace's error entries (the queue page's "retry all",
"dismiss all"): any token of the workspace, as for one entry's retry and dismiss. A session a
delivery holds is skipped and named in ``busy``, never waited for."""

from __future__ import annotations

from fastapi import APIRouter

from ..core.callbacks import BulkResult
from .auth import Caller
from .errors import errors
from .limits import WithinBudget
from .models import BulkOut
from .params import OutboxDep, SessionId, WorkspaceId

router = APIRouter()

WORKSPACE_ERRORS = "/v1/workspaces/{ws}/errors"
SESSION_ERRORS = "/v1/workspaces/{ws}/sessions/{ses}/errors"


def _out(result: BulkResult) -> BulkOut:
    return BulkOut(done=result.done, busy=list(result.busy))


# 429: workspace_bytes_full, token_bytes_full
@router.post(SESSION_ERRORS + "/retry", responses=errors(429), dependencies=[WithinBudget])
async def retry_session_errors(
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep
) -> BulkOut:
    """Re-arm every error entry of the session (busy: the session, if a delivery holds it)."""
    return _out(await outbox.retry_errors(ws, ses))


@router.post(SESSION_ERRORS + "/dismiss", responses=errors())
async def dismiss_session_errors(
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep
) -> BulkOut:
    """Remove every error entry of the session."""
    return _out(await outbox.dismiss_errors(ws, ses))


@router.post(WORKSPACE_ERRORS + "/retry", responses=errors(429), dependencies=[WithinBudget])
async def retry_workspace_errors(ws: WorkspaceId, caller: Caller, outbox: OutboxDep) -> BulkOut:
    """Re-arm every error entry of every session of the workspace that no delivery holds."""
    return _out(await outbox.retry_errors(ws))


@router.post(WORKSPACE_ERRORS + "/dismiss", responses=errors())
async def dismiss_workspace_errors(ws: WorkspaceId, caller: Caller, outbox: OutboxDep) -> BulkOut:
    """Remove every error entry of every session of the workspace that no delivery holds."""
    return _out(await outbox.dismiss_errors(ws))
