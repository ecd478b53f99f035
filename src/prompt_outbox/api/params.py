"""What every route takes: the path IDs (declared with the library's own pattern, so the
OpenAPI states the rule and a bad ID is refused before a handler runs) and the Outbox."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from ..core.keys import ID_PATTERN
from ..outbox import Outbox

WorkspaceId = Annotated[str, Path(pattern=ID_PATTERN, description="workspace ID")]
SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="session ID")]
EntryId = Annotated[str, Path(pattern=ID_PATTERN, description="entry ID")]

PATH_IDS = {"ws": "workspace ID", "ses": "session ID", "entry_id": "entry ID"}
"""Path parameter -> the ID kind the library names in its InvalidId message."""


async def get_outbox(request: Request) -> Outbox:
    """The Outbox the app serves (``create_app`` puts it on ``app.state``). ``async``: a plain
    ``def`` dependency would run in FastAPI's threadpool, a thread hop per request."""
    outbox: Outbox = request.app.state.outbox
    return outbox


OutboxDep = Annotated[Outbox, Depends(get_outbox)]
