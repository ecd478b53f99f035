"""Reads that fetch only what they answer (docs/security.md, the third review): a session's
history reads its events without the entries they carry; an action on one entry reads that
entry, not its session; an action on many reads them a bounded slice at a time; and a list or
an event stream's reset is charged to the caller's answer budget before its entries are
read, by what they take in Valkey, so a refusal costs no read. Each measured by what Valkey
sent (INFO stats), against sessions of 100 kB prompts."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import httpx
import pytest

from prompt_outbox import DismissResult, EditResult, Entry, Outbox, RetryResult, Status, Turn
from prompt_outbox import admin as admin_module
from prompt_outbox.api import create_app
from prompt_outbox.api.answers import AnswerLimits
from prompt_outbox.api.auth import Principal
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.picks import Picks
from prompt_outbox.storage.replies import Slice
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, TOKENS, serve
from tests.support.clock import ManualClock
from tests.support.memory import sent_bytes
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

WS, SES = "acme", "chat-1"
BIG = "b" * 100_000
ROOMY = replace(FAST, cap=30, event_log_bytes=16 * 1024 * 1024, max_attempts=1)
"""Sessions that hold 30 prompts of 100 kB, and logs that keep all their events."""


async def delivered_with_turns(outbox: Outbox, n: int) -> list[Entry]:
    """``n`` prompts of 100 kB accepted and delivered, each starting a turn that ends."""
    entries = [await outbox.accept(WS, SES, "u", f"c{i}", f"{i} {BIG}") for i in range(n)]

    async def turned(ws: str, ses: str, entry: Entry) -> Turn:
        return Turn(f"t-{entry.client_message_id}")

    for e in entries:
        assert await outbox.deliver_once(WS, SES, turned)
        assert (await outbox.end_turn(WS, SES, f"t-{e.client_message_id}")).ended
    return entries


async def test_history_reads_no_entry_the_events_carry(client: Client, clock: ManualClock) -> None:
    outbox = Outbox(client, ROOMY, clock=clock)
    entries = await delivered_with_turns(outbox, 20)  # ~4 MB of events carrying entries
    before = await sent_bytes(client)
    got = await outbox.overview.history(WS, SES, 200)
    cost = await sent_bytes(client) - before
    assert [d.id for d in got] == [e.id for e in reversed(entries)]
    assert all(
        d.turn == f"t-{e.client_message_id}" for d, e in zip(got, reversed(entries), strict=True)
    )
    # 100 events of a few dozen bytes each, not the 4 MB they carry.
    assert cost < 50_000, cost


async def test_an_action_on_one_entry_reads_that_entry_not_its_session(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, ROOMY, clock=clock)
    failed = await outbox.accept(WS, SES, "u", "f", "fails")
    assert await outbox.deliver_once(WS, SES, ScriptedAgent([RuntimeError("refused")]))
    waiting = [await outbox.accept(WS, SES, "u", f"c{i}", f"{i} {BIG}") for i in range(25)]
    for action in (
        lambda: outbox.retry(WS, SES, failed.id),
        lambda: outbox.edit(WS, SES, waiting[-1].id, text="shorter"),
        lambda: outbox.dismiss(WS, SES, waiting[-2].id),
    ):
        before = await sent_bytes(client)
        assert await action() in (RetryResult.UPDATED, EditResult.UPDATED, DismissResult.REMOVED)
        # At most an entry (100 kB) and its replies, not the session's 2.5 MB.
        assert await sent_bytes(client) - before < 250_000
    [first, *_] = await outbox.list(WS, SES)
    assert (first.id, first.status) == (failed.id, Status.PENDING)


async def test_an_action_on_many_entries_reads_them_a_slice_at_a_time(
    client: Client, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slices of 250 kB (two entries and a half): error entries the action leaves (not
    # unverifiable) stand among those it changes, so each slice skips what the ones before
    # left, and every entry is read once.
    monkeypatch.setattr(admin_module, "SLICE_BYTES", 250_000)
    slices: list[int] = []
    read = Picks.entries

    async def recorded(self: Picks, *args: Any, **kwargs: Any) -> Slice:
        got = await read(self, *args, **kwargs)
        slices.append(sum(len(raw) for raw in got.entries))
        return got

    monkeypatch.setattr(Picks, "entries", recorded)
    outbox = Outbox(client, ROOMY, clock=clock)
    for i in range(12):
        await outbox.accept(WS, SES, "u", f"c{i}", f"{i} {BIG}")
        refused = [RuntimeError("refused")] if i % 3 else []  # every third is delivered
        assert await outbox.deliver_once(WS, SES, ScriptedAgent(refused))
    errors = await outbox.list(WS, SES)
    assert len(errors) == 8 and {e.status for e in errors} == {Status.ERROR}
    before = await sent_bytes(client)
    assert await outbox.sweep_workspace_unverifiable(WS) == 0  # none is unverifiable
    assert 8 * len(BIG) <= await sent_bytes(client) - before < 12 * len(BIG)  # each once
    assert len(slices) >= 4 and max(slices) <= 250_000
    slices.clear()
    done = await outbox.retry_errors(WS, SES)
    assert done.done == 8 and len(slices) >= 4 and max(slices) <= 250_000
    assert {e.status for e in await outbox.list(WS, SES)} == {Status.PENDING}


async def test_a_list_over_the_budget_is_refused_before_its_entries_are_read(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, ROOMY, clock=clock)
    for i in range(25):
        await outbox.accept(WS, SES, "u", f"c{i}", f"{i} {BIG}")
    alice = Principal("alice", frozenset({WS}))
    # A MiB a token: alice's 2.5 MB session is read only while she holds nothing else.
    app = create_app(outbox, TOKENS, answers=AnswerLimits(per_token=1024 * 1024))
    state = app.state
    async for http in serve(outbox, app=app):
        held = state.answers.take(alice, 1)  # alice holds something: no exemption
        try:
            for path in ("/prompts", "/events"):
                before = await sent_bytes(client)
                r = await http.get(f"/v1/workspaces/{WS}/sessions/{SES}{path}", headers=ALICE)
                assert (r.status_code, r.json()["error"]) == (429, "answers_buffer_full")
                assert await sent_bytes(client) - before < 10_000  # one field, no entry
        finally:
            held.close()
        r = await http.get(f"/v1/workspaces/{WS}/sessions/{SES}/prompts", headers=ALICE)
        assert r.status_code == 200 and len(r.json()["entries"]) == 25
        assert state.answers.held == 0  # settled, then given back


async def test_a_burst_of_streams_on_empty_sessions_all_open(
    client: Client, clock: ManualClock
) -> None:
    # Phones reconnecting at once after a restart: their resets are charged as each is read
    # (through the feed's bounded reads), not reserved all at once before (300 x 76 KiB
    # would pass the token's 16 MiB), and every one opens.
    outbox = Outbox(client, ROOMY, clock=clock)
    async for http in serve(outbox):
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(base_url=http.base_url, limits=limits, timeout=30) as phones:
            codes = await asyncio.gather(*(opened(phones, f"p{i}") for i in range(300)))
        assert codes == [200] * 300


async def opened(http: httpx.AsyncClient, ses: str) -> int:
    """The status of an event stream of ``ses``, once its reset came (0: it never did)."""
    async with http.stream("GET", f"/v1/workspaces/{WS}/sessions/{ses}/events", headers=ALICE) as r:
        if r.status_code != 200:
            return r.status_code
        async for line in r.aiter_lines():
            if line.startswith("event: queue.reset"):
                return 200
    return 0
