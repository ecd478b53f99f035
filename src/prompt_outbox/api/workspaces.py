"""Workspace-wide operator routes (admin tokens only): park, unpark, sweep, cleanup."""

from __future__ import annotations

from fastapi import APIRouter

from .auth import Admin
from .errors import errors
from .models import ParkIn
from .params import OutboxDep, WorkspaceId

WORKSPACE = "/v1/workspaces/{ws}"

router = APIRouter()


@router.post(WORKSPACE + "/park", responses=errors())
async def park(ws: WorkspaceId, body: ParkIn, caller: Admin, outbox: OutboxDep) -> dict[str, int]:
    """Park every pending / verifying entry of the workspace with the reason."""
    # ParkIn and WorkspaceId declare the library's own rules: nothing left to refuse here.
    return {"parked": await outbox.park_workspace(ws, body.reason)}


@router.post(WORKSPACE + "/unpark", responses=errors())
async def unpark(ws: WorkspaceId, caller: Admin, outbox: OutboxDep) -> dict[str, int]:
    """Re-arm the workspace's parked entries."""
    return {"unparked": await outbox.unpark_workspace(ws)}


@router.post(WORKSPACE + "/sweep", responses=errors())
async def sweep(ws: WorkspaceId, caller: Admin, outbox: OutboxDep) -> dict[str, int]:
    """Re-arm unverifiable errors; settle error entries against the ledger probe, if any."""
    return {
        "unverifiable": await outbox.sweep_workspace_unverifiable(ws),
        "parkedErrors": await outbox.sweep_workspace_parked_errors(ws),
    }


@router.delete(WORKSPACE, responses=errors())
async def cleanup(ws: WorkspaceId, caller: Admin, outbox: OutboxDep) -> dict[str, int]:
    """Delete every outbox key of the workspace."""
    return {"deleted": await outbox.cleanup_workspace(ws)}
