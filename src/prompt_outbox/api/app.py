"""The HTTP API. Errors are JSON ``{"error": code, "detail": ...}``; nothing is half-written.

The prompt body is parsed with the entry codec's raw-field splitter rather than pydantic, so the
caller's ``model`` JSON reaches the agent byte for byte (pydantic would re-encode it).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from .. import __version__
from ..core.callbacks import DismissResult, RetryResult
from ..core.entry import raw_object_fields
from ..core.errors import Duplicate, OutboxFull
from ..core.events import parse_event_id
from ..core.keys import CLIENT_MESSAGE_ID_PATTERN, ID_PATTERN, check_id
from ..core.metrics import CONTENT_TYPE
from ..core.validate import MAX_REASON, MAX_TEXT_BYTES, MAX_USER_ID, VISIBLE_CHARACTER
from ..outbox import Outbox
from .auth import Principal, TokenTable
from .sse import event_stream

MAX_BODY_BYTES = 2 * MAX_TEXT_BYTES  # text at the limit, JSON-escaped, plus the rest
SESSION = "/v1/workspaces/{ws}/sessions/{ses}"


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


WorkspaceId = Annotated[str, Path(pattern=ID_PATTERN, description="workspace ID")]
SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="session ID")]
EntryId = Annotated[str, Path(pattern=ID_PATTERN, description="entry ID")]
_PATH_IDS = {"ws": "workspace ID", "ses": "session ID", "entry_id": "entry ID"}


class PromptIn(BaseModel):
    """The POST body (documentation only: the body is read raw, see the module docstring)."""

    clientMessageID: str = Field(
        pattern=CLIENT_MESSAGE_ID_PATTERN,
        description="the caller's dedupe key: 1-256 visible ASCII characters, no spaces",
    )
    text: str = Field(
        min_length=1,
        max_length=MAX_TEXT_BYTES,
        description=f"the prompt: at most {MAX_TEXT_BYTES} bytes of UTF-8 (413 beyond)",
    )
    model: Any = Field(
        default=None, description="the agent's model selector: any JSON, kept byte for byte"
    )


class Accepted(BaseModel):
    id: str
    status: str | None = None
    duplicate: bool = False


class EntryOut(BaseModel):
    """One listed entry: the seed's field names. Optional fields are omitted, never null."""

    id: str
    clientMessageID: str
    userID: str = Field(max_length=MAX_USER_ID)
    text: str
    model: Any = None
    acceptedAt: datetime
    attempts: int
    lastAttemptAt: datetime | None = None
    verifyAttempts: int | None = None
    transientFails: int | None = None
    nextAttemptAt: datetime | None = None
    lastError: str | None = None
    status: Literal["pending", "delivering", "verifying", "error", "parked"]
    blockedByInFlight: bool | None = None
    inFlightFor: int | None = Field(default=None, description="nanoseconds the lock is held")


class EntryList(BaseModel):
    entries: list[EntryOut]


class Retried(BaseModel):
    id: str
    status: Literal["pending"]


class ErrorBody(BaseModel):
    """Every refusal: a stable code and a human-readable detail."""

    error: str = Field(description="a stable code, e.g. invalid_id, outbox_full, busy")
    detail: Any = Field(description="what is wrong, for a person")


_ERROR_WHY = {
    400: f"bad input: an ID not matching {ID_PATTERN}, a body that is not JSON, bad values",
    401: "no valid bearer token",
    403: "the token may not use this workspace (or the route needs an admin token)",
    404: "no such entry",
    409: "a delivery holds the session; try again shortly",
    413: "the body or the text is too large",
    422: "a field is missing or of the wrong type",
    429: "the session's outbox is full",
    503: "Valkey is unreachable",
}


