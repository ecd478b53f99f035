"""The HTTP API. Errors are JSON ``{"error": code, "detail": ...}``; nothing is half-written.

The prompt body is parsed with the entry codec's raw-field splitter rather than pydantic, so the
caller's ``model`` JSON reaches the agent byte for byte (pydantic would re-encode it).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from .. import __version__
from ..callbacks import DismissResult, RetryResult
from ..entry import raw_object_fields
from ..errors import Duplicate, OutboxFull
from ..events import parse_event_id
from ..keys import check_id
from ..metrics import CONTENT_TYPE
from ..outbox import Outbox
from ..validate import MAX_TEXT_BYTES
from .auth import Principal, TokenTable
from .sse import event_stream

MAX_BODY_BYTES = 2 * MAX_TEXT_BYTES  # text at the limit, JSON-escaped, plus the rest
SESSION = "/v1/workspaces/{ws}/sessions/{ses}"


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


class PromptIn(BaseModel):
    """The POST body (documentation only: the body is read raw, see the module docstring)."""

    clientMessageID: str = Field(description="the caller's dedupe key, 1-256 characters")
    text: str = Field(description="the prompt, at most 100 KiB of UTF-8")
    model: Any = Field(default=None, description="the agent's model selector, any JSON")


class Accepted(BaseModel):
    id: str
    status: str | None = None
    duplicate: bool = False


def principal(request: Request, ws: str) -> Principal:
    """The caller's token, checked against the workspace in the path (401 / 403)."""
    tokens: TokenTable = request.app.state.tokens
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    found = tokens.lookup(token.strip() if scheme.lower() == "bearer" else "")
    if found is None:
        raise ApiError(401, "unauthorized", "a valid bearer token is required")
    if not found.may_use(ws):
        raise ApiError(403, "forbidden", f"this token may not use workspace {ws!r}")
    return found


Caller = Annotated[Principal, Depends(principal)]


def admin(caller: Caller) -> Principal:
    """Workspace-wide operator actions need an admin token (403 otherwise)."""
    if not caller.admin:
        raise ApiError(403, "forbidden", "this route needs an admin token")
    return caller


Admin = Annotated[Principal, Depends(admin)]


def _session_busy() -> ApiError:
    return ApiError(409, "busy", "a delivery holds the session; try again shortly")


class ParkIn(BaseModel):
    reason: str = Field(min_length=1, max_length=500, description="why, shown on each entry")


