"""Refusals: the error body, its OpenAPI declaration, and the one map from exception to status.

Every refusal is JSON ``{"error": code, "detail": ...}``. The library's own errors carry their
code (``InvalidInput.code``), so this module only picks the HTTP status; no route checks input.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from valkey.exceptions import OutOfMemoryError

from ..core.errors import (
    IdempotencyKeyReused,
    InvalidId,
    InvalidInput,
    NotDurable,
    OutboxFull,
    SessionBusy,
    StorageFormatError,
    StorageFull,
    TextTooLarge,
    WorkspaceBytesFull,
    WorkspaceFull,
)
from ..core.keys import ID_PATTERN, MAX_ID_LENGTH, check_id
from ..core.validate import check_unicode
from ..storage.store import UNAVAILABLE
from .params import PATH_IDS

log = logging.getLogger("prompt_outbox.api")


class ApiError(Exception):
    """A refusal decided by the HTTP layer itself (auth, body transport, not found, busy)."""

    def __init__(
        self, status: int, code: str, detail: Any, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers


class ErrorBody(BaseModel):
    """Every refusal: a stable code and a human-readable detail."""

    error: str = Field(description="a stable code, e.g. invalid_id, outbox_full, busy")
    detail: Any = Field(description="what is wrong, for a person")
    id: str | None = Field(
        default=None,
        description="not_durable: the entry, written but not confirmed durable (send the "
        "prompt again with the same clientMessageID); idempotency_key_reused: the entry the "
        "key was first accepted as",
    )


ERROR_WHY = {
    400: f"bad input: an ID not matching {ID_PATTERN} or over {MAX_ID_LENGTH} characters, "
    "a body that is not JSON (NaN and Infinity are not), bad values (a model holding NaN, "
    "Infinity or a number past a double's range; any string of a body holding a lone "
    "surrogate: invalid_input naming the field); "
    "for an accept, an Idempotency-Key that is not a key, or one that differs from "
    "clientMessageID; duplicate_header: Host, Origin, Content-Type, Content-Length, "
    "Transfer-Encoding, Authorization or Idempotency-Key sent twice",
    401: "no valid bearer token",
    403: "the token may not use this workspace (or the route needs an admin token); with auth "
    "off (serve --no-auth), host_not_allowed / origin_not_allowed: a Host or an Origin that "
    "is not loopback (nor a --cors-origin)",
    404: "no such entry",
    409: "busy: a delivery holds the session, try again shortly; for an edit, not_editable: "
    "the entry is being delivered or verified (or is parked); for an accept with whileBusy "
    "reject, session_busy: a prompt is waiting or being delivered, nothing written",
    413: "the body or the text is too large: body_too_large past the route's limit, judged "
    "before the body is read (and before auth)",
    415: "unsupported_media_type: a request body must be application/json",
    422: "a field is missing or of the wrong type; for an accept, idempotency_key_reused: the "
    "key was accepted for another text or model (its id), nothing written",
    429: "the session's outbox is full (or, for events, the token holds too many streams); "
    "for an accept or an edit, rate_limited: the token writes faster than its accept rate "
    "(Retry-After); "
    "outbox_full / workspace_full: the session holds cap / the workspace holds workspace_cap "
    "entries, nothing written (Retry-After); for an accept, an edit or a retry, "
    "workspace_bytes_full: the workspace is at its byte budget (its queued entries, event "
    "logs and markers: a share of Valkey's memory), and token_bytes_full: the token's "
    "workspaces together are at the token's, nothing written (Retry-After); for a list, "
    "events, or an action on entries (retry, edit, dismiss, one or many), "
    "answers_buffer_full: the token's answers and reads hold their most bytes (Retry-After)",
    503: "Valkey is unreachable (or, for events, this replica serves its most streams); for an "
    "accept, not_durable: written (its id) but not confirmed at accept_durability in time; "
    "deadline_exceeded: no answer within the request deadline (Retry-After; an accept may "
    "have been written: send it again with the same clientMessageID); storage_full: Valkey's "
    "memory is near its maxmemory, nothing written (Retry-After); for a list, events, or an "
    "action on entries, answers_buffer_full: this replica's answers and reads hold their "
    "most bytes (Retry-After); "
    "storage_format: a newer prompt-outbox wrote to this Valkey, nothing written",
}

# The status of each InvalidInput kind that is not a plain 400.
_INPUT_STATUS = {TextTooLarge.code: 413}


def errors(*extra: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses for the refusals of a /v1 route: the common ones plus ``extra``."""
    # 413 and 415: the request guard's, on any route (a body over its limit, or not JSON).
    codes = sorted({400, 401, 403, 413, 415, 422, 503, *extra})
    return {code: {"model": ErrorBody, "description": ERROR_WHY[code]} for code in codes}


