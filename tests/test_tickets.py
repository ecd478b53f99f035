"""Stream tickets (api/tickets.py): a browser's EventSource opens the event stream with a
short-lived, workspace-scoped ticket in the URL instead of a token it cannot send."""

from __future__ import annotations

import base64
import json
import time

import httpx

from prompt_outbox import Outbox
from prompt_outbox.api import TokenTable
from prompt_outbox.api.tickets import TICKET_TTL_S, mint
from tests.support.api import ALICE, TOKENS, URL
from tests.support.events import EVENTS, Sse, data

TICKET = "/v1/workspaces/acme/events/ticket"


async def test_a_ticket_opens_the_event_stream_of_its_workspace(
    http: httpx.AsyncClient, outbox: Outbox
) -> None:
    minted = await http.post(TICKET, headers=ALICE)
    assert minted.status_code == 201, minted.text
    ticket = minted.json()["ticket"]
    assert minted.json()["expiresIn"] == TICKET_TTL_S
    assert "alice-token" not in json.dumps(_claims(ticket))  # the token never goes in a URL
    for session in ("chat-1", "chat-2"):  # any session of the workspace
        events = EVENTS.replace("chat-1", session)
        async with http.stream("GET", events, params={"ticket": ticket}) as r:
            assert r.status_code == 200
            reset = await Sse(r).next()
            assert (reset["event"], data(reset)) == ("queue.reset", {"entries": []})
    other = EVENTS.replace("/acme/", "/other/")
    refused = await http.get(other, params={"ticket": ticket})
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")


async def test_a_forged_expired_or_orphaned_ticket_is_refused(http: httpx.AsyncClient) -> None:
    ticket = (await http.post(TICKET, headers=ALICE)).json()["ticket"]
    payload, _, signature = ticket.partition(".")
    forged_claims = {**_claims(ticket), "w": "acme", "e": int((time.time() + 3600) * 1000)}
    forged = _b64(json.dumps(forged_claims).encode()) + "." + signature
    expired = mint(TOKENS, "alice-token", "acme", time.time() - TICKET_TTL_S - 1)
    rotated = TokenTable.from_json('{"tokens":[{"token":"x","user":"x","workspaces":["acme"]}]}')
    orphaned = mint(rotated, "alice-token", "acme", time.time())  # signed by another table
    for bad in (forged, expired, orphaned, payload, "", "a.b", ticket + "x"):
        r = await http.get(EVENTS, params={"ticket": bad})
        assert (r.status_code, r.json()["error"]) == (401, "unauthorized"), bad


async def test_minting_needs_a_token_of_the_workspace(http: httpx.AsyncClient) -> None:
    assert (await http.post(TICKET)).status_code == 401
    bob = {"Authorization": "Bearer bob-token"}
    assert (await http.post(TICKET, headers=bob)).status_code == 403
    ops = {"Authorization": "Bearer ops-token"}
    assert (await http.post(TICKET, headers=ops)).status_code == 201  # admin: any workspace
    # The stream route still takes the token itself, and nothing else.
    assert (await http.get(EVENTS)).status_code == 401
    assert (await http.post(URL, json={"text": "x"}, params={"ticket": "t"})).status_code == 401


def _claims(ticket: str) -> dict[str, object]:
    payload = ticket.partition(".")[0]
    claims: dict[str, object] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