def _error(status: int, code: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def create_app(outbox: Outbox, tokens: TokenTable) -> FastAPI:
    """The API over ``outbox``; ``tokens`` decides who may touch which workspace."""
    app = FastAPI(title="prompt-outbox", version=__version__)
    app.state.tokens = tokens

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid_request", json.loads(json.dumps(exc.errors(), default=str)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "http_error", exc.detail)

    async def storage_down(_: Request, exc: Exception) -> JSONResponse:
        return _error(503, "storage_unavailable", f"Valkey is unreachable: {exc}")

    app.add_exception_handler(ValkeyConnectionError, storage_down)
    app.add_exception_handler(ValkeyTimeoutError, storage_down)

    def ids(ws: str, ses: str | None = None, entry_id: str | None = None) -> str:
        """400 for an ID that would break the key layout; returns the workspace ID."""
        try:
            for kind, value in (("session ID", ses), ("entry ID", entry_id)):
                if value is not None:
                    check_id(kind, value)
            return check_id("workspace ID", ws)
        except ValueError as exc:
            raise ApiError(400, "invalid_id", str(exc)) from None

    @app.post(
        SESSION + "/prompts",
        status_code=202,
        response_model=Accepted,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PromptIn.model_json_schema()}},
            }
        },
        responses={200: {"description": "a duplicate: the first accept's ID"}},
    )
    async def accept_prompt(ws: str, ses: str, request: Request, caller: Caller) -> Any:
        """Accept a prompt for delivery (202), or name the first accept of a duplicate (200)."""
        ids(ws, ses)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, "body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
        cmid, text, model = _parse_prompt(body)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise ApiError(413, "text_too_large", f"text is over {MAX_TEXT_BYTES} bytes")
        try:
            entry = await outbox.accept(ws, ses, caller.user_id, cmid, text, model)
        except Duplicate as dup:
            return JSONResponse({"id": dup.accepted_id, "duplicate": True}, status_code=200)
        except OutboxFull as full:
            raise ApiError(429, "outbox_full", str(full)) from None
        except ValueError as exc:
            raise ApiError(400, "invalid_input", str(exc)) from None
        return Accepted(id=entry.id, status=str(entry.status))

    @app.get(SESSION + "/prompts")
    async def list_prompts(ws: str, ses: str, caller: Caller) -> Response:
        """The session's queue in FIFO order (the seed's List, with blockedByInFlight)."""
        ids(ws, ses)
        entries = await outbox.list(ws, ses)
        body = '{"entries":[' + ",".join(e.to_list_json() for e in entries) + "]}"
        return Response(body, media_type="application/json")

    @app.post(SESSION + "/prompts/{entry_id}/retry")
    async def retry_prompt(ws: str, ses: str, entry_id: str, caller: Caller) -> Any:
        """Re-arm an error entry: 200, 404 (no such error entry), 409 (a delivery holds it)."""
        ids(ws, ses, entry_id)
        result = await outbox.retry(ws, ses, entry_id)
        if result is RetryResult.BUSY:
            raise _session_busy()
        if result is RetryResult.NOT_FOUND:
            raise ApiError(404, "not_found", f"no error entry {entry_id!r} in this session")
        return {"id": entry_id, "status": "pending"}

    @app.delete(SESSION + "/prompts/{entry_id}", status_code=204)
    async def dismiss_prompt(ws: str, ses: str, entry_id: str, caller: Caller) -> Response:
        """Dismiss an entry: 204, 404 (absent), 409 (a delivery holds the session)."""
        ids(ws, ses, entry_id)
        result = await outbox.dismiss(ws, ses, entry_id)
        if result is DismissResult.BUSY:
            raise _session_busy()
        if result is DismissResult.NOT_FOUND:
            raise ApiError(404, "not_found", f"no entry {entry_id!r} in this session")
        return Response(status_code=204)

    @app.get(
        SESSION + "/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def session_events(
        ws: str,
        ses: str,
        request: Request,
        caller: Caller,
        last_event_id: Annotated[str | None, Header()] = None,
        lastEventId: Annotated[str | None, Query(description="for clients without headers")] = None,
    ) -> StreamingResponse:
        """SSE: ``queue.reset`` (the queue) first, then ``queue.update`` per change
        (accepted, delivering, sent, pending, verifying, error, parked, dismissed). Reconnect
        with ``Last-Event-ID`` to resume after the last event seen, with no reset if the
        capped log still holds everything since."""
        ids(ws, ses)
        resume = last_event_id or lastEventId
        if resume is not None:
            try:
                parse_event_id(resume.strip())
            except ValueError as exc:
                raise ApiError(400, "invalid_event_id", str(exc)) from None
            resume = resume.strip()
        items = outbox.watch(ws, ses, resume)
        first = await anext(items)  # Valkey down: a 503 now, not a broken stream later
        return StreamingResponse(
            event_stream(first, items, request.is_disconnected),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/workspaces/{ws}/park")
    async def park(ws: str, body: ParkIn, caller: Admin) -> dict[str, int]:
        """Park every pending / verifying entry of the workspace with the reason."""
        try:
            return {"parked": await outbox.park_workspace(ids(ws), body.reason)}
        except ValueError as exc:
            raise ApiError(400, "invalid_input", str(exc)) from None

    @app.post("/v1/workspaces/{ws}/unpark")
    async def unpark(ws: str, caller: Admin) -> dict[str, int]:
        """Re-arm the workspace's parked entries."""
        return {"unparked": await outbox.unpark_workspace(ids(ws))}

    @app.post("/v1/workspaces/{ws}/sweep")
    async def sweep(ws: str, caller: Admin) -> dict[str, int]:
        """Re-arm unverifiable errors; settle error entries against the ledger probe, if any."""
        ws = ids(ws)
        return {
            "unverifiable": await outbox.sweep_workspace_unverifiable(ws),
            "parkedErrors": await outbox.sweep_workspace_parked_errors(ws),
        }

    @app.delete("/v1/workspaces/{ws}")
    async def cleanup(ws: str, caller: Admin) -> dict[str, int]:
        """Delete every outbox key of the workspace."""
        return {"deleted": await outbox.cleanup_workspace(ids(ws))}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        """Valkey answers (503 otherwise, through the storage handler)."""
        await outbox.ping()
        return {"status": "ready"}

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text: this process's counters and histograms, and entries by status."""
        body = outbox.metrics.render(await outbox.count_by_status())
        return Response(body, media_type=CONTENT_TYPE)

    return app


def _parse_prompt(body: bytes) -> tuple[str, str, str | None]:
    """clientMessageID, text and the raw model JSON of a POST body, or a 400 / 422."""
    try:
        fields = raw_object_fields(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "the body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not a JSON object: {exc}") from None
    wrong = [
        name
        for name in ("clientMessageID", "text")
        if not isinstance(fields.get(name, (None,))[0], str)
    ]
    if wrong:
        raise ApiError(422, "invalid_request", f"string field(s) required: {', '.join(wrong)}")
    model = fields.get("model")
    raw_model = None if model is None or model[0] is None else model[1]
    return fields["clientMessageID"][0], fields["text"][0], raw_model