def error_response(
    status: int, code: str, detail: Any, *, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON body of a refusal."""
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


async def _api_error(_: Request, exc: ApiError) -> Response:
    return error_response(exc.status, exc.code, exc.detail, headers=exc.headers)


async def _invalid_input(_: Request, exc: InvalidInput) -> Response:
    return error_response(_INPUT_STATUS.get(exc.code, 400), exc.code, str(exc))


# Seconds a client waits before sending into a full outbox again: room comes back as the
# agent takes prompts (a turn lasts seconds to minutes), so sooner would find it full still.
FULL_RETRY_AFTER = {"Retry-After": "10"}


async def _outbox_full(_: Request, exc: OutboxFull) -> Response:
    return error_response(429, "outbox_full", str(exc), headers=FULL_RETRY_AFTER)


async def _workspace_full(_: Request, exc: WorkspaceFull) -> Response:
    return error_response(429, "workspace_full", str(exc), headers=FULL_RETRY_AFTER)


def budget_retry_after(seconds: float | None) -> dict[str, str]:
    """The Retry-After of a byte budget's refusal: when time alone makes room (a window of
    the logs' or markers' lifetime passing), however long, since a client that sent again
    sooner would only be refused again; else as a full outbox (deliveries make the room)."""
    if seconds is None:
        return FULL_RETRY_AFTER
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


async def _bytes_full(_: Request, exc: WorkspaceBytesFull) -> Response:
    headers = budget_retry_after(exc.retry_after)
    return error_response(429, "workspace_bytes_full", str(exc), headers=headers)


async def _storage_full(_: Request, exc: StorageFull | OutOfMemoryError) -> Response:
    # Not the client's doing, and the server's memory figures are not the client's business.
    detail = "storage is nearly full: nothing was written; send it again later"
    return error_response(503, "storage_full", detail, headers=FULL_RETRY_AFTER)


async def _storage_format(_: Request, exc: StorageFormatError) -> Response:
    # An operator's matter (a newer version wrote to this Valkey): nothing was written.
    return error_response(503, "storage_format", str(exc))


async def _not_durable(_: Request, exc: NotDurable) -> Response:
    # The entry is written: its ID lets the client tell this from an accept that never ran.
    return JSONResponse(
        {"error": "not_durable", "id": exc.entry_id, "detail": str(exc)},
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def _key_reused(_: Request, exc: IdempotencyKeyReused) -> Response:
    # A client bug (one key, two prompts): answered, not hidden behind a duplicate's 200.
    return JSONResponse(
        {
            "error": "idempotency_key_reused",
            "id": exc.accepted_id,
            "detail": "this key was accepted (as id) for another text or model: a new prompt "
            "needs a new key",
        },
        status_code=422,
    )


async def _session_busy(_: Request, exc: SessionBusy) -> Response:
    return error_response(409, "session_busy", str(exc))


# Seconds before trying again while Valkey is away (a restart, a failover: seconds).
UNAVAILABLE_RETRY_AFTER = {"Retry-After": "2"}


async def _storage_down(_: Request, exc: Exception) -> Response:
    # The error names the server's address (and the route may be /readyz, open to anyone):
    # the operator reads it in the log, the caller learns only that it should retry.
    log.warning("Valkey is unreachable: %s", exc)
    detail = "Valkey is unreachable: retry shortly"
    return error_response(503, "storage_unavailable", detail, headers=UNAVAILABLE_RETRY_AFTER)


async def _invalid_request(_: Request, exc: RequestValidationError) -> Response:
    """A path ID off its pattern is the library's invalid_id (400), and so is a string that
    is not Unicode (a lone surrogate: ``validate.check_unicode``); anything else pydantic
    refused is a 422 with its own error list."""
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if len(loc) == 2 and loc[0] == "path" and loc[1] in PATH_IDS:
            problem = _id_problem(PATH_IDS[loc[1]], err.get("input"))
            return error_response(400, InvalidId.code, problem)
        if err.get("type") == "string_unicode":  # a lone surrogate: the library's rule, a 400
            field = ".".join(str(part) for part in loc[1:]) or "the body"
            try:
                check_unicode(field, err.get("input"))
            except InvalidInput as bad:
                return error_response(400, bad.code, str(bad))
    # What was wrong and where, never the input itself: it is the caller's own (and a NaN in
    # it would make this very answer unencodable: a 500).
    problems = [{k: err[k] for k in ("type", "loc", "msg") if k in err} for err in exc.errors()]
    return error_response(422, "invalid_request", json.loads(json.dumps(problems, default=str)))


async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
    return error_response(exc.status_code, "http_error", exc.detail)


def _id_problem(kind: str, value: Any) -> str:
    """The library's own words for a bad ID (one message, one rule: keys.ID_PATTERN)."""
    try:
        check_id(kind, value)
    except InvalidId as exc:
        return str(exc)
    return f"bad {kind}: {value!r}"


EXCEPTION_HANDLERS: dict[
    int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]
] = {
    ApiError: _api_error,
    InvalidInput: _invalid_input,  # and its kinds, by their code
    OutboxFull: _outbox_full,
    WorkspaceFull: _workspace_full,  # an OutboxFull with its own code
    WorkspaceBytesFull: _bytes_full,
    StorageFull: _storage_full,
    StorageFormatError: _storage_format,
    # Valkey past its maxmemory refused the write (noeviction): the same answer, not a 500.
    OutOfMemoryError: _storage_full,
    NotDurable: _not_durable,
    IdempotencyKeyReused: _key_reused,
    SessionBusy: _session_busy,
    **dict.fromkeys(UNAVAILABLE, _storage_down),
    RequestValidationError: _invalid_request,
    StarletteHTTPException: _http_error,
}
"""Exception -> refusal, for ``FastAPI(exception_handlers=...)``. Duplicate is no refusal: the
accept route answers it (200). Anything else is a bug, and a 500."""
