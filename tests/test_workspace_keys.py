"""A workspace's keys: every key a script writes falls under one of the workspace's exact
prefixes (core/keys.py WORKSPACE_KEY_PREFIXES), and cleanup deletes exactly those, never a
neighbour's (docs/security.md, finding 3: ``outbox*:{acme}*`` also matched
``outboxq:{other}:{acme}``)."""

from __future__ import annotations

import pytest

from prompt_outbox import Entry, Outbox, Turn, ambiguous
from prompt_outbox.core.keys import (
    FORMAT_KEY,
    WORKSPACE_KEY_PREFIXES,
    SessionKeys,
    WorkspaceKeys,
    buckets,
)
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.replies import text
from prompt_outbox.storage.store import Store
from prompt_outbox.storage.walk import Walk
from tests.agents import ScriptedAgent, WorkerDied, dying_agent
from tests.support.clock import ManualClock

pytestmark = pytest.mark.cluster_too

SHARED = {FORMAT_KEY, *(k for b in buckets() for k in b.script_keys())}
"""The store's format and the due index's bucket keys: no workspace owns them."""

# Workspace acme's sessions, and its neighbours: a session named after it in another
# workspace, workspaces whose names hold it or are held in it, and names with dots.
TARGET = [("acme", "s1"), ("acme", "acme2"), ("acme", "other")]
NEIGHBOURS = [
    ("other", "acme"),
    ("acme2", "s1"),
    ("acm", "acme"),
    ("acme.x", "s1"),
    ("x.acme", "acme"),
    ("a.b", "acme.x"),
    ("acme-", "s1"),
]


async def keys_of(client: Client) -> set[str]:
    """Every key on the server (every primary on a cluster)."""
    return {text(k) async for k in client.scan_iter(count=1000)}


def owner(key: str, workspaces: set[str]) -> str:
    """The one workspace that owns ``key`` ('' for a shared bucket key); fails otherwise."""
    if key in SHARED:
        return ""
    owners = [ws for ws in workspaces if WorkspaceKeys(ws).owns(key)]
    assert len(owners) == 1, f"{key!r} is owned by {owners}"
    return owners[0]


async def every_transition(
    outbox: Outbox, client: Client, clock: ManualClock, ws: str, ses: str
) -> set[str]:
    """Drive a session through accept, a worker dying mid-send (staging and its lock left),
    recovery, an unverifiable error, edit, retry, dismiss, a claim whose worker dies in
    OnDelivered (its owed call left), park and unpark, an ambiguous send, and a turn left
    held by its owner; the keys seen after each step."""
    seen: set[str] = set()

    async def look() -> None:
        seen.update(await keys_of(client))

    for cmid in ("a", "b", "c", "d"):
        await outbox.accept(ws, ses, "u", cmid, f"text {cmid}")
    await look()
    with pytest.raises(WorkerDied):
        await outbox.deliver_once(ws, ses, dying_agent)
    await look()  # staged, locked
    await client.delete(SessionKeys(ws, ses).lock)  # its lease lapses
    assert await outbox.deliver_once(ws, ses, dying_agent)  # recovered as verifying
    clock.advance(60)
    assert await outbox.deliver_once(ws, ses, dying_agent)  # no verifier: unverifiable error
    await look()
    listed = await outbox.list(ws, ses)
    await outbox.edit(ws, ses, listed[1].id, text="edited")
    await outbox.retry(ws, ses, listed[0].id)
    await outbox.dismiss(ws, ses, listed[2].id)
    await look()

    async def hook_dies(w: str, s: str, entry: Entry) -> None:
        raise WorkerDied

    outbox.set_on_delivered(hook_dies)
    with pytest.raises(WorkerDied):
        await outbox.deliver_once(ws, ses, ScriptedAgent([None]))
    outbox.set_on_delivered(None)
    await look()  # the claim marker and the owed OnDelivered call
    await client.delete(SessionKeys(ws, ses).lock)
    await outbox.park_workspace(ws, "ops")
    await outbox.unpark_workspace(ws)
    clock.advance(60)
    assert await outbox.deliver_once(ws, ses, ScriptedAgent([ambiguous("cut")]))
    await look()

    # A turn owned by a running worker (its owner recorded for the workspace), left held.
    async def turn_agent(w: str, s: str, entry: Entry) -> Turn:
        return Turn(f"turn-{entry.id}")

    outbox._engine.turns.owner = "w-test"  # as Turns.keeping sets it
    try:
        await outbox.accept(ws, ses, "u", "t", "a turn")
        for _ in range(9):  # the session's entries, the last one's turn left held
            await outbox.deliver_once(ws, ses, turn_agent)
            lock = await client.get(SessionKeys(ws, ses).lock)
            if lock:
                assert text(lock).startswith("turn:")
                break
    finally:
        outbox._engine.turns.owner = ""
    await look()
    held = await outbox.turn(ws, ses)
    assert held is not None
    assert (await outbox.end_turn(ws, ses, held.turn)).ended

    # An end that outruns its send's claim, kept while that send is in flight.
    early: list[bool] = []

    async def outrun_agent(w: str, s: str, entry: Entry) -> None:
        await outbox.end_turn(w, s, "not-held-yet")
        await look()
        early.append(True)

    await outbox.accept(ws, ses, "u", "e", "an early end")
    for _ in range(9):
        await outbox.deliver_once(ws, ses, outrun_agent)
        if early:
            break
    assert early
    return seen


