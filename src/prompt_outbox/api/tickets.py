"""Stream tickets: how a browser opens an event stream when auth is on.

``EventSource`` cannot send an ``Authorization`` header, and a long-lived token must not go in
a URL (access logs, browser history, Referer). So a page asks for a ticket with its token
(``POST /v1/workspaces/{ws}/events/ticket``) and opens ``.../events?ticket=...``. A ticket
names the workspace, the token it was minted with (by a hash, never the token) and its
expiry, signed with HMAC-SHA256 under ``TokenTable.ticket_key``: stateless, so any replica
that reads the same token file takes it, with no Valkey key per ticket. It opens streams of
any session of that workspace until it expires (``TICKET_TTL_S``); a stream opened in time
stays open. It counts against its token's stream limit, and stops working once its token
leaves the token file.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from .auth import Caller, Principal, TokenTable, bearer, principal, token_id
from .errors import ApiError, errors
from .params import WorkspaceId

TICKET_TTL_S = 60
"""How long a ticket can open streams: long enough for a page to open one (and its client to
reopen it after a drop), short enough that a leaked URL is soon worth nothing."""

router = APIRouter()


class Ticket(BaseModel):
    ticket: str
    expiresIn: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, payload.encode(), "sha256").digest()[:18])


def mint(tokens: TokenTable, token: str, ws: str, now: float) -> str:
    """A ticket for streams of ``ws``, on behalf of ``token`` (checked by the caller)."""
    body = json.dumps({"w": ws, "t": token_id(token), "e": int((now + TICKET_TTL_S) * 1000)})
    payload = _b64(body.encode())
    return f"{payload}.{_sign(tokens.ticket_key, payload)}"


def check(tokens: TokenTable, ticket: str, ws: str, now: float) -> Principal:
    """The Principal a ticket speaks for on ``ws``, or the refusal: 401 (not a ticket of ours,
    expired, its token gone), 403 (another workspace's)."""
    payload, _, signature = ticket.partition(".")
    if not hmac.compare_digest(signature.encode(), _sign(tokens.ticket_key, payload).encode()):
        raise ApiError(401, "unauthorized", "not a valid stream ticket")
    try:
        claims = json.loads(_unb64(payload))
        found = tokens.by_id(str(claims["t"]))
        expires_ms, workspace = int(claims["e"]), str(claims["w"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ApiError(401, "unauthorized", "not a valid stream ticket") from None
    if expires_ms <= now * 1000:
        raise ApiError(401, "unauthorized", "the stream ticket has expired: mint another")
    if found is None:
        raise ApiError(401, "unauthorized", "the stream ticket's token is no longer valid")
    if workspace != ws or not found.may_use(ws):
        raise ApiError(403, "forbidden", f"this ticket may not open streams of {ws!r}")
    return found


async def stream_principal(
    request: Request,
    ticket: Annotated[
        str | None,
        Query(description="a stream ticket (POST .../events/ticket), for clients without headers"),
    ] = None,
) -> Principal:
    """The events route's caller: from ``?ticket=`` when given, else the bearer token."""
    if ticket is None:
        return await principal(request)
    return check(request.app.state.tokens, ticket, request.path_params.get("ws", ""), time.time())


StreamCaller = Annotated[Principal, Depends(stream_principal)]


@router.post("/v1/workspaces/{ws}/events/ticket", status_code=201, responses=errors())
async def mint_ticket(ws: WorkspaceId, request: Request, caller: Caller) -> Ticket:
    """A short-lived ticket (``expiresIn`` seconds) that opens event streams of this
    workspace as ``?ticket=``: for a browser's EventSource, which cannot send a token."""
    token = bearer(request.headers.get("authorization", ""))
    ticket = mint(request.app.state.tokens, token, ws, time.time())
    return Ticket(ticket=ticket, expiresIn=TICKET_TTL_S)
