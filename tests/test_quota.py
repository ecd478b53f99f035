"""The workspace quota (docs/security.md, finding 12): a workspace holds at most ``workspace_cap``
entries over all its sessions. accept.lua refuses past it in O(1), from a count every session
script keeps exact (lib.lua ``count``), with nothing written; the API answers 429
``workspace_full`` with Retry-After."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from prompt_outbox import (
    Duplicate,
    Entry,
    Outbox,
    OutboxFull,
    WorkspaceFull,
    ambiguous,
)
from prompt_outbox.core.callbacks import Wiring
from prompt_outbox.core.keys import COUNT_TOTAL, SessionKeys, WorkspaceKeys
from prompt_outbox.core.metrics import Metrics
from prompt_outbox.delivery.engine import Engine
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.replies import text
from prompt_outbox.storage.store import Store
from tests import tally
from tests.agents import ScriptedAgent, WorkerDied, dying_agent
from tests.support.api import ALICE, serve
from tests.support.clock import ManualClock
from tests.support.entries import everything
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too

WS = "acme"
SMALL = replace(FAST, cap=3, workspace_cap=5)


async def counted(client: Client, ws: str = WS) -> dict[str, int]:
    """The workspace's count as stored (its HASH but for the overview's tally)."""
    raw = await client.hgetall(WorkspaceKeys(ws).count)  # type: ignore[misc]
    return {
        text(f): int(v)
        for f, v in raw.items()
        if not (tally.is_tally_field(text(f)) or tally.is_bytes_field(text(f)))
    }


async def recounted(client: Client, ws: str = WS) -> dict[str, int]:
    """What the count must be, from the lists themselves (found by SCAN, not by any index)."""
    want: dict[str, int] = {}
    for ses in await tally.sessions_in(client, ws):
        k = SessionKeys(ws, ses)
        n = int(await client.llen(k.queue)) + int(await client.llen(k.staging))  # type: ignore[misc]
        if n:
            want[ses] = n
    if want:
        want[COUNT_TOTAL] = sum(want.values())
    return want


@pytest.fixture
def small(client: Client, clock: ManualClock) -> Outbox:
    return Outbox(client, SMALL, clock=clock)


async def fill(outbox: Outbox) -> list[Entry]:
    """Five entries: three in s1 (its cap), two in s2: the workspace's cap."""
    placed = [("s1", "a"), ("s1", "b"), ("s1", "c"), ("s2", "a"), ("s2", "b")]
    return [await outbox.accept(WS, ses, "u", cmid, f"{ses} {cmid}") for ses, cmid in placed]


async def test_a_full_workspace_refuses_with_nothing_written(small: Outbox, client: Client) -> None:
    await fill(small)
    assert await counted(client) == {"s1": 3, "s2": 2, COUNT_TOTAL: 5}
    before = await everything(client)
    with pytest.raises(WorkspaceFull) as refused:
        await small.accept(WS, "s3", "u", "new", "one too many")
    assert refused.value.cap == 5 and isinstance(refused.value, OutboxFull)
    with pytest.raises(WorkspaceFull):
        await small.accept(WS, "s2", "u", "new", "s2 has room, the workspace has none")
    assert await everything(client) == before  # no entry, marker, event or index
    assert small.metrics.refused_workspace_full._value.get() == 2
    # Another workspace is not held back by this one.
    await small.accept("other", "s1", "u", "a", "elsewhere")


async def test_a_retry_of_an_accepted_prompt_is_still_its_duplicate(small: Outbox) -> None:
    first = (await fill(small))[0]
    with pytest.raises(Duplicate) as dup:
        await small.accept(WS, "s1", "u", "a", "s1 a")
    assert dup.value.accepted_id == first.id


async def test_deliveries_dismissals_and_cleanup_make_room(
    small: Outbox, client: Client, clock: ManualClock
) -> None:
    entries = await fill(small)
    assert await small.deliver_once(WS, "s1", ScriptedAgent([None]))
    assert await counted(client) == {"s1": 2, "s2": 2, COUNT_TOTAL: 4}
    await small.accept(WS, "s3", "u", "a", "room after a delivery")
    with pytest.raises(WorkspaceFull):
        await small.accept(WS, "s3", "u", "b", "full again")
    await small.dismiss(WS, "s2", entries[3].id)
    await small.accept(WS, "s3", "u", "b", "room after a dismissal")
    await small.cleanup_workspace(WS)
    assert await counted(client) == {}
    for cmid in "abcde":
        await small.accept(WS, f"t{cmid}", "u", cmid, "a fresh start")


