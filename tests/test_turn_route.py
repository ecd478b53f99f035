"""The end route: ``POST /v1/workspaces/{ws}/sessions/{ses}/turns/{turn}/end`` over uvicorn on a
real loopback port and real Valkey. Who may end a turn (a token scoped to the workspace, or the
webhook's signature over the end's own string), what it refuses (a turn ID off its rule, a bad,
stale or replayed signature, the guard's rules), and what it answers for a held turn (200 with its
seconds) and for one the session does not hold (404). Last, the whole path: ``prompt-outbox
serve`` delivering to a webhook receiver that hands back turns."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from prompt_outbox import Outbox
from prompt_outbox.api import RateLimit, TokenTable
from prompt_outbox.core.callbacks import Turn
from prompt_outbox.core.entry import Entry
from prompt_outbox.embedded import free_port
from prompt_outbox.storage.client import Client
from prompt_outbox.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    turn_end_headers,
    turn_end_path,
)
from tests.support.agent import SECRET as HOOK_SECRET
from tests.support.agent import Agent
from tests.support.api import ALICE, OPS, TOKENS, serve
from tests.support.serve import service, wait_healthy
from tests.support.waiting import within

SECRET = b"hook-secret"
WS, SES = "acme", "chat-1"
TURN = "turn/1 ?%\u00e9"  # a '/', a '?', a '%', a space, non-ASCII: percent-encoded in the path
BOB = {"Authorization": "Bearer bob-token"}  # a token of another workspace


async def http_for(outbox: Outbox, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    async for http in serve(outbox, **options):
        # The route reads no body: send none (the shared client says JSON for its bodies).
        del http.headers["Content-Type"]
        yield http


@pytest.fixture
async def api(outbox: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    """The API, with the webhook secret a ``serve --webhook-url`` holds."""
    async for http in http_for(outbox, webhook_secret=SECRET):
        yield http


async def hold_turn(outbox: Outbox, turn: str = TURN, ses: str = SES) -> Entry:
    """Deliver a prompt with a deliverer that hands back ``turn``: the session is held."""
    entry = await outbox.accept(
        WS, ses, "u", "c-" + hashlib.sha256(turn.encode()).hexdigest()[:16], "a long task"
    )
    sent: list[str] = []

    async def deliverer(ws: str, session: str, entry: Entry) -> Turn:
        sent.append(entry.id)
        return Turn(turn)

    await outbox.deliver_once(WS, ses, deliverer)
    assert sent == [entry.id]
    return entry


def signed(
    turn: str = TURN, ses: str = SES, ws: str = WS, now: float | None = None
) -> dict[str, str]:
    return turn_end_headers(SECRET, ws, ses, turn, now=now)


def refusal(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]


async def test_a_held_turn_is_ended_by_a_token_once(api: httpx.AsyncClient, outbox: Outbox) -> None:
    await hold_turn(outbox)
    r = await api.post(turn_end_path(WS, SES, TURN), headers=ALICE)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ended"] is True and body["seconds"] >= 0
    # Ended: the same end again (a retried call), or an ID the session never held, is a 404.
    again = await api.post(turn_end_path(WS, SES, TURN), headers=ALICE)
    assert refusal(again) == (404, "turn_not_found")
    assert refusal(await api.post(turn_end_path(WS, SES, "nope"), headers=ALICE)) == (
        404,
        "turn_not_found",
    )


async def test_the_session_turn_route_says_how_long_and_is_scoped(
    api: httpx.AsyncClient, outbox: Outbox
) -> None:
    path = f"/v1/workspaces/{WS}/sessions/{SES}/turn"
    assert refusal(await api.get(path, headers=ALICE)) == (404, "no_turn")
    entry = await hold_turn(outbox)  # the queue is empty: only this route tells the turn
    r = await api.get(path, headers=ALICE)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["turn"], body["entry"], body["why"]) == (TURN, entry.id, "")
    assert body["seconds"] >= 0
    assert (await api.get(path)).status_code == 401  # no token
    await outbox.end_turn(WS, SES, TURN)
    assert refusal(await api.get(path, headers=ALICE)) == (404, "no_turn")


async def test_a_held_turn_is_ended_by_the_webhook_signature(
    api: httpx.AsyncClient, outbox: Outbox
) -> None:
    await hold_turn(outbox)
    path = turn_end_path(WS, SES, TURN)
    # Signed for another turn, session or workspace: refused, and the turn still held.
    for other in (signed(turn="turn/2"), signed(ses="chat-2"), signed(ws="other")):
        assert refusal(await api.post(path, headers=other)) == (401, "bad_signature")
    r = await api.post(path, headers=signed())
    assert r.status_code == 200, r.text
    assert r.json()["ended"] is True
    # The same signed end again, inside the window: the turn is over, nothing to end.
    assert refusal(await api.post(path, headers=signed())) == (404, "turn_not_found")


async def test_a_signature_that_is_not_an_end_of_this_turn_is_refused(
    api: httpx.AsyncClient, outbox: Outbox
) -> None:
    await hold_turn(outbox, turn="e-turn")
    path = turn_end_path(WS, SES, "e-turn")
    now = int(time.time())
    # A delivery's signature (captured on its way to the receiver), for an entry of the same
    # name as the turn, with an empty body: another domain, so no end.
    delivery = sign(SECRET, timestamp=now, workspace=WS, session=SES, entry_id="e-turn", body=b"")
    cases = {
        "bad_signature": [
            {TIMESTAMP_HEADER: str(now), SIGNATURE_HEADER: delivery},
            signed("e-turn") | {SIGNATURE_HEADER: "v2=" + "0" * 64},
            turn_end_headers(b"another-secret", WS, SES, "e-turn"),
        ],
        "stale_timestamp": [signed("e-turn", now=now - 301)],  # replayed past the window
        "missing_header": [{SIGNATURE_HEADER: signed("e-turn")[SIGNATURE_HEADER]}],
        "malformed_header": [signed("e-turn") | {TIMESTAMP_HEADER: "soon"}],
    }
    for code, attempts in cases.items():
        for headers in attempts:
            assert refusal(await api.post(path, headers=headers)) == (401, code), headers
    # A valid token beside a bad signature: the signature decides.
    bad = signed("e-turn") | {SIGNATURE_HEADER: "v2=" + "0" * 64}
    assert refusal(await api.post(path, headers=bad | ALICE)) == (401, "bad_signature")
    # None of them ended it: the turn is still held, and a good end ends it.
    r = await api.post(path, headers=signed("e-turn"))
    assert r.status_code == 200, r.text


async def test_who_may_end_a_turn(outbox: Outbox) -> None:
    path = turn_end_path(WS, SES, "t")
    async for http in http_for(outbox):  # no webhook secret: a signed end cannot be checked
        assert refusal(await http.post(path)) == (401, "unauthorized")
        assert refusal(await http.post(path, headers=BOB)) == (403, "forbidden")
        r = await http.post(path, headers=signed("t"))
        assert refusal(r) == (401, "unauthorized") and "webhook secret" in r.json()["detail"]
        # Not held yet, and no send in flight: nothing is kept for a claim, so the turn
        # held next is held (an end kept here would have let its claim hold none).
        assert refusal(await http.post(path, headers=ALICE)) == (404, "turn_not_found")
        await hold_turn(outbox, "t")
        assert (await http.post(path, headers=ALICE)).status_code == 200


async def test_a_turn_id_off_its_rule_is_a_400(api: httpx.AsyncClient) -> None:
    long = "t" * 201
    base = f"/v1/workspaces/{WS}/sessions/{SES}/turns"
    for headers in (ALICE, signed("t")):
        assert refusal(await api.post(f"{base}/{long}/end", headers=headers)) == (
            400,
            "invalid_turn_id",
        )
        assert refusal(await api.post(f"{base}//end", headers=headers)) == (400, "invalid_turn_id")
        # Within the length, a character that is not printable names no turn a session can
        # hold: not held (the schema states the length, which is all a schema can state).
        for unprintable in ("a%0Ab", "%00", "a%E2%80%8Bb", "%C2%85"):  # \n, NUL, ZWSP, NEL
            r = await api.post(f"{base}/{unprintable}/end", headers=headers)
            assert refusal(r) == (404, "turn_not_found"), unprintable
    # A workspace ID off its pattern: a token is judged first (it may not use it), a signed
    # end checks the IDs first (they are the caller's input, not the signature's).
    bad_ws = f"/v1/workspaces/a%7Bb/sessions/{SES}/turns/t/end"
    assert refusal(await api.post(bad_ws, headers=ALICE)) == (403, "forbidden")
    assert refusal(await api.post(bad_ws, headers=signed("t"))) == (400, "invalid_id")
    # 200 characters is a turn ID: the route reaches the outbox (which holds no such turn).
    ok = "t" * 200
    assert refusal(await api.post(f"{base}/{ok}/end", headers=ALICE)) == (404, "turn_not_found")


async def test_the_end_route_keeps_the_guard_rules(api: httpx.AsyncClient) -> None:
    path = turn_end_path(WS, SES, "t")
    text = {"Content-Type": "text/plain"}
    assert refusal(await api.post(path, content=b"x", headers=ALICE | text)) == (
        415,
        "unsupported_media_type",
    )
    big = b'"' + b"x" * 20_000 + b'"'
    json_type = {"Content-Type": "application/json"}
    assert refusal(await api.post(path, content=big, headers=ALICE | json_type)) == (
        413,
        "body_too_large",
    )
    twice = [("Authorization", "Bearer alice-token"), ("Authorization", "Bearer ops-token")]
    assert refusal(await api.post(path, headers=twice)) == (400, "duplicate_header")
    # A signature header sent twice: which one would count? Neither.
    good = signed("t")
    doubled = [*good.items(), (SIGNATURE_HEADER, "v2=" + "0" * 64)]
    assert refusal(await api.post(path, headers=doubled)) == (401, "malformed_header")


async def test_no_auth_serves_loopback_only_for_the_end_route_too(outbox: Outbox) -> None:
    path = turn_end_path(WS, SES, "t")
    async for http in http_for(outbox, tokens=TokenTable({}, disabled=True)):
        rebound = await http.post(path, headers={"Host": "evil.example"})
        assert refusal(rebound) == (403, "host_not_allowed")
        assert refusal(await http.post(path)) == (404, "turn_not_found")


async def test_ends_for_sessions_that_never_existed_leave_no_key(
    outbox: Outbox, client: Client
) -> None:
    # An end kept "for its claim" for any session name was a key a minute per request.
    async for http in http_for(outbox, turn_end_rate=RateLimit(0)):
        # The first request writes the store's format mark (outboxformat): counted after it.
        await http.post(turn_end_path(WS, "ghost", "t"), headers=ALICE)
        before = await client.dbsize()
        for n in range(300):
            r = await http.post(turn_end_path(WS, f"ghost-{n}", "t"), headers=ALICE)
            assert refusal(r) == (404, "turn_not_found")
        assert await client.dbsize() == before
        assert not [k async for k in client.scan_iter(match="outboxturnend:*")]


async def test_an_end_that_outruns_its_claim_over_the_route_is_honoured(
    api: httpx.AsyncClient, outbox: Outbox
) -> None:
    # The receiver ends its turn before its answer reached the worker: a send in flight, so
    # the end is kept, and the claim holds no turn; the next prompt goes at once.
    first = await outbox.accept(WS, SES, "u", "c1", "A")
    await outbox.accept(WS, SES, "u", "c2", "B")
    answers: list[int] = []

    async def deliverer(ws: str, ses: str, entry: Entry) -> Turn:
        if entry.id == first.id:
            r = await api.post(turn_end_path(ws, ses, "turn-A"), headers=signed("turn-A"))
            answers.append(r.status_code)
        return Turn(f"turn-{entry.text}")

    assert await outbox.deliver_once(WS, SES, deliverer)
    assert answers == [404]  # not held yet: kept for the claim
    assert await outbox.turn(WS, SES) is None  # ...which then held none
    assert [e.text for e in await outbox.list(WS, SES)] == ["B"]
    assert await outbox.deliver_once(WS, SES, deliverer)  # B goes without waiting
    found = await outbox.turn(WS, SES)
    assert found is not None and found.turn == "turn-B"


async def test_a_burst_of_ends_past_the_rate_is_429_per_caller(outbox: Outbox) -> None:
    slow = RateLimit(per_second=0.01, burst=3)
    async for http in http_for(outbox, webhook_secret=SECRET, turn_end_rate=slow):
        path = turn_end_path(WS, SES, "t")
        for _ in range(3):
            assert refusal(await http.post(path, headers=ALICE)) == (404, "turn_not_found")
        refused = await http.post(path, headers=ALICE)
        assert refusal(refused) == (429, "rate_limited"), refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        # Another token, the signer, and the same token's accepts each have their own bucket.
        assert refusal(await http.post(path, headers=OPS)) == (404, "turn_not_found")
        accepted = await http.post(
            f"/v1/workspaces/{WS}/sessions/{SES}/prompts",
            json={"clientMessageID": "c1", "text": "x"},
            headers=ALICE,
        )
        assert accepted.status_code == 202, accepted.text
        # A signature that does not verify spends nothing: the signer still has its three.
        forged = signed("t") | {SIGNATURE_HEADER: "v2=" + "0" * 64}
        for _ in range(5):
            assert refusal(await http.post(path, headers=forged)) == (401, "bad_signature")
        for _ in range(3):
            assert refusal(await http.post(path, headers=signed("t"))) == (404, "turn_not_found")
        refused = await http.post(path, headers=signed("t"))
        assert refusal(refused) == (429, "rate_limited") and "signer" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert refusal(await http.post(path, headers=OPS)) == (404, "turn_not_found")


def test_the_route_is_in_the_openapi(outbox: Outbox) -> None:
    from prompt_outbox.api import create_app

    doc = create_app(outbox, TOKENS).openapi()
    route = doc["paths"]["/v1/workspaces/{ws}/sessions/{ses}/turns/{turn}/end"]["post"]
    assert set(route["responses"]) >= {"200", "400", "401", "403", "404", "429"}
    assert "turn_not_found" in route["responses"]["404"]["description"]
    turn = next(p for p in route["parameters"] if p["name"] == "turn")
    assert turn["schema"]["maxLength"] == 200


def test_serve_holds_a_webhook_session_in_turn_until_the_end_route(tmp_path: Path) -> None:
    """The whole path: ``prompt-outbox serve --webhook-url`` at a receiver that answers 202
    {"turn": ...}. A then B for one session: B is not sent while A's turn is held; ends with
    a bad signature, a captured delivery's signature, a stale or another turn's signature are
    401 and end nothing; an end for an unknown turn is 404; the end signed by the webhook
    secret ends A (200), B is sent, and ending A again is 404 (finished)."""
    port = free_port()
    tokens = tmp_path / "tokens.json"
    alice = {"token": "alice-token", "user": "alice", "workspaces": [WS]}
    tokens.write_text(json.dumps({"tokens": [alice]}))
    tokens.chmod(0o600)
    base = f"http://127.0.0.1:{port}"
    prompts = f"{base}/v1/workspaces/{WS}/sessions/{SES}/prompts"
    with Agent() as agent:
        agent.actions = [(202, b'{"turn": "turn A/1"}'), (202, b'{"turn": "turn-B"}')]
        args = ["--tokens", str(tokens), "--port", str(port), "--data-dir", str(tmp_path / "d")]
        args += ["--webhook-url", agent.url]
        with service(args, {"PROMPT_OUTBOX_WEBHOOK_SECRET": HOOK_SECRET.decode()}):
            wait_healthy(port)
            with httpx.Client(base_url=base, headers=ALICE, timeout=10) as http:
                ids = []
                for n in ("A", "B"):
                    r = http.post(prompts, json={"clientMessageID": n, "text": f"prompt {n}"})
                    assert r.status_code == 202, r.text
                    ids.append(r.json()["id"])
                wait_for(lambda: agent.ids() == ids[:1], "A delivered")
                # A is delivered (out of the outbox), B waits behind A's turn. A worker is
                # woken at once by an accept and sends in milliseconds: given a second and a
                # half, it would have sent B by now if the turn did not hold the session.
                time.sleep(1.5)
                assert agent.ids() == ids[:1]
                assert [e["id"] for e in http.get(prompts).json()["entries"]] == ids[1:]

                turn_a = turn_end_path(WS, SES, "turn A/1")
                [got] = agent.received
                sent = got.headers
                signing = (TIMESTAMP_HEADER, SIGNATURE_HEADER)
                captured = {k: v for k, v in sent.items() if k in signing}
                assert len(captured) == 2
                key = HOOK_SECRET
                refused = [
                    (captured, "bad_signature"),  # A's own delivery, captured
                    (ends(b"wrong-secret", "turn A/1"), "bad_signature"),
                    (ends(key, "turn-B"), "bad_signature"),  # another turn's end
                    (ends(key, "turn A/1", ses="chat-2"), "bad_signature"),
                    (ends(key, "turn A/1", now=time.time() - 600), "stale_timestamp"),
                ]
                for headers, code in refused:
                    r = httpx.post(base + turn_a, headers=headers)
                    assert (r.status_code, r.json()["error"]) == (401, code), headers
                unknown = httpx.post(base + turn_end_path(WS, SES, "t9"), headers=ends(key, "t9"))
                assert (unknown.status_code, unknown.json()["error"]) == (404, "turn_not_found")
                assert agent.ids() == ids[:1]  # nothing above ended the turn

                r = httpx.post(base + turn_a, headers=ends(key, "turn A/1"))
                assert r.status_code == 200, r.text
                assert r.json()["ended"] is True and r.json()["seconds"] >= 1.5
                wait_for(lambda: agent.ids() == ids, "B delivered after A's end")
                again = httpx.post(base + turn_a, headers=ends(key, "turn A/1"))
                assert (again.status_code, again.json()["error"]) == (404, "turn_not_found")
                # B's turn, ended by a token this time; then the session is free.
                assert http.post(turn_end_path(WS, SES, "turn-B")).status_code == 200
                assert http.get(prompts).json() == {"entries": []}


def ends(key: bytes, turn: str, *, ses: str = SES, now: float | None = None) -> dict[str, str]:
    return turn_end_headers(key, WS, ses, turn, now=now)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    assert within(condition, 30), f"not within 30 s: {what}"
