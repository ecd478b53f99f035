"""What every route takes: the path IDs (declared with the library's own pattern, so the
OpenAPI states the rule and a bad ID is refused before a handler runs) and the Outbox."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, Path, Request

from ..core.keys import ID_PATTERN, MAX_ID_LENGTH
from ..outbox import Outbox


def _id(kind: str) -> Any:
    return Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH, description=kind)


WorkspaceId = Annotated[str, _id("workspace ID")]
SessionId = Annotated[str, _id("session ID")]
EntryId = Annotated[str, _id("entry ID")]

PATH_IDS = {"ws": "workspace ID", "ses": "session ID", "entry_id": "entry ID"}
"""Path parameter -> the ID kind the library names in its InvalidId message."""


def route_pattern(template: str) -> re.Pattern[str]:
    """The paths a route template (``/v1/workspaces/{ws}``) answers, for middleware that
    looks before FastAPI routes: Starlette's ``{name}`` matches one non-empty segment, so the
    same paths reach the same handler. Each ``{name}`` is a group, in order."""
    return re.compile(re.sub(r"\{[a-z_]+\}", "([^/]+)", template))


async def get_outbox(request: Request) -> Outbox:
    """The Outbox the app serves (``create_app`` puts it on ``app.state``). ``async``: a plain
    ``def`` dependency would run in FastAPI's threadpool, a thread hop per request."""
    outbox: Outbox = request.app.state.outbox
    return outbox


OutboxDep = Annotated[Outbox, Depends(get_outbox)]