async def test_the_count_stays_exact_through_every_kind_of_transition(
    client: Client, clock: ManualClock
) -> None:
    """A property check: random operations on three sessions (accepts into each, sends with
    each outcome, a worker dying mid-send and recovery, retry, dismiss, edit, park, unpark,
    the bulk actions, cleanup); after each, the stored count equals a recount of the lists,
    and so does the overview's tally (entries by status, oldest pending, send start)."""
    outbox = Outbox(client, replace(FAST, cap=6, workspace_cap=12), clock=clock)
    rng = random.Random(22)
    sessions = ["s1", "s2", "s3"]
    cmids = iter(range(10**6))

    async def pick(ses: str) -> str | None:
        listed = await outbox.list(WS, ses)
        return rng.choice(listed).id if listed else None

    async def accept(ses: str) -> None:
        with contextlib.suppress(OutboxFull):
            await outbox.accept(WS, ses, "u", f"c{next(cmids)}", "text")

    async def send(ses: str, outcome: BaseException | None) -> None:
        clock.advance(300)
        try:
            await outbox.deliver_once(WS, ses, ScriptedAgent([outcome]))
        except WorkerDied:
            await client.delete(SessionKeys(WS, ses).lock)  # its lease lapses

    async def on_entry(ses: str, act: Callable[[str], object]) -> None:
        entry_id = await pick(ses)
        if entry_id is not None:
            await act(entry_id)  # type: ignore[misc]

    # A drain's steps, as the run loop takes them: each claim answers the next step in the
    # same call (complete.lua re-leases the session for the next head). The count is checked
    # inside every send too, so mid-drain as well as after it.
    engine = Engine(Store(client), outbox.tunables, clock, Metrics(), Wiring())

    async def drain(ses: str) -> None:
        clock.advance(300)
        outcomes = [rng.choice([None, None, RuntimeError("refused")]) for _ in range(8)]
        scripted = ScriptedAgent(outcomes)

        seen: list[tuple[object, object]] = []

        async def checking(ws: str, s: str, entry: Entry) -> None:
            # (An assertion here would be taken for the send's failure: record, check after.)
            seen.append((await counted(client), await recounted(client)))
            seen.append((await tally.stored(client, WS), await tally.recounted(client, WS)))
            await scripted(ws, s, entry)

        await engine.drain(SessionKeys(WS, ses), checking)
        assert all(stored == actual for stored, actual in seen), f"mid-drain: {seen}"

    async def dies(ses: str) -> None:
        clock.advance(300)
        try:
            await outbox.deliver_once(WS, ses, dying_agent)
        except WorkerDied:
            await client.delete(SessionKeys(WS, ses).lock)

    ops: list[Callable[[str], object]] = [
        accept,
        accept,
        accept,
        lambda s: send(s, None),
        lambda s: send(s, RuntimeError("refused")),
        lambda s: send(s, ambiguous("cut")),
        drain,
        dies,
        lambda s: outbox.recover(),
        lambda s: on_entry(s, lambda i: outbox.retry(WS, s, i)),
        lambda s: on_entry(s, lambda i: outbox.dismiss(WS, s, i)),
        lambda s: on_entry(s, lambda i: outbox.edit(WS, s, i, text="edited")),
        lambda s: outbox.park_workspace(WS, "ops"),
        lambda s: outbox.unpark_workspace(WS),
        lambda s: outbox.retry_errors(WS, s),
        lambda s: outbox.dismiss_errors(WS),
    ]
    for step in range(300):
        ses = rng.choice(sessions)
        if step % 97 == 96:
            await outbox.cleanup_workspace(WS)
        else:
            await rng.choice(ops)(ses)  # type: ignore[misc]
        assert await counted(client) == await recounted(client), f"after step {step}"
        assert await tally.stored(client, WS) == await tally.recounted(client, WS), step
    assert await counted(client)  # the walk ended with entries to count


async def test_entries_from_before_the_count_are_counted_by_their_next_script(
    small: Outbox, client: Client, clock: ManualClock
) -> None:
    # Data written before the count existed: its sessions have no field. Any script on a
    # session makes its field exact (and the total with it); a repair pass reaches the rest.
    await small.accept(WS, "s1", "u", "a", "old")
    await small.accept(WS, "s1", "u", "b", "old")
    await small.accept(WS, "s2", "u", "a", "old")
    await client.delete(WorkspaceKeys(WS).count)
    await small.accept(WS, "s1", "u", "c", "new")
    assert await counted(client) == {"s1": 3, COUNT_TOTAL: 3}
    store = Store(client)
    await store.repair(SessionKeys(WS, "s2"), 0)
    assert await counted(client) == await recounted(client) == {"s1": 3, "s2": 1, COUNT_TOTAL: 4}


async def test_the_api_answers_full_outboxes_429_with_retry_after(
    client: Client, clock: ManualClock
) -> None:
    outbox = Outbox(client, replace(FAST, cap=1, workspace_cap=2), clock=clock)
    url = "/v1/workspaces/acme/sessions/{}/prompts"
    async for http in serve(outbox):
        for ses, status in [("s1", 202), ("s1", 429), ("s2", 202), ("s3", 429)]:
            body = {"clientMessageID": f"m-{ses}-{status}", "text": "hello"}
            r = await http.post(url.format(ses), json=body, headers=ALICE)
            assert r.status_code == status, r.text
        session_full = await http.post(url.format("s1"), json=body, headers=ALICE)
        assert session_full.json()["error"] == "outbox_full"
        assert session_full.headers["Retry-After"] == "10"
        assert r.json()["error"] == "workspace_full"
        assert r.headers["Retry-After"] == "10"
