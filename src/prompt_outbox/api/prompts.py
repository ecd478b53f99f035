"""A session's routes: accept, list, retry, edit, dismiss, and its event stream.

The prompt body is parsed with the entry codec's raw-field splitter rather than pydantic, so the
caller's ``model`` JSON reaches the agent byte for byte (pydantic would re-encode it). The values
are checked by the Outbox, not here: its InvalidInput kinds become the refusals (``errors``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from ..core.callbacks import DismissResult, EditResult, RetryResult
from ..core.entry import raw_object_fields
from ..core.errors import Duplicate
from ..core.keys import CLIENT_MESSAGE_ID_PATTERN
from ..core.tracing import about, tracing
from ..core.validate import MAX_TEXT_BYTES, WhileBusy
from ..outbox import Outbox
from .answers import ONE_ENTRY, AnswersDep, charge, list_body, read_charge
from .auth import Caller, Principal
from .errors import ApiError, errors
from .limits import AcceptLimits, LimitsDep, WithinBudget
from .models import Accepted, EditedOut, EntryList, Retried
from .params import EntryId, OutboxDep, SessionId, WorkspaceId
from .sse import event_stream
from .streams import GateDep, GatedStream
from .tickets import StreamCaller

MAX_BODY_BYTES = 2 * MAX_TEXT_BYTES  # text at the limit, JSON-escaped, plus the rest
"""The accept's and the edit's body limit, enforced (413) by ``guard.RequestGuard`` before
the body is read; every other route takes ``guard.SMALL_BODY_BYTES``."""
REPLAYED = "Idempotent-Replayed"
_KEY = re.compile(CLIENT_MESSAGE_ID_PATTERN)
SESSION = "/v1/workspaces/{ws}/sessions/{ses}"

router = APIRouter()


class PromptIn(BaseModel):
    """The POST body (documentation only: the body is read raw, see the module docstring)."""

    clientMessageID: str | None = Field(
        default=None,
        pattern=CLIENT_MESSAGE_ID_PATTERN,
        description="the caller's idempotency key: 1-256 visible ASCII characters, no spaces. "
        "Required unless the Idempotency-Key header carries it; both given must be equal",
    )
    text: str = Field(
        min_length=1,
        max_length=MAX_TEXT_BYTES,
        description=f"the prompt: at most {MAX_TEXT_BYTES} bytes of UTF-8 (413 beyond)",
    )
    model: Any = Field(
        default=None, description="the agent's model selector: any JSON, kept byte for byte"
    )
    whileBusy: WhileBusy = Field(
        default="enqueue",
        description="when the session holds a prompt that is waiting or being delivered: "
        "enqueue behind it; reject (409 session_busy, nothing written); or interrupt: "
        "enqueue, and ask the deliverer to abort the turn in flight (best effort; the "
        "interrupted prompt counts as delivered if the agent kept it)",
    )


EDIT_BODY: dict[str, Any] = {
    "title": "EditIn",
    "description": "The PATCH body (documentation only: read raw, as the POST body is): a text, "
    "a model, or both",
    "type": "object",
    "properties": {
        "text": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_TEXT_BYTES,
            "description": "the new prompt text (left as it is when absent)",
        },
        "model": {
            "description": "the new model selector, any JSON kept byte for byte; null removes "
            "it (left as it is when absent)"
        },
    },
    "anyOf": [{"required": ["text"]}, {"required": ["model"]}],
}


def _session_busy() -> ApiError:
    return ApiError(409, "busy", "a delivery holds the session; try again shortly")


@router.post(
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
        200: {
            "model": Accepted,
            "description": "a replay (same key, same text and model, within dedupe_ttl): the "
            "first accept's ID",
            "headers": {
                REPLAYED: {"description": "always true on a replay", "schema": {"type": "string"}}
            },
        },
        **errors(409, 413, 429),
    },
)
async def accept_prompt(
    ws: WorkspaceId,
    ses: SessionId,
    request: Request,
    caller: Caller,
    outbox: OutboxDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="the idempotency key (draft-ietf-httpapi-idempotency-key-header), a "
            'quoted string ("...") or bare; the same rules as clientMessageID, which it may '
            "replace",
        ),
    ] = None,
) -> Response:
    """Accept a prompt for delivery (202), or answer a replay with the first accept's ID
    (200, ``Idempotent-Replayed: true``). The same key with another text or model is a 422
    ``idempotency_key_reused`` (with the first entry's ``id``), and changes nothing."""
    # ``fast.AcceptFastPath`` answers this route before FastAPI routes it; both end here.
    limits = request.app.state.accept_limits
    body = await request.body()
    return await accept_body(
        outbox, limits, ws, ses, caller, body, idempotency_key, request.headers
    )


async def accept_body(
    outbox: Outbox,
    limits: AcceptLimits,
    ws: str,
    ses: str,
    caller: Principal,
    body: bytes,
    key: str | None,
    headers: Mapping[str, str],
) -> Response:
    """The accept route once auth and the path IDs passed: the caller's rate and byte budget,
    then the body checked and accepted. ``key``: the Idempotency-Key header as sent, if any.
    ``headers``: the request's, for its trace context (W3C ``traceparent``: the accept
    span's parent)."""
    with tracing().accept(about(ws, ses), headers) as span:
        # Before the body is parsed: a flood costs a lookup per request.
        await limits.admit(caller, ws, outbox.overview)
        cmid, text, model, while_busy = _parse_prompt(
            body, None if key is None else _idempotency_key(key)
        )
        try:
            entry = await outbox.accept(
                ws, ses, caller.user_id, cmid, text, model, while_busy=while_busy
            )
        except Duplicate as dup:
            span.set("prompt_outbox.entry", dup.accepted_id)
            span.set("prompt_outbox.duplicate", True)
            return _json(200, {"id": dup.accepted_id, "duplicate": True}, {REPLAYED: "true"})
        span.set("prompt_outbox.entry", entry.id)
    # The Accepted shape (the route's response_model, for the OpenAPI), encoded here: a
    # Response skips FastAPI's validation and encoding of the answer.
    return _json(202, {"id": entry.id, "status": str(entry.status), "duplicate": False})


def _json(status: int, content: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    # json.dumps with its default separators uses the C encoder it caches: ~2 us. orjson would
    # save ~2 us of the ~350 us an accept costs the process (bench/http.py): not worth a wheel.
    return Response(json.dumps(content), status, headers, media_type="application/json")


@router.get(SESSION + "/prompts", responses={200: {"model": EntryList}, **errors(429)})
async def list_prompts(
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep, answers: AnswersDep
) -> Response:
    """The session's queue in FIFO order (docs/contract.md: list, with blockedByInFlight).
    Written an entry at a time under the answer budgets: 429 / 503 ``answers_buffer_full`` (with
    ``Retry-After``) while this token's (or this replica's) answers hold their most."""
    purse = answers.purse(caller)
    purse.admit()  # a caller at its bound costs no read
    # Charged before the entries are read, by what they take in Valkey, then exactly.
    hold = purse.take(read_charge(await outbox.overview.session_bytes(ws, ses)))
    try:
        entries = await outbox.list(ws, ses)
        hold.settle(charge(entries))
    except BaseException:
        hold.close()
        raise
    return GatedStream(list_body(entries, hold), hold.close, media_type="application/json")


@router.post(
    SESSION + "/prompts/{entry_id}/retry",
    responses=errors(404, 409, 429),
    dependencies=[WithinBudget],
)
async def retry_prompt(
    ws: WorkspaceId,
    ses: SessionId,
    entry_id: EntryId,
    caller: Caller,
    outbox: OutboxDep,
    answers: AnswersDep,
) -> Retried:
    """Re-arm an error entry: 200, 404 (no such error entry), 409 (a delivery holds it)."""
    with answers.purse(caller).take(ONE_ENTRY):  # what the action holds while it runs
        result = await outbox.retry(ws, ses, entry_id)
    if result is RetryResult.BUSY:
        raise _session_busy()
    if result is RetryResult.NOT_FOUND:
        raise ApiError(404, "not_found", f"no error entry {entry_id!r} in this session")
    return Retried(id=entry_id, status="pending")


@router.patch(
    SESSION + "/prompts/{entry_id}",
    responses={200: {"model": EditedOut}, **errors(404, 409, 413, 429)},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": EDIT_BODY}},
        }
    },
)
async def edit_prompt(
    ws: WorkspaceId,
    ses: SessionId,
    entry_id: EntryId,
    request: Request,
    caller: Caller,
    outbox: OutboxDep,
    limits: LimitsDep,
    answers: AnswersDep,
) -> EditedOut:
    """Edit a pending or error entry's text or model before it is sent: 200, 404 (absent),
    409 ``busy`` (a delivery holds the session) or ``not_editable`` (staged, verifying or
    parked). An error entry stays in error until retried. Emits the event ``edited``."""
    await limits.admit(caller, ws, outbox.overview)  # an edit writes as much as an accept
    body = await request.body()
    fields = _object_fields(body)
    text, model = fields.get("text", (None, ""))[0], fields.get("model", (None, None))[1]
    if "text" in fields and not isinstance(text, str):
        raise ApiError(422, "invalid_request", "text must be a string")
    if text is None and model is None:
        raise ApiError(422, "invalid_request", "a text or a model is required")
    with answers.purse(caller).take(ONE_ENTRY):
        result = await outbox.edit(ws, ses, entry_id, text=text, model=model)
    if result is EditResult.BUSY:
        raise _session_busy()
    if result is EditResult.NOT_EDITABLE:
        raise ApiError(409, "not_editable", f"entry {entry_id!r} is being delivered or verified")
    if result is EditResult.NOT_FOUND:
        raise ApiError(404, "not_found", f"no entry {entry_id!r} in this session")
    return EditedOut(id=entry_id)


