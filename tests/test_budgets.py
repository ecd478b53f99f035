"""A workspace's byte budget (docs/design.md, "What one tenant may store"): what it holds
in Valkey (its queued entries, measured by MEMORY USAGE; its event logs, counted per window of
``event_log_ttl``; its dedupe and claim markers, per window of their life) may not pass
``workspace_budget_share`` of the node's maxmemory. Past it accepts, edits and a client's
retries (the writes a client drives) are refused with nothing written, in O(1), while other
workspaces go on and deliveries keep logging; each session's log begins again past
``event_log_bytes``, and its bytes come off the count. The red team's attack in small: a
40 kB budget, 4 kB texts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest

from prompt_outbox import (
    DismissResult,
    Duplicate,
    EditResult,
    Outbox,
    Status,
    WorkspaceBytesFull,
)
from prompt_outbox.api import TokenTable
from prompt_outbox.api.auth import Principal
from prompt_outbox.api.limits import TokenBudgets
from prompt_outbox.core.events import EventLogState, QueueEvent, QueueReset, missed_events
from prompt_outbox.core.keys import SessionKeys, WorkspaceKeys
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.feed import EventFeed, LogBegan
from prompt_outbox.storage.replies import text
from prompt_outbox.storage.store import Store
from tests import tally
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, OPS, serve
from tests.support.clock import ManualClock
from tests.support.entries import everything
from tests.support.memory import maxmemory
from tests.support.tunables import FAST
from tests.support.waiting import eventually

pytestmark = pytest.mark.cluster_too

WS = "acme"
BOB = {"Authorization": "Bearer bob-token"}  # tests/test_api.py's tokens: bob has "other"
MAXMEMORY = 512 * 1024 * 1024
"""Given to every primary for each test: the budget is a share of it (and the memory
ceiling, at 0.8 of it, far above what a test stores)."""
LIMIT = 40_000
TIGHT = replace(FAST, workspace_budget_share=LIMIT / MAXMEMORY)
"""The day-long windows of the default ``event_log_ttl``: no boundary falls inside a test but
once a day, so a refusal that the current window's bytes make holds for the whole test."""
TEXT = "x" * 4000


@pytest.fixture(autouse=True)
async def budgeted(client: Client) -> AsyncIterator[None]:
    async with maxmemory(client, MAXMEMORY):
        yield


async def edit_until_refused(
    outbox: Outbox, ses: str, entry_id: str, limit: int = LIMIT
) -> WorkspaceBytesFull:
    """Edit one entry with 4 kB texts until its workspace's budget (``limit``) refuses one."""
    for n in range(100):
        try:
            assert await outbox.edit(WS, ses, entry_id, text=f"{n} {TEXT}") is EditResult.UPDATED
        except WorkspaceBytesFull as full:
            # Each edit logged its ~4 kB: the budget was met within limit / 4 kB edits.
            assert n <= limit // len(TEXT) + 1
            return full
    raise AssertionError(f"100 edits of 4 kB were never refused at a budget of {limit}")


async def written(client: Client, ws: str = WS) -> dict[str, int]:
    """What the workspace's written-bytes count holds: its log windows (``logs``), its marker
    windows (``markers``), summed over the windows."""
    raw = await client.hgetall(WorkspaceKeys(ws).log_bytes)  # type: ignore[misc]
    fields = {text(f): text(v) for f, v in raw.items()}
    return {
        "logs": sum(int(v) for f, v in fields.items() if f.isdigit()),
        "markers": sum(int(v) for f, v in fields.items() if f.startswith("m")),
    }


async def log_of(client: Client, ses: str) -> list[tuple[str, dict[str, str]]]:
    rows = await client.xrange(SessionKeys(WS, ses).events)  # type: ignore[misc]
    return [(text(i), {text(k): text(v) for k, v in f.items()}) for i, f in rows]