async def test_every_key_the_scripts_write_is_under_one_prefix_of_its_workspace(
    manual_outbox: Outbox, client: Client, clock: ManualClock
) -> None:
    pairs = TARGET + NEIGHBOURS
    seen: set[str] = set()
    for ws, ses in pairs:
        seen |= await every_transition(manual_outbox, client, clock, ws, ses)
    workspaces = {ws for ws, _ in pairs}
    for key in seen:
        owner(key, workspaces)
    # The cycle reached every kind of key, so the check above covered each prefix.
    used = {p for p in WORKSPACE_KEY_PREFIXES for key in seen if key.startswith(p + "{")}
    assert used == set(WORKSPACE_KEY_PREFIXES)
    # Cleaning every workspace leaves nothing of theirs behind, bucket keys included.
    for ws in sorted(workspaces):
        await manual_outbox.cleanup_workspace(ws)
    assert await keys_of(client) == {FORMAT_KEY}


async def test_cleanup_deletes_exactly_its_workspace_and_no_neighbour(
    manual_outbox: Outbox, client: Client, clock: ManualClock
) -> None:
    for ws, ses in TARGET + NEIGHBOURS:
        await every_transition(manual_outbox, client, clock, ws, ses)
    workspaces = {ws for ws, _ in TARGET + NEIGHBOURS}
    before = await keys_of(client)
    theirs = {k for k in before if owner(k, workspaces) not in ("", "acme")}
    mine = {k for k in before if owner(k, workspaces) == "acme"}
    assert any(k.startswith("outboxq:{other}:{acme}") for k in theirs)  # the finding's case

    removed = await manual_outbox.cleanup_workspace("acme")

    after = await keys_of(client)
    assert removed == len(mine)
    assert not after & mine
    assert {k for k in after if k not in SHARED} == theirs
    for ws, ses in NEIGHBOURS:
        assert await manual_outbox.list(ws, ses), f"{ws}/{ses} lost its entries"
    assert await manual_outbox.cleanup_workspace("acme") == 0  # idempotent
    # acme starts afresh: its dedupe markers went too.
    await manual_outbox.accept("acme", "s1", "u", "a", "text a")


async def test_what_a_writer_adds_during_a_pass_is_taken_by_the_next(client: Client) -> None:
    # A delivery under way may write once more behind the first pass's SCAN (docs/security.md,
    # a cleanup racing deliveries: pieces of a deleted workspace stayed, one with no expiry).
    late = SessionKeys("acme", "late").queue

    class Racing(Walk):
        passes = 0

        async def _delete_owned(self, w: WorkspaceKeys) -> int:
            removed = await super()._delete_owned(w)
            self.passes += 1
            if self.passes == 1:
                await client.rpush(late, "written behind the first pass")
            return removed

    await client.set(SessionKeys("acme", "s").lock, "x")
    walk = Racing(client, Store(client).due)
    assert await walk.cleanup_workspace(WorkspaceKeys("acme")) == 2
    assert not await client.exists(late)
    assert walk.passes == 3  # the third found nothing: done
