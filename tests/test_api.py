"""The HTTP API end to end: uvicorn on a real loopback port, real Valkey, every status code."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import valkey.asyncio as valkey_async
from click.testing import CliRunner

from prompt_outbox import Outbox
from prompt_outbox.api import create_app
from prompt_outbox.cli import main
from prompt_outbox.core.keys import FORMAT_KEY
from prompt_outbox.embedded import free_port
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, JSON_BODY, OPS, TOKENS, URL, samples, serve
from tests.support.tunables import FAST


async def test_accept_list_and_duplicate(http: httpx.AsyncClient, outbox: Outbox) -> None:
    model = '{"providerID":"x","n":12345678901234567890,"opts":[]}'
    body = '{"clientMessageID":"m1","text":"héllo","model":' + model + "}"
    r = await http.post(URL, content=body, headers=ALICE)
    assert r.status_code == 202, r.text
    first = r.json()
    assert first["status"] == "pending"
    [entry] = await outbox.list("acme", "chat-1")
    assert (entry.id, entry.user_id, entry.model) == (first["id"], "alice", model)  # bytes kept
    dup = await http.post(URL, content=body, headers=ALICE)
    assert (dup.status_code, dup.json()) == (200, {"id": first["id"], "duplicate": True})
    listed = await http.get(URL, headers=ALICE)
    assert listed.status_code == 200
    assert '"model":' + model in listed.text  # raw JSON out, too
    assert [e["id"] for e in listed.json()["entries"]] == [first["id"]]


async def test_the_idempotency_key_header(http: httpx.AsyncClient, outbox: Outbox) -> None:
    # draft-ietf-httpapi-idempotency-key-header: the key as a header (a quoted sf-string or
    # bare), a replay answered 200 with Idempotent-Replayed, a reuse for another payload 422.
    key = {**ALICE, "Idempotency-Key": '"8e03978e-40d5-43e8-bc93-6894a57f9324"'}
    r = await http.post(URL, content='{"text":"hello"}', headers=key)
    assert r.status_code == 202 and "Idempotent-Replayed" not in r.headers, r.text
    first = r.json()["id"]
    [entry] = await outbox.list("acme", "chat-1")
    assert (entry.id, entry.client_message_id) == (first, "8e03978e-40d5-43e8-bc93-6894a57f9324")
    bare = {**ALICE, "Idempotency-Key": "8e03978e-40d5-43e8-bc93-6894a57f9324"}
    body = '{"clientMessageID":"8e03978e-40d5-43e8-bc93-6894a57f9324","text":"hello"}'
    for headers, content in ((key, '{"text":"hello"}'), (bare, body), (ALICE, body)):
        replay = await http.post(URL, content=content, headers=headers)
        assert (replay.status_code, replay.json()) == (200, {"id": first, "duplicate": True})
        assert replay.headers["Idempotent-Replayed"] == "true"
    reused = await http.post(URL, content='{"text":"hello","model":{"id":"x"}}', headers=bare)
    assert reused.status_code == 422
    assert (reused.json()["error"], reused.json()["id"]) == ("idempotency_key_reused", first)
    mismatch = await http.post(URL, content='{"clientMessageID":"other","text":"x"}', headers=key)
    assert (mismatch.status_code, mismatch.json()["error"]) == (400, "idempotency_key_mismatch")
    for bad in ('"unterminated', "two words", '""', "x" * 257):
        refused = await http.post(
            URL, content='{"text":"x"}', headers={**ALICE, "Idempotency-Key": bad}
        )
        assert (refused.status_code, refused.json()["error"]) == (400, "invalid_idempotency_key")
    neither = await http.post(URL, content='{"text":"x"}', headers=ALICE)
    assert (neither.status_code, neither.json()["error"]) == (422, "invalid_request")
    assert [e.id for e in await outbox.list("acme", "chat-1")] == [first]


async def test_while_busy_reject_is_409_session_busy(http: httpx.AsyncClient) -> None:
    first = {"clientMessageID": "w1", "text": "one", "whileBusy": "reject"}
    assert (await http.post(URL, json=first, headers=ALICE)).status_code == 202
    second = {"clientMessageID": "w2", "text": "two", "whileBusy": "reject"}
    busy = await http.post(URL, json=second, headers=ALICE)
    assert (busy.status_code, busy.json()["error"]) == (409, "session_busy")
    queued = await http.post(URL, json={**second, "whileBusy": "enqueue"}, headers=ALICE)
    assert queued.status_code == 202  # the key was not taken by the refusal
    bad = await http.post(
        URL, json={**second, "clientMessageID": "w3", "whileBusy": "later"}, headers=ALICE
    )
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_input")
    # interrupt: queued as usual (what it aborts is tests/test_interrupt.py's subject).
    third = {"clientMessageID": "w4", "text": "three", "whileBusy": "interrupt"}
    assert (await http.post(URL, json=third, headers=ALICE)).status_code == 202


async def test_user_id_comes_from_the_token_not_the_body(
    http: httpx.AsyncClient, outbox: Outbox
) -> None:
    r = await http.post(
        URL, json={"clientMessageID": "m1", "text": "hi", "userID": "mallory"}, headers=ALICE
    )
    assert r.status_code == 202
    assert (await outbox.list("acme", "chat-1"))[0].user_id == "alice"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer nope"}, 401),
        ({"Authorization": "Basic alice-token"}, 401),
        ({"Authorization": "Bearer bob-token"}, 403),  # a token of another workspace
        ({"Authorization": "Bearer ops-token"}, 202),  # admin
    ],
)
async def test_auth(http: httpx.AsyncClient, headers: dict[str, str], status: int) -> None:
    r = await http.post(URL, json={"clientMessageID": "m1", "text": "hi"}, headers=headers)
    assert r.status_code == status
    if status >= 400:
        assert r.json()["error"] in ("unauthorized", "forbidden")
    for method, path in [("GET", URL), ("POST", URL + "/x/retry"), ("DELETE", URL + "/x")]:
        if status >= 400:
            assert (await http.request(method, path, headers=headers)).status_code == status


async def test_full_is_429(client: valkey_async.Valkey) -> None:
    from dataclasses import replace

    outbox = Outbox(client, replace(FAST, cap=1))
    async for http in serve(outbox):
        assert (
            await http.post(URL, json={"clientMessageID": "a", "text": "t"}, headers=ALICE)
        ).status_code == 202
        r = await http.post(URL, json={"clientMessageID": "b", "text": "t"}, headers=ALICE)
        assert (r.status_code, r.json()["error"]) == (429, "outbox_full")


async def test_retry_and_dismiss_status_codes(http: httpx.AsyncClient, outbox: Outbox) -> None:
    r = await http.post(URL, json={"clientMessageID": "a", "text": "t"}, headers=ALICE)
    entry_id = r.json()["id"]
    assert (await http.post(f"{URL}/{entry_id}/retry", headers=ALICE)).status_code == 404  # pending
    agent = ScriptedAgent([RuntimeError("no")] * FAST.max_attempts)
    for _ in range(FAST.max_attempts):
        await asyncio.sleep(FAST.max_backoff)
        await outbox.deliver_once("acme", "chat-1", agent)
    assert (await outbox.list("acme", "chat-1"))[0].status == "error"
    r = await http.post(f"{URL}/{entry_id}/retry", headers=ALICE)
    assert (r.status_code, r.json()["status"]) == (200, "pending")

    release = asyncio.Event()

    async def held(ws: str, ses: str, e: object) -> None:
        await release.wait()

    delivery = asyncio.create_task(outbox.deliver_once("acme", "chat-1", held))
    await asyncio.sleep(0.2)
    assert (await http.delete(f"{URL}/{entry_id}", headers=ALICE)).status_code == 409
    assert (await http.post(f"{URL}/{entry_id}/retry", headers=ALICE)).status_code == 409
    release.set()
    await delivery
    assert (await http.delete(f"{URL}/{entry_id}", headers=ALICE)).status_code == 404  # delivered
    r = await http.post(URL, json={"clientMessageID": "b", "text": "t"}, headers=ALICE)
    assert (await http.delete(f"{URL}/{r.json()['id']}", headers=ALICE)).status_code == 204


async def test_edit_status_codes(http: httpx.AsyncClient, outbox: Outbox) -> None:
    r = await http.post(URL, json={"clientMessageID": "e", "text": "typo"}, headers=ALICE)
    entry_id = r.json()["id"]
    model = '{"providerID":"x","n":12345678901234567890}'
    ok = await http.patch(
        f"{URL}/{entry_id}", content='{"text":"fixed","model":' + model + "}", headers=ALICE
    )
    assert (ok.status_code, ok.json()) == (200, {"id": entry_id, "edited": True})
    [e] = await outbox.list("acme", "chat-1")
    assert (e.text, e.model) == ("fixed", model)  # the model's bytes kept
    cleared = await http.patch(f"{URL}/{entry_id}", content='{"model":null}', headers=ALICE)
    assert cleared.status_code == 200 and (await outbox.list("acme", "chat-1"))[0].model is None
    for body, status, code in (
        ("{}", 422, "invalid_request"),
        ('{"text":null}', 422, "invalid_request"),
        ('{"text":""}', 400, "invalid_input"),
        ('{"text":"' + "x" * 110_000 + '"}', 413, "text_too_large"),
        ("[1]", 400, "invalid_json"),
    ):
        refused = await http.patch(f"{URL}/{entry_id}", content=body, headers=ALICE)
        assert (refused.status_code, refused.json()["error"]) == (status, code), body
    missing = await http.patch(f"{URL}/nosuch", content='{"text":"x"}', headers=ALICE)
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")

    release = asyncio.Event()

    async def held(ws: str, ses: str, e: object) -> None:
        await release.wait()

    delivery = asyncio.create_task(outbox.deliver_once("acme", "chat-1", held))
    await asyncio.sleep(0.2)
    busy = await http.patch(f"{URL}/{entry_id}", content='{"text":"late"}', headers=ALICE)
    assert (busy.status_code, busy.json()["error"]) == (409, "busy")
    release.set()
    await delivery
    await outbox.seed_entry_for_test(
        "acme",
        "chat-1",
        '{"id":"v1","clientMessageID":"v1","userID":"u","text":"t",'
        '"acceptedAt":"2026-12-01T00:00:00.000000Z","attempts":1,"status":"verifying"}',
    )
    late = await http.patch(f"{URL}/v1", content='{"text":"late"}', headers=ALICE)
    assert (late.status_code, late.json()["error"]) == (409, "not_editable")
    assert (await http.patch(f"{URL}/v1", content='{"text":"x"}')).status_code == 401


async def test_valkey_unreachable_is_503_and_health_stays_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    dead = valkey_async.Valkey.from_url(f"valkey://127.0.0.1:{port}", socket_connect_timeout=1)
    async for http in serve(Outbox(dead, FAST)):
        r = await http.post(URL, json={"clientMessageID": "a", "text": "t"}, headers=ALICE)
        assert (r.status_code, r.json()["error"]) == (503, "storage_unavailable")
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert (await http.get("/healthz")).status_code == 200
    # The server's address is the operator's to read in the log, not any caller's.
    assert str(port) not in r.text and str(port) not in ready.text
    assert str(port) in caplog.text


async def test_ready_and_openapi(http: httpx.AsyncClient) -> None:
    assert (await http.get("/readyz")).json() == {"status": "ready"}
    spec = (await http.get("/openapi.json")).json()
    post = spec["paths"]["/v1/workspaces/{ws}/sessions/{ses}/prompts"]["post"]
    assert "clientMessageID" in json.dumps(post["requestBody"])
    # `prompt-outbox openapi` prints the same document, with no server (the client's types
    # are generated from it).
    printed = CliRunner().invoke(main, ["openapi"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output) == spec


async def test_admin_routes_need_an_admin_token(http: httpx.AsyncClient) -> None:
    for method, path, body in [
        ("POST", "/v1/workspaces/acme/park", {"reason": "flip"}),
        ("POST", "/v1/workspaces/acme/unpark", None),
        ("POST", "/v1/workspaces/acme/sweep", None),
        ("DELETE", "/v1/workspaces/acme", None),
    ]:
        r = await http.request(method, path, json=body, headers=ALICE)  # alice owns acme
        assert (r.status_code, r.json()["error"]) == (403, "forbidden")
        assert (await http.request(method, path, json=body)).status_code == 401


async def test_admin_park_unpark_sweep_cleanup(
    http: httpx.AsyncClient, outbox: Outbox, client: valkey_async.Valkey
) -> None:
    for cmid in ("a", "b"):
        await http.post(URL, json={"clientMessageID": cmid, "text": "t"}, headers=ALICE)
    r = await http.post("/v1/workspaces/acme/park", json={"reason": "mode flip"}, headers=OPS)
    assert r.json() == {"parked": 2}
    assert {e.status for e in await outbox.list("acme", "chat-1")} == {"parked"}
    bad = await http.post("/v1/workspaces/acme/park", json={"reason": ""}, headers=OPS)
    assert bad.status_code == 422
    assert (await http.post("/v1/workspaces/acme/unpark", headers=OPS)).json() == {"unparked": 2}
    r = await http.post("/v1/workspaces/acme/sweep", headers=OPS)
    assert r.json() == {"unverifiable": 0, "parkedErrors": 0}
    r = await http.delete("/v1/workspaces/acme", headers=OPS)
    assert r.json()["deleted"] > 0
    assert await client.keys("*") == [FORMAT_KEY.encode()]  # the store's, not the workspace's
    assert (await http.delete("/v1/workspaces/a:b", headers=OPS)).status_code == 400


@pytest.mark.parametrize(
    "body", ['{"reason": NaN}', '{"reason": -Infinity}', '{"reason": "x", "y": NaN}']
)
async def test_a_typed_body_with_nan_or_an_unknown_field_is_422_not_500(
    http: httpx.AsyncClient, body: str
) -> None:
    # The refusal echoed the input, and NaN made that answer unencodable (a 500); an unknown
    # field holding NaN was ignored (a 200).
    r = await http.post("/v1/workspaces/acme/park", content=body, headers=OPS)
    assert (r.status_code, r.json()["error"]) == (422, "invalid_request"), r.text
    assert all("input" not in problem for problem in r.json()["detail"])


async def test_metrics_count_the_work_and_the_entries(
    http: httpx.AsyncClient, outbox: Outbox
) -> None:
    for cmid in ("m1", "m1", "m2"):
        await http.post(URL, json={"clientMessageID": cmid, "text": "hi"}, headers=ALICE)
    agent = ScriptedAgent([None, RuntimeError("no thanks")])
    assert await outbox.deliver_once("acme", "chat-1", agent)  # m1 delivered
    assert await outbox.deliver_once("acme", "chat-1", agent)  # m2 fails once, retried
    r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = samples(r.text)
    assert got[("prompt_outbox_accepted_total", ())] == 2
    assert got[("prompt_outbox_duplicates_total", ())] == 1
    assert got[("prompt_outbox_delivered_total", (("via", "send"),))] == 1
    assert got[("prompt_outbox_delivery_attempts_total", (("outcome", "definitive"),))] == 1
    assert got[("prompt_outbox_retried_total", (("reason", "definitive"),))] == 1
    assert got[("prompt_outbox_entries", (("status", "pending"),))] == 1
    assert got[("prompt_outbox_entries", (("status", "error"),))] == 0
    assert got[("prompt_outbox_accept_seconds_count", ())] == 2
    assert got[("prompt_outbox_delivery_seconds_count", ())] == 2
    assert got[("prompt_outbox_accept_to_delivered_seconds_count", ())] == 1


async def test_the_fast_accept_path_and_the_fastapi_route_answer_alike(outbox: Outbox) -> None:
    """api/fast.py answers the accept before FastAPI; under a root_path it steps aside and the
    FastAPI route answers. Both must give the same status and body for the same request."""
    app = create_app(outbox, TOKENS)
    cases: list[tuple[str, dict[str, str], bytes]] = [
        (URL, ALICE, b'{"clientMessageID":"f1","text":"hi"}'),
        (URL, ALICE, b'{"clientMessageID":"f1","text":"hi"}'),  # the duplicate
        (URL, {}, b'{"clientMessageID":"f2","text":"hi"}'),
        (URL, {"Authorization": "Bearer bob-token"}, b'{"clientMessageID":"f2","text":"x"}'),
        ("/v1/workspaces/acme/sessions/bad%20id/prompts", ALICE, b"{}"),
        (URL, ALICE, b"not json"),
        (URL, ALICE, b'{"clientMessageID":"f3"}'),
        (URL, ALICE, b'{"clientMessageID":"f4","text":"x","model":"not an object"}'),
        (URL, ALICE, b"x" * 2_000_000),
        (URL, {**ALICE, "Idempotency-Key": '"k1"'}, b'{"text":"hi"}'),
        (URL, {**ALICE, "Idempotency-Key": "k1"}, b'{"text":"hi"}'),  # the replay
        (URL, {**ALICE, "Idempotency-Key": "k1"}, b'{"text":"other"}'),  # reused
        (URL, {**ALICE, "Idempotency-Key": "k2"}, b'{"clientMessageID":"k3","text":"x"}'),
        (URL, {**ALICE, "Idempotency-Key": "no spaces"}, b'{"text":"x"}'),
    ]

    async def answers(root: str, session: str) -> list[tuple[int, Any]]:
        transport = httpx.ASGITransport(app=app, root_path=root)
        out = []
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=JSON_BODY
        ) as client:
            for url, headers, body in cases:
                r = await client.post(
                    root + url.replace("chat-1", session), content=body, headers=headers
                )
                doc = r.json()
                if isinstance(doc, dict):
                    doc.pop("id", None)  # each side accepts its own entry
                    doc["replayed"] = r.headers.get("Idempotent-Replayed")
                out.append((r.status_code, doc))
        return out

    fast, routed = await answers("", "fast-side"), await answers("/base", "routed-side")
    assert fast == routed
    statuses = [status for status, _ in fast]
    assert statuses == [202, 200, 401, 403, 400, 400, 422, 202, 413, 202, 200, 422, 400, 400], fast
    assert [doc["replayed"] for _, doc in fast if isinstance(doc, dict)].count("true") == 2


APP_ORIGIN = "http://app.test:3000"


async def test_cors_lets_the_named_origins_pages_call_it_and_no_other(outbox: Outbox) -> None:
    async for http in serve(outbox, cors_origins=[APP_ORIGIN]):
        # The browser's preflight for a POST with a bearer token and an Idempotency-Key.
        asks = {
            "Origin": APP_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type,idempotency-key",
        }
        pre = await http.options(URL, headers=asks)
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == APP_ORIGIN
        assert "idempotency-key" in pre.headers["access-control-allow-headers"].lower()
        # The accept (answered by the fast path) carries the headers, and exposes the replay.
        body = {"clientMessageID": "cors-1", "text": "hi"}
        sent = {**ALICE, "Origin": APP_ORIGIN}
        assert (await http.post(URL, json=body, headers=sent)).status_code == 202
        again = await http.post(URL, json=body, headers=sent)
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.headers["access-control-allow-origin"] == APP_ORIGIN
        assert "idempotent-replayed" in again.headers["access-control-expose-headers"].lower()
        listed = await http.get(URL, headers=sent)  # a FastAPI route too
        assert listed.headers["access-control-allow-origin"] == APP_ORIGIN
        # Another origin gets no grant: its page cannot read the answer.
        other = await http.get(URL, headers={**ALICE, "Origin": "http://evil.test"})
        assert "access-control-allow-origin" not in other.headers
        refused = await http.options(URL, headers={**asks, "Origin": "http://evil.test"})
        assert refused.status_code == 400
    # Without --cors-origin, no grant at all (same origin only).
    async for http in serve(outbox):
        plain = await http.get(URL, headers={**ALICE, "Origin": APP_ORIGIN})
        assert "access-control-allow-origin" not in plain.headers


def test_serve_refuses_a_cors_origin_that_is_no_origin() -> None:
    for bad in ["app.test", "http://app.test/path", "ftp://app.test"]:
        done = CliRunner().invoke(main, ["serve", "--no-auth", "--cors-origin", bad])
        assert done.exit_code == 2 and "--cors-origin wants" in done.output, done.output