async def test_an_edit_loop_stops_at_the_budget_with_nothing_written_while_others_go_on(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    full = await edit_until_refused(outbox, "s1", entry.id)
    assert full.logs >= LIMIT - 2 * len(TEXT) - full.queued  # in about LIMIT / 4 kB edits
    assert abs(full.limit - LIMIT) <= 1 and full.used + len(TEXT) > full.limit
    assert full.used == full.queued + full.logs + full.markers
    assert full.logs > full.queued > len(TEXT)  # the entry, and every edit's event
    # When a window boundary clears it; or at once, if delivering the entry would.
    assert full.retry_after is None or 0 < full.retry_after <= 2 * TIGHT.event_log_ttl
    assert "budget" in str(full)
    before = await everything(client)
    with pytest.raises(WorkspaceBytesFull):
        await outbox.edit(WS, "s1", entry.id, text=TEXT)
    with pytest.raises(WorkspaceBytesFull):  # a new session is the same workspace
        await outbox.accept(WS, "s2", "u", "c2", TEXT)
    assert await everything(client) == before  # no entry, event, marker or count moved
    assert outbox.metrics.refused_bytes_full._value.get() == 3
    # A client's retry of an accepted prompt still learns its ID: the dedupe comes first.
    with pytest.raises(Duplicate):
        await outbox.accept(WS, "s1", "u", "c1", "seed")
    # Another workspace is not held back by this one's bytes.
    other = await outbox.accept("other", "s1", "u", "c1", TEXT)
    assert await outbox.edit("other", "s1", other.id, text="fine") is EditResult.UPDATED
    # A cleanup (the operator's way out) takes the count with the logs.
    await outbox.cleanup_workspace(WS)
    assert not await client.exists(WorkspaceKeys(WS).log_bytes)
    await outbox.accept(WS, "s1", "u", "c9", "after the cleanup")


async def test_an_accept_and_dismiss_loop_stops_at_the_budget_though_few_entries_are_held(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    cmid = "c" * 200  # dedupe markers take their key's bytes: counted too
    for n in range(100):
        try:
            entry = await outbox.accept(WS, "s1", "u", f"{cmid}{n}", f"{n} {TEXT}")
        except WorkspaceBytesFull as full:
            assert full.queued == 0  # only the windows can make room: they say when
            assert full.retry_after is not None and 0 < full.retry_after <= 2 * 86_400
            break
        assert await outbox.dismiss(WS, "s1", entry.id) is DismissResult.REMOVED
    else:
        raise AssertionError("100 accepts of 4 kB were never refused at a 40 kB budget")
    assert n <= LIMIT // len(TEXT) + 1
    assert await outbox.list(WS, "s1") == []  # the workspace quota counted nothing
    counted = await written(client)
    # Each accept's marker and fingerprint, with their keys, beside what the logs took.
    marker = len(SessionKeys(WS, "s1").dedupe(f"{cmid}0")) + 26
    assert counted["markers"] >= n * 2 * marker
    assert counted["logs"] + counted["markers"] + len(TEXT) > LIMIT
    await outbox.accept("other", "s1", "u", "c1", TEXT)


async def test_queued_entries_count_at_what_they_take_and_dismissals_free_it(
    client: Client, clock: ManualClock
) -> None:
    # A cap of entries would have let 10,000 of them in, whatever their size: the budget
    # counts what they take (MEMORY USAGE of the lists), beside their events.
    outbox = Outbox(client, TIGHT, clock=clock)
    accepted = []
    for n in range(100):
        try:
            accepted.append(await outbox.accept(WS, f"s{n % 3}", "u", f"c{n}", f"{n} {TEXT}"))
        except WorkspaceBytesFull as full:
            assert full.queued >= len(accepted) * len(TEXT)
            assert full.retry_after is None  # taking entries off makes room: Retry-After 10 s
            break
    else:
        raise AssertionError("100 accepts of 4 kB were never refused at a 40 kB budget")
    assert len(accepted) <= LIMIT // len(TEXT)
    assert await tally.sized(client, WS) == await tally.resized(client, WS)
    for entry in accepted[:3]:
        ses = f"s{accepted.index(entry) % 3}"
        assert await outbox.dismiss(WS, ses, entry.id) is DismissResult.REMOVED
    await outbox.accept(WS, "s0", "u", "again", TEXT)  # the dismissed entries made room
    assert await tally.sized(client, WS) == await tally.resized(client, WS)


async def test_the_budget_is_a_share_of_the_nodes_maxmemory_read_as_it_changes(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, replace(TIGHT, memory_check_interval=0.001), clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    full = await edit_until_refused(outbox, "s1", entry.id)
    async with maxmemory(client, 2 * MAXMEMORY):  # twice the memory: twice the budget
        await asyncio.sleep(0.01)  # past the reading's interval (a millisecond here)
        assert await outbox.edit(WS, "s1", entry.id, text=TEXT) is EditResult.UPDATED
        again = await edit_until_refused(outbox, "s1", entry.id)
        assert abs(again.limit - 2 * full.limit) <= 2


async def test_a_log_per_session_counts_what_each_new_log_takes_not_only_its_event(
    client: Client, clock: ManualClock
) -> None:
    # A new stream costs Valkey about 4 KiB (its first node) however small its event: one
    # tiny accept into each of many new sessions, dismissed, is counted at that.
    outbox = Outbox(client, TIGHT, clock=clock)
    for n in range(100):
        try:
            entry = await outbox.accept(WS, f"s{n}", "u", "c", "x")
        except WorkspaceBytesFull:
            break
        await outbox.dismiss(WS, f"s{n}", entry.id)
    else:
        raise AssertionError("100 new logs were never refused at a 40 kB budget")
    memory = 0
    for i in range(n):
        memory += int(await client.memory_usage(SessionKeys(WS, f"s{i}").events) or 0)
    assert (await written(client))["logs"] >= memory  # the count covers what the logs hold
    assert n <= LIMIT // 2000  # ~4 kB a log: a count of the events alone let in ~90


async def test_a_log_past_its_bytes_begins_again_and_its_bytes_come_off_the_count(
    client: Client, clock: ManualClock
) -> None:
    bound = 64 * 1024
    outbox = Outbox(client, replace(FAST, event_log_bytes=bound), clock=clock)
    big = "y" * 10_000
    a = await outbox.accept(WS, "s1", "u", "a", big)
    stream = outbox.watch(WS, "s1")
    opening = await _next(stream)
    assert isinstance(opening, QueueReset)
    first_log = await log_of(client, "s1")
    lengths = []
    for n in range(20):  # ~10 kB an edit: the log reaches 64 kB within seven
        await outbox.edit(WS, "s1", a.id, text=f"{n} {big}")
        # A reader that keeps up goes on across each new beginning: it missed nothing.
        update = await _next(stream)
        assert isinstance(update, QueueEvent) and update.kind == "edited"
        assert update.entry is not None and update.entry.text.startswith(f"{n} ")
        log = await log_of(client, "s1")
        lengths.append(len(log))
        counted = (await written(client))["logs"]
        assert counted <= bound  # what the log holds, never every edit
        carried = sum(len(i) + sum(len(k) + len(v) for k, v in f.items()) for i, f in log)
        assert counted >= carried
    await stream.aclose()
    # It began again (one event), and grew again from there (its own bytes only count).
    began_at = lengths.index(1)
    assert max(lengths) >= 5 and lengths[began_at + 1 : began_at + 3] == [2, 3], lengths
    (began_id, began), *_ = await log_of(client, "s1")
    assert began.get("began") == "1" and began_id > first_log[-1][0]  # IDs keep rising
    # A reader that stood at the end of the old log resumes in the new one; one that stood
    # further back gets a reset with the entry as it stands, never a silent gap ...
    assert await first_update(outbox, began["after"]) == began_id
    reset = await first_update(outbox, first_log[0][0])
    assert isinstance(reset, QueueReset) and reset.entries[0].text.startswith("19 ")
    # ... and a live follower further back ends (its client resumes: that reset).
    feed = EventFeed(Store(client))
    with feed.follow(SessionKeys(WS, "s1"), first_log[0][0]) as behind, pytest.raises(LogBegan):
        await behind.next(5)
    await outbox.aclose()


async def first_update(outbox: Outbox, position: str) -> str | QueueReset:
    """What a reader resuming from ``position`` gets first: an update's event ID, or a reset."""
    stream = outbox.watch(WS, "s1", last_event_id=position)
    try:
        item = await _next(stream)
    finally:
        await stream.aclose()
    return item if isinstance(item, QueueReset) else item.event_id


async def test_a_clients_retries_stop_at_the_budget_with_nothing_written_dismissals_go_on(
    client: Client, clock: ManualClock
) -> None:
    # Entries of 4 kB, whose failures log ~24 kB each: a budget of 100 kB.
    limit = 100_000
    outbox = Outbox(client, replace(TIGHT, workspace_budget_share=limit / MAXMEMORY), clock=clock)
    failed = []
    for ses in ("s1", "s2"):
        await outbox.accept(WS, ses, "u", "c1", f"fails {TEXT}")
        agent = ScriptedAgent([RuntimeError("refused")] * FAST.max_attempts)
        for _ in range(FAST.max_attempts):
            assert await outbox.deliver_once(WS, ses, agent)
            clock.advance(60)
        [entry] = await outbox.list(WS, ses)
        assert entry.status is Status.ERROR
        failed.append(entry)
    other = await outbox.accept(WS, "s3", "u", "c1", "seed")
    await edit_until_refused(outbox, "s3", other.id, limit)
    before = await everything(client)
    # A retry re-arms an entry for more moves, each logging it whole: refused like an accept.
    with pytest.raises(WorkspaceBytesFull):
        await outbox.retry(WS, "s1", failed[0].id)
    with pytest.raises(WorkspaceBytesFull):
        await outbox.retry_errors(WS)
    assert await everything(client) == before
    # A dismissal frees room: never refused.
    assert await outbox.dismiss(WS, "s2", failed[1].id) is DismissResult.REMOVED


async def test_deliveries_and_the_engines_retries_keep_logging_past_the_budget(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    a = await outbox.accept(WS, "s1", "u", "a", "first")
    b = await outbox.accept(WS, "s1", "u", "b", "second")
    await edit_until_refused(outbox, "s1", b.id)
    logged = (await written(client))["logs"]
    seen = len(await log_of(client, "s1"))
    agent = ScriptedAgent([RuntimeError("refused"), None, None])
    assert await outbox.deliver_once(WS, "s1", agent)  # a fails: back to pending, attempt 1
    clock.advance(60)
    assert await outbox.deliver_once(WS, "s1", agent)
    assert await outbox.deliver_once(WS, "s1", agent)
    assert await outbox.list(WS, "s1") == []
    tail = [(f["kind"], f["id"]) for _, f in (await log_of(client, "s1"))[seen:]]
    assert tail == [
        ("delivering", a.id),
        ("pending", a.id),
        ("delivering", a.id),
        ("sent", a.id),
        ("delivering", b.id),
        ("sent", b.id),
    ]
    assert (await written(client))["logs"] > logged  # counted, never refused


async def test_after_the_windows_pass_the_workspace_may_write_again(
    client: Client, clock: ManualClock
) -> None:
    # Windows of a second, on the server's clock: the ten edits to the budget must fall in
    # two of them, and a loaded machine may stall the loop for a good part of one.
    ttl = 1.0
    outbox = Outbox(client, replace(TIGHT, event_log_ttl=ttl), clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    full = await edit_until_refused(outbox, "s1", entry.id)
    assert full.retry_after is None or 0 < full.retry_after <= 2 * ttl
    key = WorkspaceKeys(WS).log_bytes

    async def edited() -> bool:
        try:
            done = await outbox.edit(WS, "s1", entry.id, text="later") is EditResult.UPDATED
        except WorkspaceBytesFull:
            return False
        # At once: the count's key lives on at least a window from this edit.
        assert await client.exists(key)
        return done

    assert await eventually(edited, within=20 * ttl)
    # The count's key goes with its last window: the accept's markers', two of their own at
    # most (an hour each at least: a claim marker lives that long).
    left_ms = await client.pttl(key)  # type: ignore[misc]
    assert 0 < left_ms <= 2 * 3_600_000


async def _gone(client: Client, key: str) -> bool:
    return not await client.exists(key)


async def _expires_at(client: Client, key: str) -> int:
    return int(await client.execute_command("PEXPIRETIME", key))  # type: ignore[no-untyped-call]


async def test_a_logs_expiry_runs_from_its_first_event_not_its_last(
    outbox: Outbox, client: Client
) -> None:
    k = SessionKeys(WS, "s1")
    entry = await outbox.accept(WS, "s1", "u", "c1", "first")
    [(first_id, fields)] = await log_of(client, "s1")
    assert fields["began"] == "1"  # a log's first event says so (the feed's restart check)
    expires = await _expires_at(client, k.events)
    ttl_ms = round(outbox.tunables.event_log_ttl * 1000)
    assert abs(expires - (int(first_id.split("-")[0]) + ttl_ms)) < 1000
    for n in range(3):
        await asyncio.sleep(0.005)  # a later millisecond: today's code would push it back
        await outbox.edit(WS, "s1", entry.id, text=f"later {n}")
        await outbox.accept(WS, "s1", "u", f"n{n}", "more")
        assert await _expires_at(client, k.events) == expires  # never pushed back
    assert all("began" not in f for _, f in (await log_of(client, "s1"))[1:])


async def _next(stream: AsyncIterator[QueueEvent | QueueReset | None]) -> QueueEvent | QueueReset:
    while (item := await anext(stream)) is None:
        pass
    return item


async def resumed(outbox: Outbox, position: str) -> list[str]:
    """The entries of the reset a reader resuming from ``position`` gets first (it fails if
    the first thing it gets is no reset)."""
    stream = outbox.watch(WS, "s1", last_event_id=position)
    reset = await _next(stream)
    await stream.aclose()
    await outbox.aclose()
    assert isinstance(reset, QueueReset)
    return [e.id for e in reset.entries]


async def test_a_busy_log_begins_again_and_a_reader_resuming_across_gets_a_reset(
    client: Client,
) -> None:
    ttl = 0.5
    outbox = Outbox(client, replace(FAST, event_log_ttl=ttl))
    a = await outbox.accept(WS, "s1", "u", "a", "first")
    [(position, _)] = await log_of(client, "s1")  # a reader saw up to here
    b = await outbox.accept(WS, "s1", "u", "b", "second")  # what it must not miss
    began, fields = position, dict[str, str]()
    for n in range(200):  # events keep coming: today's logs would never expire
        await outbox.edit(WS, "s1", b.id, text=f"second, edit {n}")
        began, fields = (await log_of(client, "s1"))[0]  # one read: the new log may go too
        if began != position:
            break
        await asyncio.sleep(ttl / 10)
    assert began != position, "the log never began again while events kept coming"
    assert fields.get("began") == "1"
    assert await resumed(outbox, position) == [a.id, b.id]


async def test_a_follower_whose_log_began_again_ends_and_its_resume_gets_a_reset(
    client: Client,
) -> None:
    # Logs that live a day, the old one expired by hand (the real TTL: the tests above). With
    # a short event_log_ttl, b's log could expire before a loaded machine's first read (b's
    # notice comes before the follower subscribes), and the stream then waited for ever.
    outbox = Outbox(client, FAST)
    events = SessionKeys(WS, "s1").events
    a = await outbox.accept(WS, "s1", "u", "a", "first")
    stream = outbox.watch(WS, "s1")
    opening = await _next(stream)
    assert isinstance(opening, QueueReset)
    # The log expires under the follower (its last events might have been unread) ...
    await client.pexpire(events, 1)
    assert await eventually(lambda: _gone(client, events))
    b = await outbox.accept(WS, "s1", "u", "b", "second")
    # ... so when it begins again, the stream ends rather than go on from the new log.
    with pytest.raises(LogBegan):
        await _next(stream)
    assert await resumed(outbox, opening.event_id) == [a.id, b.id]


def test_a_position_in_a_log_that_began_again_since_gets_a_reset() -> None:
    # Younger than a log lives, yet before the first event of the log there now: the log it
    # stood in expired (from its first event) and another began, so events may be gone.
    ttl_ms = 1000
    position = "5000-0"
    log = EventLogState(first="5900-0", last="5950-0", length=3, added=3, now_ms=5600 + 400)
    assert missed_events(position, log, ttl_ms)
    # Inside the log there now: nothing can be gone.
    inside = EventLogState(first="4900-0", last="5950-0", length=9, added=9, now_ms=6000)
    assert not missed_events(position, inside, ttl_ms)


async def test_the_api_answers_429_workspace_bytes_full_with_retry_after(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    await edit_until_refused(outbox, "s1", entry.id)
    url = f"/v1/workspaces/{WS}/sessions/s1/prompts"
    async for http in serve(outbox):
        refusals = [
            await http.post(url, json={"clientMessageID": "c2", "text": TEXT}, headers=ALICE),
            await http.patch(f"{url}/{entry.id}", json={"text": TEXT}, headers=ALICE),
        ]
        for r in refusals:
            assert r.status_code == 429, r.text
            assert r.json()["error"] == "workspace_bytes_full"
            assert "budget" in r.json()["detail"]
            assert 1 <= int(r.headers["Retry-After"]) <= 2 * TIGHT.event_log_ttl
        other = "/v1/workspaces/other/sessions/s1/prompts"
        r = await http.post(other, json={"clientMessageID": "c2", "text": "hi"}, headers=BOB)
        assert r.status_code == 202, r.text


MULTI = {"Authorization": "Bearer multi-token"}
MULTI_TOKENS = TokenTable.from_json(
    json.dumps(
        {
            "tokens": [
                {"token": "multi-token", "user": "m", "workspaces": ["w0", "w1", "w2"]},
                {"token": "bob-token", "user": "bob", "workspaces": ["other"]},
                {"token": "ops-token", "user": "ops", "admin": True},
            ]
        }
    )
)


async def accept_over_http(
    http: httpx.AsyncClient, ws: str, n: int, token: dict[str, str] = MULTI
) -> httpx.Response:
    url = f"/v1/workspaces/{ws}/sessions/s{n % 5}/prompts"
    return await http.post(url, json={"clientMessageID": f"c{n}", "text": TEXT}, headers=token)


async def test_a_token_over_several_workspaces_stops_at_its_own_budget_while_others_go_on(
    client: Client, clock: ManualClock
) -> None:
    # Each workspace may hold 40 kB, the token's three together 50 kB: each of its workspaces
    # stays under its own budget, and the token still stops at its share.
    tunables = replace(TIGHT, memory_check_interval=0.001)  # each write sees the last one
    outbox = Outbox(client, tunables, clock=clock)
    share = 50_000 / MAXMEMORY
    async for http in serve(outbox, MULTI_TOKENS, token_budget_share=share):
        answers = [await accept_over_http(http, ws, n) for ws in ("w0", "w1") for n in range(3)]
        assert [r.status_code for r in answers] == [202] * 6  # ~28 kB each: under 40 kB
        r = await accept_over_http(http, "w2", 0)
        assert (r.status_code, r.json()["error"]) == (429, "token_bytes_full"), r.text
        assert "budget" in r.json()["detail"] and r.headers["Retry-After"] == "10"
        use = [await outbox.overview.budget(ws) for ws in ("w0", "w1", "w2")]
        assert all(u.used < u.limit for u in use)  # no workspace is at its own
        assert sum(u.used for u in use) >= int(share * MAXMEMORY)
        # The token's retries stop too; another token's accepts go on, and so do an
        # operator's in the token's workspaces (an admin token has no such budget).
        retried = await http.post("/v1/workspaces/w0/errors/retry", headers=MULTI)
        assert (retried.status_code, retried.json()["error"]) == (429, "token_bytes_full")
        assert (await accept_over_http(http, "other", 1, BOB)).status_code == 202
        assert (await accept_over_http(http, "w2", 99, OPS)).status_code == 202


def test_a_token_whose_workspaces_cannot_pass_its_budget_is_never_read_for_it() -> None:
    budgets = TokenBudgets(0.25, 0.1)
    one = Principal("u", frozenset({"a"}))
    assert not budgets.bounds(one)  # its workspace's own budget is smaller
    assert not budgets.bounds(Principal("u", frozenset({"a", "b"})))  # 0.2 <= 0.25
    assert budgets.bounds(Principal("u", frozenset({"a", "b", "c"})))
    assert not budgets.bounds(Principal("ops", frozenset({"a", "b", "c"}), admin=True))
    assert TokenBudgets(0.05, 0.1).bounds(one)  # a token's share below a workspace's


async def test_a_flood_of_delivered_prompts_stops_at_the_tenants_share_and_others_go_on(
    client: Client, clock: ManualClock
) -> None:
    # The red team's run in small, at the default shares: 100 kB prompts accepted and
    # delivered at once (nothing stays queued) filled a shared Valkey through the event logs.
    async with maxmemory(client, 64 * 1024 * 1024):
        outbox = Outbox(client, replace(FAST, memory_check_interval=0.001), clock=clock)
        big, agent = "z" * 100_000, ScriptedAgent()
        # One session: its log begins again past event_log_bytes, so what the log keeps of
        # delivered prompts stays bounded in bytes, however many pass through it.
        for n in range(30):
            await outbox.accept(WS, "one", "u", f"c{n}", big)
            assert await outbox.deliver_once(WS, "one", agent)
        use = await outbox.overview.budget(WS)
        assert use.queued == 0 and use.logs <= outbox.tunables.event_log_bytes + 3 * len(big)
        # A log a session: the tenant stops at its share of the memory.
        for n in range(200):
            try:
                await outbox.accept(WS, f"s{n}", "u", "c", big)
            except WorkspaceBytesFull as full:
                assert full.limit == use.limit == int(0.1 * 64 * 1024 * 1024)
                break
            assert await outbox.deliver_once(WS, f"s{n}", agent)
        else:
            raise AssertionError("200 sessions of delivered 100 kB prompts were never refused")
        assert (await outbox.overview.budget(WS)).used <= use.limit
        await outbox.accept("other", "s1", "u", "c1", big)  # no storage_full for the others
