"""The tally the session scripts keep for the overview and the entry counts (docs/security.md: the
overview read every entry; lua/lib.lua, "the tally"): entries by status per session and per
workspace, the oldest pending entry, the send start of the entry in flight. Against a real Valkey
(and the cluster): it is what a recount of the lists gives after the transitions that move it
(accept, stage, complete) and the ones that derive it; data from before it is counted by the
session's next script; "oldest pending" is the first pending entry in line. (tests/test_quota.py
walks every kind of transition at random against the same recount, and the model-based test checks
it after every step.)"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from prompt_outbox import Entry, Outbox
from prompt_outbox.core.keys import SessionKeys, WorkspaceKeys, tally_field
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.store import Store
from tests import tally
from tests.agents import ScriptedAgent
from tests.support.clock import ManualClock
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

WS = "acme"


async def exact(client: Client, ws: str = WS) -> tally.Tallied:
    """The stored tally, checked against a recount of the lists."""
    kept = await tally.stored(client, ws)
    assert kept == await tally.recounted(client, ws)
    return kept


async def test_entries_from_before_the_tally_are_counted_by_their_sessions_next_script(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, FAST, clock=clock)
    for ses, n in (("s1", 3), ("s2", 2), ("s3", 1)):
        for i in range(n):
            await outbox.accept(WS, ses, "u", f"c{i}", "old")
    # As written before the tally: no session field, no totals, no oldest-pending index.
    w = WorkspaceKeys(WS)
    await client.hdel(w.count, *(tally_field(s) for s in ("s1", "s2", "s3")))  # type: ignore[misc]
    await client.hdel(w.count, ":pending")  # type: ignore[misc]
    await client.delete(w.oldest)
    # An accept finds s1's counts do not add up to its entries: it derives them (once).
    await outbox.accept(WS, "s1", "u", "new", "new")
    kept = await tally.stored(client, WS)
    assert kept["sessions"] == {"s1": "4,0,0,0,0,"} and kept["totals"] == {"pending": 4}
    # So does a stage (s2, a delivery), and a repair (s3, the slow safety net's pass).
    assert await outbox.deliver_once(WS, "s2", ScriptedAgent())
    await Store(client).repair(SessionKeys(WS, "s3"), 0)
    await exact(client)


async def test_entries_written_in_another_field_order_are_counted_by_their_status(
    client: Client, clock: ManualClock
) -> None:
    # The scripts read an entry's status from its tail when it is in Python's own form, and
    # decode it otherwise: a seeded entry with its status first, a model holding a "status"
    # key, and a last key that ends in '"status' (its quote escaped) must count as pending.
    outbox = Outbox(client, FAST, clock=clock)
    odd = (
        '{"status":"pending","id":"e1","clientMessageID":"e1","userID":"u","text":"t",'
        '"model":{"status":"error"},"acceptedAt":"2026-12-01T00:00:00.000000Z",'
        '"attempts":0,"x\\"status":"error"}'
    )
    assert Entry.from_json(odd).status == "pending"
    await outbox.seed_entry_for_test(WS, "s", odd)
    await outbox.accept(WS, "s", "u", "c", "after it")
    assert (await exact(client))["totals"] == {"pending": 2}
    seen: list[tuple[tally.Tallied, tally.Tallied]] = []

    async def checking(ws: str, ses: str, entry: Entry) -> None:  # staged by now
        seen.append((await tally.stored(client, WS), await tally.recounted(client, WS)))

    assert await outbox.deliver_once(WS, "s", checking)
    [(kept, want)] = seen
    assert kept == want and kept["totals"] == {"pending": 1, "delivering": 1}
    assert (await exact(client))["totals"] == {"pending": 1}  # claimed


async def test_the_oldest_pending_entry_is_the_first_in_line(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, replace(FAST, max_attempts=1), clock=clock)
    accepted: list[Entry] = []
    for i in range(3):
        accepted.append(await outbox.accept(WS, "s", "u", f"c{i}", f"prompt {i}"))
        clock.advance(10)
    await outbox.accept(WS, "t", "u", "c", "later, elsewhere")
    clock.advance(10)

    async def oldest() -> tuple[float | None, float | None]:
        [s, _] = sorted((await outbox.overview.sessions(WS)).items, key=lambda x: x.id)
        [w] = (await outbox.overview.workspaces("", 10, only=[WS])).items
        return s.counts.oldest_pending_for, w.counts.oldest_pending_for

    assert await oldest() == (40.0, 40.0)
    # In flight, the first is no longer pending: the next in line is the oldest.
    release, sending = asyncio.Event(), asyncio.Event()

    async def held(ws: str, ses: str, entry: Entry) -> None:
        sending.set()
        await release.wait()
        raise RuntimeError("refused")  # max_attempts 1: it stops in error

    delivery = asyncio.create_task(outbox.deliver_once(WS, "s", held))
    await asyncio.wait_for(sending.wait(), 30)
    assert await oldest() == (30.0, 30.0)
    await exact(client)
    release.set()
    await delivery
    assert await oldest() == (30.0, 30.0)  # the first is in error now
    # A retry puts it back in line, in its place: the oldest again.
    await outbox.retry(WS, "s", accepted[0].id)
    assert await oldest() == (40.0, 40.0)
    # Delivered, all of it: no pending entry in the session, the workspace's is t's.
    for _ in range(3):
        assert await outbox.deliver_once(WS, "s", ScriptedAgent())
    assert [s.id for s in (await outbox.overview.sessions(WS)).items] == ["t"]
    [w] = (await outbox.overview.workspaces("", 10, only=[WS])).items
    assert w.counts.oldest_pending_for == 10.0
    await exact(client)