def errors(*extra: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses for the refusals of a /v1 route: the common ones plus ``extra``."""
    codes = sorted({400, 401, 403, 422, 503, *extra})
    return {code: {"model": ErrorBody, "description": _ERROR_WHY[code]} for code in codes}


def principal(request: Request) -> Principal:
    """The caller's token, checked against the workspace in the path (401 / 403). Read from
    the raw path so that the route's declaration of ``ws`` (with its pattern) is the only one:
    auth is decided first, the ID checked after."""
    ws = request.path_params.get("ws", "")
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
    reason: str = Field(
        max_length=MAX_REASON,
        pattern=VISIBLE_CHARACTER,
        description="why, shown on each entry: at least one visible character",
    )


def _error(status: int, code: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def create_app(outbox: Outbox, tokens: TokenTable) -> FastAPI:
    """The API over ``outbox``; ``tokens`` decides who may touch which workspace."""
    # No trailing-slash redirects: an empty ID ("/prompts/") is a plain 404, not a 307.
    app = FastAPI(title="prompt-outbox", version=__version__, redirect_slashes=False)
    app.state.tokens = tokens

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            if len(loc) == 2 and loc[0] == "path" and loc[1] in _PATH_IDS:
                return _error(400, "invalid_id", _id_problem(_PATH_IDS[loc[1]], err.get("input")))
        return _error(422, "invalid_request", json.loads(json.dumps(exc.errors(), default=str)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "http_error", exc.detail)

    async def storage_down(_: Request, exc: Exception) -> JSONResponse:
        return _error(503, "storage_unavailable", f"Valkey is unreachable: {exc}")

    app.add_exception_handler(ValkeyConnectionError, storage_down)
    app.add_exception_handler(ValkeyTimeoutError, storage_down)

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
        responses={
            200: {"model": Accepted, "description": "a duplicate: the first accept's ID"},
            **errors(413, 429),
        },
    )
    async def accept_prompt(
        ws: WorkspaceId, ses: SessionId, request: Request, caller: Caller
    ) -> Any:
        """Accept a prompt for delivery (202), or name the first accept of a duplicate (200)."""
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

    @app.get(SESSION + "/prompts", responses={200: {"model": EntryList}, **errors()})
    async def list_prompts(ws: WorkspaceId, ses: SessionId, caller: Caller) -> Response:
        """The session's queue in FIFO order (the seed's List, with blockedByInFlight)."""
        entries = await outbox.list(ws, ses)
        body = '{"entries":[' + ",".join(e.to_list_json() for e in entries) + "]}"
        return Response(body, media_type="application/json")

    @app.post(SESSION + "/prompts/{entry_id}/retry", responses=errors(404, 409))
    async def retry_prompt(
        ws: WorkspaceId, ses: SessionId, entry_id: EntryId, caller: Caller
    ) -> Retried:
        """Re-arm an error entry: 200, 404 (no such error entry), 409 (a delivery holds it)."""
        result = await outbox.retry(ws, ses, entry_id)
        if result is RetryResult.BUSY:
            raise _session_busy()
        if result is RetryResult.NOT_FOUND:
            raise ApiError(404, "not_found", f"no error entry {entry_id!r} in this session")
        return Retried(id=entry_id, status="pending")

    @app.delete(SESSION + "/prompts/{entry_id}", status_code=204, responses=errors(404, 409))
    async def dismiss_prompt(
        ws: WorkspaceId, ses: SessionId, entry_id: EntryId, caller: Caller
    ) -> Response:
        """Dismiss an entry: 204, 404 (absent), 409 (a delivery holds the session)."""
        result = await outbox.dismiss(ws, ses, entry_id)
        if result is DismissResult.BUSY:
            raise _session_busy()
        if result is DismissResult.NOT_FOUND:
            raise ApiError(404, "not_found", f"no entry {entry_id!r} in this session")
        return Response(status_code=204)

    @app.get(
        SESSION + "/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}, **errors()},
    )
    async def session_events(
        ws: WorkspaceId,
        ses: SessionId,
        request: Request,
        caller: Caller,
        last_event_id: Annotated[str | None, Header()] = None,
        lastEventId: Annotated[str | None, Query(description="for clients without headers")] = None,
    ) -> StreamingResponse:
        """SSE: ``queue.reset`` (the queue) first, then ``queue.update`` per change
        (accepted, delivering, sent, pending, verifying, error, parked, dismissed). Reconnect
        with ``Last-Event-ID`` to resume after the last event seen, with no reset if the
        capped log still holds everything since."""
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

    @app.post("/v1/workspaces/{ws}/park", responses=errors())
    async def park(ws: WorkspaceId, body: ParkIn, caller: Admin) -> dict[str, int]:
        """Park every pending / verifying entry of the workspace with the reason."""
        # ParkIn and WorkspaceId declare the library's own rules: nothing left to refuse here.
        return {"parked": await outbox.park_workspace(ws, body.reason)}

    @app.post("/v1/workspaces/{ws}/unpark", responses=errors())
    async def unpark(ws: WorkspaceId, caller: Admin) -> dict[str, int]:
        """Re-arm the workspace's parked entries."""
        return {"unparked": await outbox.unpark_workspace(ws)}

    @app.post("/v1/workspaces/{ws}/sweep", responses=errors())
    async def sweep(ws: WorkspaceId, caller: Admin) -> dict[str, int]:
        """Re-arm unverifiable errors; settle error entries against the ledger probe, if any."""
        return {
            "unverifiable": await outbox.sweep_workspace_unverifiable(ws),
            "parkedErrors": await outbox.sweep_workspace_parked_errors(ws),
        }

    @app.delete("/v1/workspaces/{ws}", responses=errors())
    async def cleanup(ws: WorkspaceId, caller: Admin) -> dict[str, int]:
        """Delete every outbox key of the workspace."""
        return {"deleted": await outbox.cleanup_workspace(ws)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": ErrorBody, "description": _ERROR_WHY[503]}})
    async def readyz() -> dict[str, str]:
        """Valkey answers (503 otherwise, through the storage handler)."""
        await outbox.ping()
        return {"status": "ready"}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
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


def _id_problem(kind: str, value: Any) -> str:
    """The library's own words for a bad ID (one message, one rule: keys.ID_PATTERN)."""
    try:
        check_id(kind, value)
    except ValueError as exc:
        return str(exc)
    return f"bad {kind}: {value!r}"
