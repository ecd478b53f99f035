"""``X-Request-ID``: the request's ID on its answer and on every log record made while it is
served (``core/logctx.py``). Pure ASGI (BaseHTTPMiddleware would buffer event streams).

A client's own ID is kept when it is 1-128 visible ASCII characters (what a header carries
and a log line can print unquoted); any other is replaced by a new one, never echoed: it
could forge log lines or fill them.
"""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.logctx import log_context

HEADER = "x-request-id"
MAX_REQUEST_ID = 128
_GOOD = re.compile(rb"[!-~]{1,%d}" % MAX_REQUEST_ID)


def request_id(given: bytes | None) -> str:
    """``given`` when it is a fit ID, otherwise a new one (32 hex digits)."""
    if given is not None and _GOOD.fullmatch(given):
        return given.decode("ascii")
    return uuid.uuid4().hex


class RequestID:
    """ASGI middleware: takes or makes the request's ID, binds it as ``request_id`` for the
    records logged while the request is served, and answers it in ``X-Request-ID``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = [v for k, v in scope["headers"] if k == HEADER.encode()]
        rid = request_id(given[0] if len(given) == 1 else None)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        with log_context(request_id=rid):
            await self.app(scope, receive, send_with_id)
