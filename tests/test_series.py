"""The queue page's time series and a session's history: the scripts count accepted, delivered and
failed prompts per minute and record the oldest pending entry in a bounded ring (``lua/lib.lua``
series); ``Overview.series`` carries the oldest forward over quiet minutes; ``Overview.history``
reads delivered prompts and their turns from the event log. Against a real Valkey (and the
cluster: the ring key is named inside the scripts)."""

from __future__ import annotations

import httpx
import pytest

from prompt_outbox import Entry, Outbox, Turn, ambiguous
from prompt_outbox.core.callbacks import DismissResult, RetryResult
from prompt_outbox.core.entry import Status
from prompt_outbox.core.errors import InvalidInput
from prompt_outbox.core.keys import WorkspaceKeys
from prompt_outbox.overview import SeriesPoint
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.series import SERIES_SLOTS
from tests.agents import ScriptedAgent, ScriptedVerifier
from tests.support.api import ALICE, URL
from tests.support.clock import ManualClock
from tests.support.tunables import FAST

BOB = {"Authorization": "Bearer bob-token"}  # tests/test_api.py's token of workspace "other"

pytestmark = pytest.mark.cluster_too

WS = "acme"


def counted(p: SeriesPoint) -> tuple[int, int, int]:
    return p.accepted, p.delivered, p.failed


async def test_the_series_counts_each_minute_and_carries_the_oldest_over_quiet_ones(
    client: Client,
) -> None:
    clock = ManualClock()  # 12:00:00 exactly: minute boundaries are the test's
    outbox = Outbox(client, FAST, clock=clock)
    for i in range(3):
        await outbox.accept(WS, "s", "u", f"c{i}", f"prompt {i}")
    clock.advance(60)  # minute 1: one delivered, one failed (ambiguous, no verifier)
    assert await outbox.deliver_once(WS, "s", ScriptedAgent())
    assert await outbox.deliver_once(WS, "s", ScriptedAgent([ambiguous("cut")]))
    clock.advance(60 * 6 + 30)  # five quiet minutes (12:02-12:06), then half of 12:07
    points = await outbox.overview.series(WS, minutes=8)
    assert [counted(p) for p in points] == [(3, 0, 0), (0, 1, 1)] + [(0, 0, 0)] * 6
    # The third prompt (accepted at 12:00) waits on: its age at each minute's end, the
    # quiet minutes' from the record of minute 1, the current minute's read now.
    ages = [p.oldest_pending_for for p in points]
    assert ages == [60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 420.0, 450.0]
    assert points[-1].start_ms - points[0].start_ms == 7 * 60_000

    assert await outbox.deliver_once(WS, "s", ScriptedAgent())  # nothing pending now
    [now] = await outbox.overview.series(WS, minutes=1)
    assert counted(now) == (0, 1, 0) and now.oldest_pending_for == 0.0
    # A workspace that never recorded anything: its past is unknown, its present is known.
    empty = await outbox.overview.series("other", minutes=2)
    assert [p.oldest_pending_for for p in empty] == [None, 0.0]
    with pytest.raises(InvalidInput):
        await outbox.overview.series(WS, minutes=SERIES_SLOTS)


async def test_a_dismiss_that_moves_the_oldest_is_recorded_in_its_minute(client: Client) -> None:
    # replace.lua counts no flow for a dismiss, yet the workspace's oldest moves: without its
    # own record the quiet minutes after it would show the dismissed entry still aging.
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    old = await outbox.accept(WS, "a", "u", "c1", "old")  # 12:00
    clock.advance(60)
    await outbox.accept(WS, "b", "u", "c2", "new")  # 12:01
    clock.advance(60)
    assert await outbox.dismiss(WS, "a", old.id) is DismissResult.REMOVED  # 12:02
    clock.advance(60 * 2 + 30)  # two quiet minutes, then half of 12:04
    points = await outbox.overview.series(WS, minutes=5)
    assert [counted(p) for p in points] == [(1, 0, 0), (1, 0, 0)] + [(0, 0, 0)] * 3
    # From 12:02 the oldest is "new" (12:01), not the dismissed "old" (12:00).
    assert [p.oldest_pending_for for p in points] == [60.0, 120.0, 120.0, 180.0, 210.0]


async def test_a_stage_that_moves_the_oldest_is_recorded_in_its_minute(client: Client) -> None:
    # Staging the workspace's oldest pending entry makes the next one the oldest (stage.lua,
    # at the staged copy's send start); the agent reads the series a minute later, mid-send.
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    await outbox.accept(WS, "a", "u", "c1", "first")  # 12:00
    clock.advance(60)
    await outbox.accept(WS, "b", "u", "c2", "second")  # 12:01
    clock.advance(60)  # 12:02: the stage
    seen: list[SeriesPoint] = []

    async def agent(ws: str, ses: str, entry: Entry) -> Turn | None:
        clock.advance(60)  # 12:03, the send still on
        seen.extend(await outbox.overview.series(WS, minutes=2))
        return None

    assert await outbox.deliver_once(WS, "a", agent)
    # 12:02's end (12:03) and now (12:03): "second" (12:01) has waited 120 s; "first" is out.
    assert [(counted(p), p.oldest_pending_for) for p in seen] == [
        ((0, 0, 0), 120.0),
        ((0, 0, 0), 120.0),
    ]


