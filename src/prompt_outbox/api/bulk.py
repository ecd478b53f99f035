"""Bulk actions on a session's or a workspace's error entries (the queue page's "retry all",
"dismiss all"): any token of the workspace, as for one entry's retry and dismiss. A session a
delivery holds is skipped and named in ``busy``, never waited for."""

from __future__ import annotations

from fastapi import APIRouter

from ..core.callbacks import BulkResult
from .answers import ONE_SLICE, AnswersDep
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
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep, answers: AnswersDep
) -> BulkOut:
    """Re-arm every error entry of the session (busy: the session, if a delivery holds it)."""
    with answers.purse(caller).take(ONE_SLICE):  # what it holds as it runs
        return _out(await outbox.retry_errors(ws, ses))


@router.post(SESSION_ERRORS + "/dismiss", responses=errors(429))
async def dismiss_session_errors(
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep, answers: AnswersDep
) -> BulkOut:
    """Remove every error entry of the session."""
    with answers.purse(caller).take(ONE_SLICE):  # what it holds as it runs
        return _out(await outbox.dismiss_errors(ws, ses))


@router.post(WORKSPACE_ERRORS + "/retry", responses=errors(429), dependencies=[WithinBudget])
async def retry_workspace_errors(
    ws: WorkspaceId, caller: Caller, outbox: OutboxDep, answers: AnswersDep
) -> BulkOut:
    """Re-arm every error entry of every session of the workspace that no delivery holds."""
    with answers.purse(caller).take(ONE_SLICE):
        return _out(await outbox.retry_errors(ws))


@router.post(WORKSPACE_ERRORS + "/dismiss", responses=errors(429))
async def dismiss_workspace_errors(
    ws: WorkspaceId, caller: Caller, outbox: OutboxDep, answers: AnswersDep
) -> BulkOut:
    """Remove every error entry of every session of the workspace that no delivery holds."""
    with answers.purse(caller).take(ONE_SLICE):
        return _out(await outbox.dismiss_errors(ws))
