"""The webhook deliverer against a real HTTP server on loopback: signature, idempotency key, and
each response class mapped to the contract's outcome classes, through the Outbox. The receiver
checks every delivery with ``prompt_outbox.webhook.verify_signature``, as a user's would."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from prompt_outbox import Outbox, Status
from prompt_outbox.cli.flaky_agent import FlakyAgent
from prompt_outbox.core.callbacks import TURN_ID_MAX, Turn, TurnState, TurnWatcher
from prompt_outbox.deliver import WebhookDeliverer
from prompt_outbox.deliver.webhook import SEND_ANSWER_BYTES, VERIFY_ANSWER_BYTES
from prompt_outbox.embedded import free_port
from prompt_outbox.webhook import (
    SESSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WORKSPACE_HEADER,
    SignedDelivery,
    WebhookSignatureError,
    verify_signature,
)
from tests.support.agent import SECRET, Agent
from tests.support.clock import ManualClock
from tests.support.tunables import FAST

WS, SES = "ws", "s1"


@pytest.fixture
def agent() -> Iterator[Agent]:
    with Agent() as rec:
        yield rec


def wired(manual_outbox: Outbox, rec: Agent, http_timeout: float = 5.0) -> WebhookDeliverer:
    hook = WebhookDeliverer(rec.url, secret=SECRET, verify_url=rec.verify_url, timeout=http_timeout)
    manual_outbox.set_verifier(hook.verify)
    return hook


async def test_delivers_signed_with_the_entry_id_as_idempotency_key(
    manual_outbox: Outbox, agent: Agent
) -> None:
    hook = wired(manual_outbox, agent)
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "héllo", model='{"m":[]}')
    assert await manual_outbox.deliver_once(WS, SES, hook)
    assert await manual_outbox.list(WS, SES) == []
    [req] = agent.received
    headers, body = req.headers, req.body
    assert headers["Idempotency-Key"] == entry.id
    assert headers[SIGNATURE_HEADER].startswith("v2=")
    assert req.signed == SignedDelivery(WS, SES, entry.id, int(headers[TIMESTAMP_HEADER]))
    with pytest.raises(WebhookSignatureError):
        verify_signature(b"wrong", headers, body)
    sent = json.loads(body)
    assert (sent["id"], sent["text"], sent["model"]) == (entry.id, "héllo", {"m": []})
    await hook.aclose()


async def test_a_captured_delivery_replayed_elsewhere_is_refused_by_the_receiver(
    manual_outbox: Outbox, agent: Agent
) -> None:
    """Finding 6: the old signature covered the timestamp and body only, so a captured
    delivery verified with the workspace or session header changed (the body names neither)."""
    hook = wired(manual_outbox, agent)
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "run the tests")
    assert await manual_outbox.deliver_once(WS, SES, hook)
    [req] = agent.received
    sent, body = req.headers, req.body
    # What an eavesdropper replays: the request as it went, less what httpx sets itself.
    captured = {k: v for k, v in sent.items() if k.lower() not in ("content-length", "host")}
    replays = [
        (captured | {WORKSPACE_HEADER: "other-tenant"}, body),
        (captured | {SESSION_HEADER: "s2"}, body),
        (captured | {"Idempotency-Key": entry.id + "x"}, body),
        (captured | {TIMESTAMP_HEADER: str(int(time.time()) + 1)}, body),
        (captured, body.replace(b"run the tests", b"rm -rf the tests")),
    ]
    async with httpx.AsyncClient() as http:
        for headers, content in replays:
            answer = await http.post(agent.url, headers=headers, content=content)
            assert answer.status_code == 401
        assert (await http.post(agent.url, headers=captured, content=body)).status_code == 200
    assert [e.code for e in agent.refused] == ["bad_signature"] * len(replays)
    assert len(agent.received) == 2  # only the untouched replay (it dedupes by the entry ID)
    await hook.aclose()


@pytest.mark.parametrize(
    ("action", "status", "attempts", "transient_fails"),
    [
        (400, Status.PENDING, 1, 0),  # definitive: it will not take it
        (429, Status.PENDING, 0, 1),  # transient: not taken, no attempt minted
        (503, Status.VERIFYING, 0, 0),  # ambiguous: it may have acted
        ("cut", Status.VERIFYING, 0, 0),
        ("hang", Status.VERIFYING, 0, 0),  # read timeout
    ],
)
async def test_response_classes(
    manual_outbox: Outbox,
    agent: Agent,
    action: str | int,
    status: Status,
    attempts: int,
    transient_fails: int,
) -> None:
    hook = wired(manual_outbox, agent, http_timeout=0.5)
    agent.actions = [action]
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, hook)
    [e] = await manual_outbox.list(WS, SES)
    assert (e.status, e.attempts, e.transient_fails) == (status, attempts, transient_fails)
    await hook.aclose()


@pytest.mark.parametrize("action", [503, "cut"])
async def test_ambiguous_send_verified_delivered_is_not_resent(
    manual_outbox: Outbox, clock: ManualClock, agent: Agent, action: str | int
) -> None:
    hook = wired(manual_outbox, agent)
    agent.actions = [action]
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    await manual_outbox.deliver_once(WS, SES, hook)
    clock.advance(FAST.verify_delay)
    # Verify: the receiver has it. Its turn may go on (the send was cut, not answered), so the
    # session is held in a turn named by the entry ID, which the verify URL is asked about.
    await manual_outbox.deliver_once(WS, SES, hook)
    assert await manual_outbox.list(WS, SES) == []
    clock.advance(FAST.turn_check_interval)
    await manual_outbox.deliver_once(WS, SES, hook)
    assert {
        "turn": [entry.id],
        "workspace": [WS],
        "session": [SES],
        "id": [entry.id],
    } in agent.asked
    assert agent.ids() == [entry.id]  # one POST only
    # It said "ended": the session is free, and its next prompt goes.
    second = await manual_outbox.accept(WS, SES, "u", "c2", "next")
    await manual_outbox.deliver_once(WS, SES, hook)
    assert agent.ids() == [entry.id, second.id]
    await hook.aclose()


async def test_verified_absent_is_sent_again(
    manual_outbox: Outbox, clock: ManualClock, agent: Agent
) -> None:
    hook = wired(manual_outbox, agent)
    agent.actions = [503]
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    await manual_outbox.deliver_once(WS, SES, hook)
    agent.received.clear()  # the receiver lost it: the verify URL will answer "absent"
    clock.advance(FAST.verify_delay)
    await manual_outbox.deliver_once(WS, SES, hook)
    clock.advance(60)
    assert await manual_outbox.deliver_once(WS, SES, hook)
    assert agent.ids() == [entry.id] and await manual_outbox.list(WS, SES) == []
    await hook.aclose()


async def test_connection_refused_is_transient(manual_outbox: Outbox) -> None:
    hook = WebhookDeliverer(f"http://127.0.0.1:{free_port()}/hook", secret=SECRET)
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    assert await manual_outbox.deliver_once(WS, SES, hook)
    [e] = await manual_outbox.list(WS, SES)
    assert (e.status, e.attempts, e.transient_fails) == (Status.PENDING, 0, 1)
    await hook.aclose()


def test_a_secret_is_required() -> None:
    with pytest.raises(ValueError):
        WebhookDeliverer("http://127.0.0.1:1/hook", secret=b"")


async def test_the_demo_agent_checks_signatures(manual_outbox: Outbox) -> None:
    """FlakyAgent with the secret (as the demo runs it) takes a signed delivery and answers
    401 to a forged one, recording nothing."""
    agent = FlakyAgent(faults={"ok": 1.0}, secret=SECRET)
    hook = WebhookDeliverer(agent.url, secret=SECRET)
    try:
        entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
        assert await manual_outbox.deliver_once(WS, SES, hook)
        assert agent.recorded(entry.id) and await manual_outbox.list(WS, SES) == []
        async with httpx.AsyncClient() as http:
            unsigned = await http.post(agent.url, content=b'{"id":"e9"}')
            forged = await http.post(
                agent.url,
                content=b'{"id":"e9"}',
                headers={
                    "Idempotency-Key": "e9",
                    TIMESTAMP_HEADER: str(int(time.time())),
                    SIGNATURE_HEADER: "v2=" + "0" * 64,
                    WORKSPACE_HEADER: WS,
                    SESSION_HEADER: SES,
                },
            )
        assert (unsigned.status_code, forged.status_code) == (401, 401)
        assert agent.refused == {"missing_header": 1, "bad_signature": 1}
        assert not agent.recorded("e9") and agent.delivered() == 1
    finally:
        await hook.aclose()
        agent.close()


LONG = "t" * (TURN_ID_MAX + 1)
PADDED = b'{"turn": "t-1", "pad": "' + b"x" * SEND_ANSWER_BYTES + b'"}'  # past the read bound


@pytest.mark.parametrize(
    ("answer", "turn"),
    [
        ((202, b'{"turn": "t-1"}'), "t-1"),
        ((202, json.dumps({"turn": "a/b c?%\u00e9"}).encode()), "a/b c?%\u00e9"),  # any printable
        # The receiver asked for a turn with an ID that is none: it has the prompt, so the
        # session is held, the turn named by the entry ID (which the receiver knows).
        ((202, b'{"turn": ""}'), "<entry>"),
        ((202, json.dumps({"turn": LONG}).encode()), "<entry>"),
        ((202, b'{"turn": "a\\nb"}'), "<entry>"),
        ((202, b'{"turn": 7}'), "<entry>"),
        ((202, b'{"turn": null}'), "<entry>"),
        # No "turn": the blocking shape, as before this change (a receiver that answers 202
        # out of habit when it is done keeps working).
        ((202, b""), None),
        ((202, b'{"accepted": true}'), None),
        ((202, b'["turn"]'), None),
        ((202, b"turn t-1"), None),
        ((202, PADDED), None),  # cut at the bound: no turn read from part of an answer
        ((200, b'{"turn": "t-1"}'), None),  # only a 202 hands a turn back
        ((201, b'{"turn": "t-1"}'), None),
        ("ok", None),
        (204, None),
    ],
)
async def test_a_202_with_a_turn_hands_the_turn_back(
    manual_outbox: Outbox, agent: Agent, answer: str | int | tuple[int, bytes], turn: str | None
) -> None:
    """Turns over the webhook: a receiver that answers as soon as it has the prompt says so with
    202 {"turn": id}; the deliverer returns that Turn (before: None, the turn taken as over,
    so the session's next prompt went into the running turn)."""
    hook = wired(manual_outbox, agent)
    agent.actions = [answer]
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    got = await hook(WS, SES, entry)
    want = None if turn is None else Turn(entry.id if turn == "<entry>" else turn)
    assert got == want
    assert agent.ids() == [entry.id]
    await hook.aclose()


async def test_the_webhook_deliverer_asks_the_verify_url_how_a_turn_goes(
    agent: Agent,
) -> None:
    hook = WebhookDeliverer(agent.url, secret=SECRET, verify_url=agent.verify_url)
    assert isinstance(hook, TurnWatcher)
    hook.watch_turns(None)  # nothing to stream: accepted and ignored
    agent.turns = {
        "t-run": "running",
        "t-end": "ENDED",
        "t-plain": b" ended\n",  # a plain word, as for the entry verdicts
        "t-gone": "absent",  # no turn's word
        "t-kept": "delivered",  # a verify URL that knows only entries: as it meant before
        "t-pad": b"ended" + b" " * VERIFY_ANSWER_BYTES,  # past the bound: no verdict from part
    }
    asked = {turn: await hook.turn_state(WS, SES, turn) for turn in agent.turns}
    assert asked == {
        "t-run": TurnState.RUNNING,
        "t-end": TurnState.ENDED,
        "t-plain": TurnState.ENDED,
        "t-gone": TurnState.UNKNOWN,
        "t-kept": TurnState.ENDED,
        "t-pad": TurnState.UNKNOWN,
    }
    # The turn, its workspace and session as query parameters (a turn ID is the receiver's
    # own, and may repeat across sessions); the ID as ``id`` too, for an old verify URL.
    want = {"turn": ["t-run"], "workspace": [WS], "session": [SES], "id": ["t-run"]}
    assert agent.asked[0] == want
    weird = "a/b&c=d %"
    agent.turns[weird] = "ended"
    assert await hook.turn_state(WS, SES, weird) == TurnState.ENDED
    assert agent.asked[-1]["turn"] == [weird]
    await hook.aclose()


async def test_a_turn_state_nobody_can_give() -> None:
    """No verify URL: nobody to ask, so RUNNING (the end route or the ceiling ends it); a
    verify URL that does not answer: UNKNOWN (asked again later), never an exception."""
    quiet = WebhookDeliverer("http://127.0.0.1:1/hook", secret=SECRET)
    away = f"http://127.0.0.1:{free_port()}/verify"
    gone = WebhookDeliverer("http://127.0.0.1:1/hook", secret=SECRET, verify_url=away)
    assert await quiet.turn_state(WS, SES, "t") == TurnState.RUNNING
    assert await gone.turn_state(WS, SES, "t") == TurnState.UNKNOWN
    await quiet.aclose()
    await gone.aclose()


async def test_a_verify_url_written_before_turns_lets_a_verified_turn_end(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    """FlakyAgent's verify URL knows only ``?id=`` (as every one written before turns): after
    a cut send it verified, the session is held in a turn named by the entry ID, and the check
    of that turn reads its ``delivered`` as ended, so the next prompt goes. Asked ``?turn=``
    alone it answered ``absent`` (no ``id``): unknown, and the session was held until
    ``turn_ceiling`` + ``turn_grace`` (the demo stalled)."""
    agent = FlakyAgent(faults={"cut_after_recording": 1.0}, secret=SECRET)
    hook = WebhookDeliverer(agent.url, secret=SECRET, verify_url=agent.verify_url, timeout=5)
    manual_outbox.set_verifier(hook.verify)
    try:
        first = await manual_outbox.accept(WS, SES, "u", "c1", "one")
        second = await manual_outbox.accept(WS, SES, "u", "c2", "two")
        await manual_outbox.deliver_once(WS, SES, hook)  # cut after the agent recorded it
        clock.advance(FAST.verify_delay)
        await manual_outbox.deliver_once(WS, SES, hook)  # verified: held in its turn
        assert [e.id for e in await manual_outbox.list(WS, SES)] == [second.id]
        clock.advance(FAST.turn_check_interval)
        await manual_outbox.deliver_once(WS, SES, hook)  # the check: ended
        await manual_outbox.deliver_once(WS, SES, hook)  # the next prompt goes
        assert agent.recorded(first.id) and agent.recorded(second.id)
        assert agent.seen[first.id] == 1
    finally:
        await hook.aclose()
        agent.close()
