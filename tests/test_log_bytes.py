"""The bound on what one workspace's event logs may hold (docs/security.md: edits were unmetered):
each event's bytes are counted per workspace and per window of ``event_log_ttl`` (``emit`` in
``lua/lib.lua``); a log lives ``event_log_ttl`` from its FIRST event, so the current and the
previous window hold every byte the logs can still hold. Past ``workspace_log_bytes`` accepts and
edits (the writes a client drives, each logging a whole entry) are refused with nothing written,
in O(1), while other workspaces go on and deliveries keep logging. The red-team's attack in small:
a tiny bound, 4 kB texts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from prompt_outbox import (
    DismissResult,
    Duplicate,
    EditResult,
    Outbox,
    Status,
    WorkspaceLogsFull,
)
from prompt_outbox.core.events import EventLogState, QueueEvent, QueueReset, missed_events
from prompt_outbox.core.keys import SessionKeys, WorkspaceKeys
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.feed import LogBegan
from prompt_outbox.storage.replies import text
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, serve
from tests.support.clock import ManualClock
from tests.support.entries import everything
from tests.support.tunables import FAST
from tests.support.waiting import eventually

pytestmark = pytest.mark.cluster_too

WS = "acme"
BOB = {"Authorization": "Bearer bob-token"}  # tests/test_api.py's tokens: bob has "other"
LIMIT = 40_000
TIGHT = replace(FAST, workspace_log_bytes=LIMIT)
"""The day-long windows of the default ``event_log_ttl``: no boundary falls inside a test but
once a day, so a refusal that the current window's bytes make holds for the whole test."""
TEXT = "x" * 4000


async def edit_until_refused(outbox: Outbox, ses: str, entry_id: str) -> WorkspaceLogsFull:
    """Edit one entry with 4 kB texts until its workspace's log bound refuses an edit."""
    for n in range(100):
        try:
            assert await outbox.edit(WS, ses, entry_id, text=f"{n} {TEXT}") is EditResult.UPDATED
        except WorkspaceLogsFull as full:
            # Each edit logged its ~4 kB: the bound was met in about LIMIT / 4 kB edits.
            assert LIMIT // (2 * len(TEXT)) <= n <= LIMIT // len(TEXT) + 1
            return full
    raise AssertionError("100 edits of 4 kB were never refused at a 40 kB bound")


async def logged_bytes(client: Client, ws: str = WS) -> int:
    """What the workspace's log bytes count holds, over its windows."""
    raw = await client.hgetall(WorkspaceKeys(ws).log_bytes)  # type: ignore[misc]
    return sum(int(v) for v in raw.values())


async def log_of(client: Client, ses: str) -> list[tuple[str, dict[str, str]]]:
    rows = await client.xrange(SessionKeys(WS, ses).events)  # type: ignore[misc]
    return [(text(i), {text(k): text(v) for k, v in f.items()}) for i, f in rows]