async def test_the_ring_holds_at_most_its_slots_and_expires(client: Client) -> None:
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    for i in range(SERIES_SLOTS + 10):  # one accept a minute, for more minutes than slots
        await outbox.accept(WS, f"s{i}", "u", "c", "x")
        clock.advance(60)
    key = WorkspaceKeys(WS).series
    assert await client.hlen(key) == SERIES_SLOTS  # type: ignore[misc]
    assert 0 < await client.pttl(key) <= SERIES_SLOTS * 60_000
    # The oldest lap was started again: the first ten minutes are gone, the rest counted.
    points = await outbox.overview.series(WS, minutes=SERIES_SLOTS // 2)
    assert [p.accepted for p in points] == [1] * (SERIES_SLOTS // 2 - 1) + [0]


async def test_history_lists_delivered_prompts_with_their_turns(client: Client) -> None:
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    turns = iter(["t-1", "t-2"])

    async def turned(ws: str, ses: str, entry: Entry) -> Turn | None:
        return Turn(next(turns)) if entry.text != "plain" else None

    first = await outbox.accept(WS, "s", "u", "c1", "first")
    second = await outbox.accept(WS, "s", "u", "c2", "plain")
    third = await outbox.accept(WS, "s", "u", "c3", "third")
    assert await outbox.deliver_once(WS, "s", turned)
    clock.advance(42.5)
    assert (await outbox.end_turn(WS, "s", "t-1")).ended
    assert await outbox.deliver_once(WS, "s", turned)
    assert await outbox.deliver_once(WS, "s", turned)  # t-2 runs on
    got = await outbox.overview.history(WS, "s")
    assert [(d.id, d.turn, d.turn_seconds, d.turn_why) for d in got] == [
        (third.id, "t-2", None, ""),
        (second.id, None, None, ""),
        (first.id, "t-1", 42.5, "ended"),
    ]
    assert got[0].sent_ms >= got[1].sent_ms >= got[2].sent_ms > 0
    assert await outbox.overview.history(WS, "nobody") == []


COUNTED = ("accepted", "delivered", "failed")


async def test_the_routes_answer_a_workspaces_own_token_only(
    http: httpx.AsyncClient, outbox: Outbox
) -> None:
    r = await http.post(URL, json={"clientMessageID": "m1", "text": "hi"}, headers=ALICE)
    assert r.status_code == 202, r.text
    assert await outbox.deliver_once("acme", "chat-1", ScriptedAgent())
    r = await http.get("/v1/workspaces/acme/series", params={"minutes": 3}, headers=ALICE)
    assert r.status_code == 200, r.text
    minutes = r.json()["minutes"]
    # Real time: the accept and the delivery may fall either side of a minute's turn.
    assert len(minutes) == 3 and [sum(m[k] for m in minutes) for k in COUNTED] == [1, 1, 0]
    assert minutes[-1]["oldestPendingFor"] == 0
    assert minutes[-1]["at"].endswith(":00.000000Z")
    r = await http.get("/v1/workspaces/acme/sessions/chat-1/history", headers=ALICE)
    assert r.status_code == 200, r.text
    [d] = r.json()["delivered"]
    assert d["turn"] is None and d["turnFor"] is None and d["sentAt"].endswith("Z")
    # Another tenant's token sees neither: 403, as for every route of the workspace.
    for path in ("/v1/workspaces/acme/series", "/v1/workspaces/acme/sessions/chat-1/history"):
        r = await http.get(path, headers=BOB)
        assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
    for bad in ({"minutes": 0}, {"minutes": 61}, {"minutes": "x"}):
        r = await http.get("/v1/workspaces/acme/series", params=bad, headers=ALICE)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text


async def test_a_failure_at_the_verify_step_is_counted_once(client: Client) -> None:
    # The ambiguous send goes to verifying (restore.lua); with no verifier left, the verify
    # step moves it into error in the queue (replace.lua): one failure, counted there.
    clock = ManualClock()
    outbox = Outbox(client, FAST, clock=clock)
    outbox.set_verifier(ScriptedVerifier([]))
    await outbox.accept(WS, "s", "u", "c1", "one")
    assert await outbox.deliver_once(WS, "s", ScriptedAgent([ambiguous("cut")]))
    assert [e.status for e in await outbox.list(WS, "s")] == [Status.VERIFYING]
    outbox.set_verifier(None)
    clock.advance(FAST.max_verify_backoff + FAST.max_backoff)
    assert await outbox.deliver_once(WS, "s", ScriptedAgent())
    assert [e.status for e in await outbox.list(WS, "s")] == [Status.ERROR]
    [now] = await outbox.overview.series(WS, minutes=1)
    assert counted(now) == (1, 0, 1)
    # Retrying it is no failure (error -> pending); failing it again is one more.
    retried = await outbox.retry(WS, "s", (await outbox.list(WS, "s"))[0].id)
    assert retried is RetryResult.UPDATED
    [now] = await outbox.overview.series(WS, minutes=1)
    assert counted(now) == (1, 0, 1)
    assert await outbox.deliver_once(WS, "s", ScriptedAgent([ambiguous("cut again")]))
    [now] = await outbox.overview.series(WS, minutes=1)
    assert counted(now) == (1, 0, 2)
