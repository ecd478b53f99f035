"""The accept route without FastAPI's per-request machinery: it is the hot path (measured
against a bare FastAPI route doing one RPUSH: docs/performance.md).

With async dependencies, FastAPI's routing, dependency solving and answer validation still
took half of serve's CPU per accept (bench/http.py: about 790 us, 370 us without them; a
bare FastAPI route doing one RPUSH takes about 270 us). ``AcceptFastPath`` is an ASGI
middleware that answers ``POST /v1/workspaces/{ws}/sessions/{ses}/prompts`` directly, in the
route's own order: the token (401 / 403), then the path IDs (400 ``invalid_id``), then the
body, through the same ``prompts.accept_body``; every refusal goes through the same
``errors.EXCEPTION_HANDLERS``. Everything else, and an app mounted under a ``root_path``, goes
on to FastAPI, whose route for it stays (and answers the same way) for the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.keys import check_id
from .auth import authenticate
from .errors import EXCEPTION_HANDLERS
from .params import PATH_IDS, route_pattern
from .prompts import SESSION, accept_body

_ACCEPT = route_pattern(SESSION + "/prompts")

Handler = Callable[[Request, Any], Coroutine[Any, Any, Response]]


def _handler(exc: Exception) -> Handler | None:
    """The refusal for ``exc``, looked up along its classes as Starlette does."""
    for cls in type(exc).__mro__:
        if cls in EXCEPTION_HANDLERS:
            return EXCEPTION_HANDLERS[cls]
    return None


class AcceptFastPath:
    """ASGI middleware: the accept route answered here, everything else passed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = (
            _ACCEPT.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if match is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._accept(request, match[1], match[2])
        except Exception as exc:
            handler = _handler(exc)
            if handler is None:
                raise  # a bug: ServerErrorMiddleware's 500, as on the route
            response = await handler(request, exc)
        await response(scope, receive, send)

    @staticmethod
    async def _accept(request: Request, ws: str, ses: str) -> Response:
        state = request.app.state
        caller = authenticate(state.tokens, request.headers.get("authorization", ""), ws)
        check_id(PATH_IDS["ws"], ws)
        check_id(PATH_IDS["ses"], ses)
        key = request.headers.get("idempotency-key")
        body = await request.body()
        outbox, limits = state.outbox, state.accept_limits
        return await accept_body(outbox, limits, ws, ses, caller, body, key, request.headers)