async def test_an_edit_loop_stops_at_the_bound_with_nothing_written_while_others_go_on(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    full = await edit_until_refused(outbox, "s1", entry.id)
    assert full.limit == LIMIT and full.used >= LIMIT
    assert 0 < full.retry_after <= 2 * TIGHT.event_log_ttl  # when a window boundary clears it
    before = await everything(client)
    with pytest.raises(WorkspaceLogsFull):
        await outbox.edit(WS, "s1", entry.id, text="one more")
    with pytest.raises(WorkspaceLogsFull):  # a new session is the same workspace
        await outbox.accept(WS, "s2", "u", "c2", "and a new prompt")
    assert await everything(client) == before  # no entry, event, marker or count moved
    assert outbox.metrics.refused_logs_full._value.get() == 3
    # A client's retry of an accepted prompt still learns its ID: the dedupe comes first.
    with pytest.raises(Duplicate):
        await outbox.accept(WS, "s1", "u", "c1", "seed")
    # Another workspace is not held back by this one's logs.
    other = await outbox.accept("other", "s1", "u", "c1", TEXT)
    assert await outbox.edit("other", "s1", other.id, text="fine") is EditResult.UPDATED
    # A cleanup (the operator's way out) takes the count with the logs.
    await outbox.cleanup_workspace(WS)
    assert not await client.exists(WorkspaceKeys(WS).log_bytes)
    await outbox.accept(WS, "s1", "u", "c9", "after the cleanup")


async def test_an_accept_and_dismiss_loop_stops_at_the_bound_though_few_entries_are_held(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    for n in range(100):
        try:
            entry = await outbox.accept(WS, "s1", "u", f"c{n}", f"{n} {TEXT}")
        except WorkspaceLogsFull:
            break
        assert await outbox.dismiss(WS, "s1", entry.id) is DismissResult.REMOVED
    else:
        raise AssertionError("100 accepts of 4 kB were never refused at a 40 kB bound")
    assert n <= LIMIT // len(TEXT) + 1
    assert await outbox.list(WS, "s1") == []  # the workspace quota counted nothing
    assert await logged_bytes(client) >= LIMIT
    await outbox.accept("other", "s1", "u", "c1", TEXT)


async def test_a_log_per_session_counts_what_each_new_log_takes_not_only_its_event(
    client: Client, clock: ManualClock
) -> None:
    # A new stream costs Valkey about 4 KiB (its first node) however small its event: one
    # tiny accept into each of many new sessions, dismissed, is counted at that.
    outbox = Outbox(client, TIGHT, clock=clock)
    for n in range(100):
        try:
            entry = await outbox.accept(WS, f"s{n}", "u", "c", "x")
        except WorkspaceLogsFull:
            break
        await outbox.dismiss(WS, f"s{n}", entry.id)
    else:
        raise AssertionError("100 new logs were never refused at a 40 kB bound")
    memory = 0
    for i in range(n):
        memory += int(await client.memory_usage(SessionKeys(WS, f"s{i}").events) or 0)
    assert await logged_bytes(client) >= memory  # the count covers what the logs hold
    assert n <= LIMIT // 2000  # ~4 kB a log: a count of the events alone let in ~90


async def test_a_clients_retries_stop_at_the_bound_with_nothing_written_dismissals_go_on(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    failed = []
    for ses in ("s1", "s2"):
        await outbox.accept(WS, ses, "u", "c1", "fails")
        agent = ScriptedAgent([RuntimeError("refused")] * FAST.max_attempts)
        for _ in range(FAST.max_attempts):
            assert await outbox.deliver_once(WS, ses, agent)
            clock.advance(60)
        [entry] = await outbox.list(WS, ses)
        assert entry.status is Status.ERROR
        failed.append(entry)
    other = await outbox.accept(WS, "s3", "u", "c1", "seed")
    await edit_until_refused(outbox, "s3", other.id)
    before = await everything(client)
    # A retry re-arms an entry for more moves, each logging it whole: refused like an accept.
    with pytest.raises(WorkspaceLogsFull):
        await outbox.retry(WS, "s1", failed[0].id)
    with pytest.raises(WorkspaceLogsFull):
        await outbox.retry_errors(WS)
    assert await everything(client) == before
    # A dismissal frees room: never refused.
    assert await outbox.dismiss(WS, "s2", failed[1].id) is DismissResult.REMOVED


async def test_deliveries_and_the_engines_retries_keep_logging_past_the_bound(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    a = await outbox.accept(WS, "s1", "u", "a", "first")
    b = await outbox.accept(WS, "s1", "u", "b", "second")
    await edit_until_refused(outbox, "s1", b.id)
    logged = await logged_bytes(client)
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
    assert await logged_bytes(client) > logged  # counted, never refused


async def test_after_the_windows_pass_the_workspace_may_write_again(
    client: Client, clock: ManualClock
) -> None:
    # Windows of a second, on the server's clock: the ten edits to the bound must fall in two
    # of them, and a loaded machine may stall the loop for a good part of one.
    ttl = 1.0
    outbox = Outbox(client, replace(TIGHT, event_log_ttl=ttl), clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    full = await edit_until_refused(outbox, "s1", entry.id)
    assert 0 < full.retry_after <= 2 * ttl
    key = WorkspaceKeys(WS).log_bytes

    async def edited() -> bool:
        try:
            done = await outbox.edit(WS, "s1", entry.id, text="later") is EditResult.UPDATED
        except WorkspaceLogsFull:
            return False
        # At once: the count's key lives on at least a window from this edit.
        assert await client.exists(key)
        return done

    assert await eventually(edited, within=20 * ttl)
    # The count's key goes with its last window: a quiet workspace keeps nothing.
    assert await eventually(lambda: _gone(client, key), within=20 * ttl)


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


async def test_the_api_answers_429_workspace_logs_full_with_retry_after(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, TIGHT, clock=clock)
    entry = await outbox.accept(WS, "s1", "u", "c1", "seed")
    await edit_until_refused(outbox, "s1", entry.id)
    url = f"/v1/workspaces/{WS}/sessions/s1/prompts"
    async for http in serve(outbox):
        refusals = [
            await http.post(url, json={"clientMessageID": "c2", "text": "hi"}, headers=ALICE),
            await http.patch(f"{url}/{entry.id}", json={"text": "hi"}, headers=ALICE),
        ]
        for r in refusals:
            assert r.status_code == 429, r.text
            assert r.json()["error"] == "workspace_logs_full"
            assert 1 <= int(r.headers["Retry-After"]) <= 2 * TIGHT.event_log_ttl
        other = "/v1/workspaces/other/sessions/s1/prompts"
        r = await http.post(other, json={"clientMessageID": "c2", "text": "hi"}, headers=BOB)
        assert r.status_code == 202, r.text