@router.delete(SESSION + "/prompts/{entry_id}", status_code=204, responses=errors(404, 409, 429))
async def dismiss_prompt(
    ws: WorkspaceId,
    ses: SessionId,
    entry_id: EntryId,
    caller: Caller,
    outbox: OutboxDep,
    answers: AnswersDep,
) -> Response:
    """Dismiss an entry: 204, 404 (absent), 409 (a delivery holds the session)."""
    with answers.purse(caller).take(ONE_ENTRY):
        result = await outbox.dismiss(ws, ses, entry_id)
    if result is DismissResult.BUSY:
        raise _session_busy()
    if result is DismissResult.NOT_FOUND:
        raise ApiError(404, "not_found", f"no entry {entry_id!r} in this session")
    return Response(status_code=204)


@router.get(
    SESSION + "/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **errors(429)},
)
async def session_events(
    ws: WorkspaceId,
    ses: SessionId,
    request: Request,
    caller: StreamCaller,
    outbox: OutboxDep,
    gate: GateDep,
    answers: AnswersDep,
    last_event_id: Annotated[str | None, Header()] = None,
    lastEventId: Annotated[str | None, Query(description="for clients without headers")] = None,
) -> StreamingResponse:
    """SSE: ``queue.reset`` (the queue) first, then ``queue.update`` per change
    (accepted, delivering, sent, pending, verifying, error, parked, dismissed). Reconnect
    with ``Last-Event-ID`` to resume after the last event seen, with no reset if the
    capped log still holds everything since. 429 / 503 with ``Retry-After`` past the
    stream limits (per token / per process), or past the answer budgets
    (``answers_buffer_full``: the reset is charged before the stream starts). Auth: the
    bearer token, or ``?ticket=`` (a stream ticket, for a browser's EventSource)."""
    resume = last_event_id or lastEventId
    purse = answers.purse(caller)
    purse.admit()
    # The opening reset is charged before the queue is read (as a list), then exactly.
    hold = purse.take(read_charge(await outbox.overview.session_bytes(ws, ses)))
    try:
        release = gate.enter(caller)
    except BaseException:
        hold.close()
        raise
    # Surrounding whitespace is the transport's, not the ID's (a header value's padding).
    items = outbox.watch(ws, ses, None if resume is None else resume.strip())
    try:
        # The first item is read now: a bad resume point (InvalidEventId) is a 400 and a dead
        # Valkey a 503 here, not a broken stream later; a reset over the budget a 429 / 503.
        first = await anext(items)
        hold.settle(0 if first is None else charge(first))
    except BaseException:
        release()
        hold.close()
        await items.aclose()  # type: ignore[attr-defined]
        raise

    def ended() -> None:  # however it ends, even before its body started
        release()
        hold.close()

    return GatedStream(
        event_stream(first, items, request.is_disconnected, purse, hold if first else None),
        ended,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _idempotency_key(value: str) -> str:
    """The key in an Idempotency-Key header: a structured-field string (RFC 8941: quoted, \\
    and \\" escaped), or, as many clients send it, the bare value. Checked as a
    clientMessageID (400 ``invalid_idempotency_key``)."""
    key = value.strip(" \t")
    quoted = key.startswith('"')
    if quoted and len(key) >= 2 and key.endswith('"'):
        key, quoted = re.sub(r'\\([\\"])', r"\1", key[1:-1]), False
    if quoted or not _KEY.fullmatch(key):  # an unterminated string is no key
        raise ApiError(
            400,
            "invalid_idempotency_key",
            "Idempotency-Key must be 1-256 visible ASCII characters (no spaces), bare or as a "
            f"quoted string, got {value!r}",
        )
    return key


def _object_fields(body: bytes) -> dict[str, tuple[Any, str]]:
    """A JSON object body's fields: each (value, raw JSON text), or a 400 (NaN and Infinity,
    which Python's json would take, included: they are not JSON)."""
    try:
        return raw_object_fields(body.decode("utf-8"), strict=True)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "the body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not a JSON object: {exc}") from None


def _parse_prompt(body: bytes, key: str | None) -> tuple[str, str, str | None, Any]:
    """clientMessageID (or ``key``, the header's), text, the raw model JSON and whileBusy (as
    sent: the Outbox checks it) of a POST body, or a 400 / 422."""
    fields = _object_fields(body)
    # Without the field, the header's key stands in; with both, they must agree.
    cmid: object = fields.get("clientMessageID", (key,))[0]
    text: object = fields.get("text", (None,))[0]
    if not isinstance(cmid, str) or not isinstance(text, str):
        wrong = [
            n for n, v in (("clientMessageID", cmid), ("text", text)) if not isinstance(v, str)
        ]
        raise ApiError(
            422,
            "invalid_request",
            f"string field(s) required: {', '.join(wrong)}"
            + (" (or an Idempotency-Key header)" if "clientMessageID" in wrong else ""),
        )
    if key is not None and cmid != key:
        raise ApiError(
            400,
            "idempotency_key_mismatch",
            "the Idempotency-Key header and clientMessageID differ: send one, or the same in both",
        )
    model = fields.get("model")
    raw_model = None if model is None or model[0] is None else model[1]
    return cmid, text, raw_model, fields.get("whileBusy", ("enqueue",))[0]
