"""The end of a turn: ``POST /v1/workspaces/{ws}/sessions/{ses}/turns/{turn}/end`` (docs/design.md,
"Turns").

A deliverer that hands back a turn (a webhook receiver's 202 ``{"turn": id}``) holds the
session until the turn ends; this route ends it (``Outbox.end_turn``), and the session's next
entry is sent at once. Two callers may end one:

- a bearer token that may use the workspace (``auth.principal``, as every workspace route);
- the webhook receiver itself, by signing the end with the webhook secret
  (``core.signature.turn_end_headers``): a request that carries ``X-Prompt-Outbox-Signature``
  is judged by that signature alone, never by a token. The signed string is of its own domain
  and names the workspace, the session and the turn (a captured delivery, or an end for
  another turn, does not verify); its timestamp is within 300 s of this server's clock.

The turn ID is the path's last segment but one, percent-encoded (any printable characters, a
``/`` as ``%2F`` included): 1-200 characters, else 400 ``invalid_turn_id``. A turn the session
does not hold (an unknown ID, one that ended already: an end sent again, or one no turn can
have: a character that is not printable) is 404 ``turn_not_found``. The route reads no body
(a body sent anyway passes the guard's rules: JSON, within ``guard.SMALL_BODY_BYTES``).

Each caller's ends are rated (``limits.Rates``, 429 ``rate_limited`` with Retry-After): a
token's in a bucket of its own, apart from its accepts; the signed ends in one bucket, the
signer's (one secret, one signer). An end that names no held turn is kept for a claim to come
only while the session has a send in flight (turn_end.lua), so no caller makes a key per
session name it invents.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from starlette.convertors import Convertor, register_url_convertor

from ..core.callbacks import TURN_ID_MAX, Turn
from ..core.keys import check_id
from ..core.signature import (
    SIGNATURE_HEADER,
    TURN_END_ROUTE,
    WebhookSignatureError,
    verify_turn_end,
)
from .auth import Caller, principal
from .errors import ERROR_WHY, ApiError, ErrorBody, errors
from .limits import SIGNER, Rates
from .models import TurnEndOut, TurnOut
from .params import OutboxDep, SessionId, WorkspaceId
from .prompts import SESSION

router = APIRouter()


class _AnyText(Convertor[str]):
    """A path parameter of any characters, '/' and newline included: Starlette's ``path``
    (``.*``) stops at a newline, so a turn ID holding one missed the route (a bare 404
    ``http_error``, not the route's own answer)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("prompt_outbox_turn", _AnyText())

TurnId = Annotated[
    str,
    Path(
        description=f"the turn ID the deliverer handed back: 1-{TURN_ID_MAX} printable "
        "characters, percent-encoded (a '/' as %2F)",
        # Documented, checked by the route (400 invalid_turn_id), not by pydantic (a 422).
        json_schema_extra={"minLength": 1, "maxLength": TURN_ID_MAX},
    ),
]


def check_turn_id(turn: str) -> str:
    """``turn`` if it is a turn ID (``Turn``'s rule); 400 ``invalid_turn_id`` for a length off
    1-200, which the OpenAPI declares. An ID of that length holding a character that is not
    printable names no turn a session can hold: 404 ``turn_not_found``, as for any ID not
    held (no schema can state ``str.isprintable``, and a client the schema lets send one must
    not be told its request was malformed)."""
    try:
        return Turn(turn).id
    except ValueError as exc:
        if 0 < len(turn) <= TURN_ID_MAX:
            raise _not_held(turn) from None
        raise ApiError(400, "invalid_turn_id", str(exc)) from None


def _not_held(turn: str) -> ApiError:
    return ApiError(404, "turn_not_found", f"the session holds no turn {turn!r:.220}")


async def turn_ender(request: Request) -> None:
    """Who may end the turn: the webhook's signature when one is sent, else a token scoped to
    the workspace (401 / 403); then that caller's turn-end rate (429 ``rate_limited``: the
    token's bucket, or the signer's for every signed end), spent only once it is known, so
    a request that proves nothing spends nobody's. Reads the raw path, as
    ``auth.principal`` does."""
    rates: Rates = request.app.state.turn_end_rates
    if SIGNATURE_HEADER not in request.headers:
        rates.take(await principal(request))
        return
    params = request.path_params
    # The IDs are the caller's input, not the signature's: a bad one is a 400, said first.
    ws, ses = check_id("workspace ID", params["ws"]), check_id("session ID", params["ses"])
    turn = check_turn_id(params["turn"])
    secret: bytes | None = request.app.state.webhook_secret
    if secret is None:
        raise ApiError(
            401,
            "unauthorized",
            "this server holds no webhook secret (serve --webhook-url): a signed turn end "
            "cannot be checked; send a bearer token instead",
        )
    try:
        verify_turn_end(secret, request.headers, ws, ses, turn)
    except WebhookSignatureError as exc:
        raise ApiError(401, exc.code, str(exc)) from None
    rates.take(SIGNER, who="the webhook signer")


_RESPONSES: dict[int | str, dict[str, Any]] = {
    **errors(404),
    429: {
        "model": ErrorBody,
        "description": "rate_limited: the token (or, for a signed end, the webhook signer) "
        "ends more turns a second than its turn-end rate (Retry-After)",
    },
    401: {
        "model": ErrorBody,
        "description": ERROR_WHY[401] + "; for a signed end (X-Prompt-Outbox-Signature), "
        "missing_header / malformed_header / stale_timestamp / bad_signature, or "
        "unauthorized when the server holds no webhook secret",
    },
    404: {
        "model": ErrorBody,
        "description": "turn_not_found: the session holds no such turn (an unknown ID, a turn "
        "that ended already, or an ID no turn can have: a character that is not printable)",
    },
}


@router.post(
    # Any characters: a turn ID may hold a '/' (sent as %2F, decoded before routing).
    TURN_END_ROUTE.replace("{turn}", "{turn:prompt_outbox_turn}"),
    response_model=TurnEndOut,
    responses=_RESPONSES,
    dependencies=[Depends(turn_ender)],
)
async def end_turn(ws: WorkspaceId, ses: SessionId, turn: TurnId, outbox: OutboxDep) -> TurnEndOut:
    """End the session's turn ``turn`` (200, how long it lasted): the session's next entry is
    sent at once. 404 ``turn_not_found`` when the session holds no such turn."""
    done = await outbox.end_turn(ws, ses, check_turn_id(turn))
    if not done.ended:
        raise _not_held(turn)
    return TurnEndOut(ended=True, seconds=done.seconds)


@router.get(SESSION + "/turn", response_model=TurnOut, responses=errors(404))
async def session_turn(
    ws: WorkspaceId, ses: SessionId, caller: Caller, outbox: OutboxDep
) -> TurnOut:
    """The session's turn while it is held in one (200): the agent works on a delivered
    prompt, and the session's next entry waits for its end. 404 ``no_turn`` otherwise: what
    a page shows for a session in turn whose queue is empty."""
    found = await outbox.turn(ws, ses)
    if found is None:
        raise ApiError(404, "no_turn", "the session is not held in a turn")
    return TurnOut(turn=found.turn, entry=found.entry, seconds=found.seconds, why=found.why)
