"""Operator actions: retry, dismiss, park, unpark, sweeps, cleanup; contention is never absence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_TURN_ENDED,
    DismissResult,
    Entry,
    Outbox,
    RetryResult,
    Status,
    Verdict,
    ambiguous,
)
from prompt_outbox.core.keys import SessionKeys
from prompt_outbox.storage.client import Client
from tests.agents import HookLog, ScriptedAgent, ScriptedVerifier, WorkerDied, dying_agent
from tests.support.clock import ManualClock
from tests.support.tunables import FAST
from tests.support.waiting import eventually

pytestmark = pytest.mark.cluster_too

WS, SES = "ws", "s1"


async def make_error(
    outbox: Outbox, clock: ManualClock, cmid: str, *, ses: str = SES, unverifiable: bool = False
) -> Entry:
    """Accept an entry and drive it to error (definitive failures, or one ambiguous send)."""
    entry = await outbox.accept(WS, ses, "u", cmid, f"text {cmid}")
    if unverifiable:
        agent = ScriptedAgent([ambiguous("cut")])
        assert await outbox.deliver_once(WS, ses, agent)
    else:
        agent = ScriptedAgent([RuntimeError("rejected")] * FAST.max_attempts)
        for _ in range(FAST.max_attempts):
            clock.advance(60)
            assert await outbox.deliver_once(WS, ses, agent)
    return entry


@contextlib.asynccontextmanager
async def delivery_in_flight(outbox: Outbox, ses: str = SES) -> AsyncIterator[asyncio.Event]:
    """Hold the session lock the honest way: a delivery blocked mid-send."""
    release = asyncio.Event()
    started = asyncio.Event()

    async def deliver(ws: str, s: str, entry: Entry) -> None:
        started.set()
        await release.wait()

    task = asyncio.create_task(outbox.deliver_once(WS, ses, deliver))
    await asyncio.wait_for(started.wait(), 5)
    try:
        yield release
    finally:
        release.set()
        await task


async def raw_queue(client: valkey_async.Valkey, ses: str = SES) -> list[bytes]:
    return list(await client.lrange(SessionKeys(WS, ses).queue, 0, -1))


# -- retry / dismiss -------------------------------------------------------------------------


async def test_retry_rearms_an_error_entry(manual_outbox: Outbox, clock: ManualClock) -> None:
    e = await make_error(manual_outbox, clock, "a")
    assert await manual_outbox.retry(WS, SES, e.id) is RetryResult.UPDATED
    [got] = await manual_outbox.list(WS, SES)
    assert (got.status, got.attempts, got.last_error, got.next_attempt_at) == (
        Status.PENDING, 0, "", None,
    )  # fmt: skip
    agent = ScriptedAgent()
    assert await manual_outbox.deliver_once(WS, SES, agent)
    assert agent.texts == ["text a"]


async def test_retry_not_found_for_unknown_ids_and_non_error_entries(manual_outbox: Outbox) -> None:
    pending = await manual_outbox.accept(WS, SES, "u", "p", "pending one")
    assert await manual_outbox.retry(WS, SES, "nope") is RetryResult.NOT_FOUND
    assert await manual_outbox.retry(WS, SES, pending.id) is RetryResult.NOT_FOUND
    assert await manual_outbox.retry(WS, "empty", "nope") is RetryResult.NOT_FOUND
    with pytest.raises(ValueError):
        await manual_outbox.retry(WS, SES, "bad:id")


async def test_retry_and_dismiss_are_busy_while_a_delivery_holds_the_lock(
    manual_outbox: Outbox,
    clock: ManualClock,
) -> None:
    err = await make_error(manual_outbox, clock, "a")
    await manual_outbox.accept(WS, SES, "u", "b", "in flight")
    async with delivery_in_flight(manual_outbox):
        assert await manual_outbox.retry(WS, SES, err.id) is RetryResult.BUSY
        assert await manual_outbox.dismiss(WS, SES, err.id) is DismissResult.BUSY
        # Contention is not absence: even an unknown ID answers BUSY while the lock is held.
        assert await manual_outbox.retry(WS, SES, "unknown") is RetryResult.BUSY
        assert await manual_outbox.dismiss(WS, SES, "unknown") is DismissResult.BUSY
    assert await manual_outbox.retry(WS, SES, err.id) is RetryResult.UPDATED


async def test_dismiss_removes_only_that_entry(
    manual_outbox: Outbox, client: valkey_async.Valkey, clock: ManualClock
) -> None:
    a = await manual_outbox.accept(WS, SES, "u", "a", "a")
    b = await make_error(manual_outbox, clock, "b")
    c = await manual_outbox.accept(WS, SES, "u", "c", "c")
    before = await raw_queue(client)
    assert await manual_outbox.dismiss(WS, SES, b.id) is DismissResult.REMOVED
    assert await raw_queue(client) == [before[0], before[2]]  # neighbours byte-identical
    assert [e.id for e in await manual_outbox.list(WS, SES)] == [a.id, c.id]
    assert await manual_outbox.dismiss(WS, SES, b.id) is DismissResult.NOT_FOUND


async def test_dismiss_removes_a_stale_staged_entry(
    manual_outbox: Outbox, client: valkey_async.Valkey
) -> None:
    e = await manual_outbox.accept(WS, SES, "u", "a", "a")
    k = SessionKeys(WS, SES)
    await client.lmove(k.queue, k.staging, "LEFT", "RIGHT")  # a dead worker's staging
    assert await manual_outbox.dismiss(WS, SES, e.id) is DismissResult.REMOVED
    assert await manual_outbox.list(WS, SES) == []


async def died_mid_send(outbox: Outbox, client: valkey_async.Valkey) -> None:
    """The worker dies inside the agent call (the head stays staged), then its lease lapses."""
    with pytest.raises(WorkerDied):
        await outbox.deliver_once(WS, SES, dying_agent)
    await client.delete(SessionKeys(WS, SES).lock)


async def test_a_retried_older_entry_stays_ahead_of_a_dead_workers_entry(
    manual_outbox: Outbox, client: valkey_async.Valkey, clock: ManualClock
) -> None:
    """Regression (found by the model-based test): recovery used to put the dead worker's
    entry in front of an older entry retried meanwhile, reordering the conversation."""
    older = await make_error(manual_outbox, clock, "older")
    later = await manual_outbox.accept(WS, SES, "u", "later", "later")
    await died_mid_send(manual_outbox, client)
    assert await manual_outbox.retry(WS, SES, older.id) is RetryResult.UPDATED
    listed = await manual_outbox.list(WS, SES)
    assert [(e.id, e.status) for e in listed] == [
        (older.id, Status.PENDING),
        (later.id, Status.VERIFYING),  # recovered first: its send's outcome is unknown
    ]
    agent = ScriptedAgent()
    manual_outbox.set_verifier(ScriptedVerifier([Verdict.ABSENT]))
    for _ in range(3):
        clock.advance(60)
        await manual_outbox.deliver_once(WS, SES, agent)
    assert [e.id for _, _, e in agent.calls] == [older.id, later.id]  # accept order


async def test_park_holds_a_dead_workers_staged_entry_too(
    manual_outbox: Outbox, client: valkey_async.Valkey, clock: ManualClock
) -> None:
    """Regression (found by the model-based test): park skipped staged entries, so after
    recovery the parked workspace still verified (and could re-send) the dead worker's entry.
    The contract parks pending, delivering and verifying entries alike."""
    entry = await manual_outbox.accept(WS, SES, "u", "a", "a")
    await died_mid_send(manual_outbox, client)
    assert await manual_outbox.park_workspace(WS, "mode change") == 1
    [e] = await manual_outbox.list(WS, SES)
    assert (e.id, e.status) == (entry.id, Status.PARKED)
    verifier = ScriptedVerifier([Verdict.ABSENT])
    manual_outbox.set_verifier(verifier)
    clock.advance(60)
    assert not await manual_outbox.deliver_once(WS, SES, ScriptedAgent())  # held: inert
    assert await manual_outbox.unpark_workspace(WS) == 1
    [e] = await manual_outbox.list(WS, SES)
    assert e.status is Status.VERIFYING  # its send's outcome is still unknown: verify first


OPERATOR_ACTIONS = {
    "retry": lambda ob, eid: ob.retry(WS, SES, eid),
    "dismiss-another": lambda ob, eid: ob.dismiss(WS, SES, "someone-else"),
    "park": lambda ob, eid: ob.park_workspace(WS, "ops"),
    "unpark": lambda ob, eid: ob.unpark_workspace(WS),
    "sweep-unverifiable": lambda ob, eid: ob.sweep_workspace_unverifiable(WS),
    "sweep-ledger": lambda ob, eid: ob.sweep_workspace_parked_errors(WS),
}


@pytest.mark.parametrize("action", list(OPERATOR_ACTIONS))
async def test_every_operator_action_recovers_a_dead_workers_staging_first(
    manual_outbox: Outbox, client: valkey_async.Valkey, action: str, clock: ManualClock
) -> None:
    """An action never works around staged entries whose holder is gone: it recovers them
    (verifying, back in accept order), then acts on the whole queue."""

    async def no_row(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        return ""

    manual_outbox.set_ledger_probe(no_row)
    older = await make_error(manual_outbox, clock, "older", unverifiable=True)
    staged = await manual_outbox.accept(WS, SES, "u", "later", "later")
    await died_mid_send(manual_outbox, client)
    await OPERATOR_ACTIONS[action](manual_outbox, older.id)
    assert await client.llen(SessionKeys(WS, SES).staging) == 0
    listed = await manual_outbox.list(WS, SES)
    assert [e.id for e in listed] == [older.id, staged.id]
    want = Status.PARKED if action == "park" else Status.VERIFYING
    assert listed[1].status is want


async def test_concurrent_edits_never_touch_a_neighbour(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    errors = [await make_error(manual_outbox, clock, f"e{i}") for i in range(10)]
    retry_ids = [e.id for e in errors[:5]]
    dismiss_ids = [e.id for e in errors[5:]]
    results = await asyncio.gather(
        *(manual_outbox.retry(WS, SES, i) for i in retry_ids),
        *(manual_outbox.dismiss(WS, SES, i) for i in dismiss_ids),
        manual_outbox.park_workspace(WS, "mode change"),
    )
    assert all(r in (RetryResult.UPDATED, DismissResult.REMOVED) for r in results[:10])
    listed = await manual_outbox.list(WS, SES)
    assert [e.id for e in listed] == retry_ids
    # Each retried entry is pending or (if the park saw it pending) parked; never an error.
    assert {e.status for e in listed} <= {Status.PENDING, Status.PARKED}
    assert results[10] == sum(e.status is Status.PARKED for e in listed)


# -- park / unpark / sweeps ------------------------------------------------------------------


async def test_park_and_unpark_workspace(manual_outbox: Outbox, clock: ManualClock) -> None:
    manual_outbox.set_verifier(ScriptedVerifier())
    p1 = await manual_outbox.accept(WS, "s1", "u", "a", "a")
    v = await manual_outbox.accept(WS, "s2", "u", "b", "b")
    await manual_outbox.deliver_once(WS, "s2", ScriptedAgent([ambiguous("cut")]))  # verifying
    err = await make_error(manual_outbox, clock, "c", ses="s3")
    await manual_outbox.accept("other", "s1", "u", "d", "d")  # another workspace

    assert await manual_outbox.park_workspace(WS, "mode_transition") == 2
    statuses = {
        e.id: (e.status, e.last_error)
        for s in ("s1", "s2", "s3")
        for e in await manual_outbox.list(WS, s)
    }
    assert statuses[p1.id][0] is Status.PARKED and "mode_transition" in statuses[p1.id][1]
    assert statuses[v.id][0] is Status.PARKED
    assert statuses[err.id][0] is Status.ERROR  # errors are not in flight: left alone
    assert (await manual_outbox.list("other", "s1"))[0].status is Status.PENDING

    agent = ScriptedAgent()
    clock.advance(60)
    assert not await manual_outbox.deliver_once(WS, "s1", agent)  # parked: inert
    behind = await manual_outbox.accept(WS, "s1", "u", "e", "after the park")
    assert await manual_outbox.deliver_once(WS, "s1", agent)  # parked does not block
    assert [e.id for _, _, e in agent.calls] == [behind.id]

    assert await manual_outbox.park_workspace(WS, "again") == 0  # idempotent
    assert await manual_outbox.unpark_workspace(WS) == 2
    assert (await manual_outbox.list(WS, "s1"))[0].status is Status.PENDING
    # It was verifying when parked: its send's outcome is still unknown, so verify first.
    assert (await manual_outbox.list(WS, "s2"))[0].status is Status.VERIFYING
    assert await manual_outbox.unpark_workspace(WS) == 0
    with pytest.raises(ValueError):
        await manual_outbox.park_workspace(WS, " ")


async def test_park_skips_a_busy_session(manual_outbox: Outbox) -> None:
    await manual_outbox.accept(WS, "s1", "u", "a", "in flight")
    await manual_outbox.accept(WS, "s1", "u", "b", "queued behind")
    await manual_outbox.accept(WS, "s2", "u", "c", "idle session")
    async with delivery_in_flight(manual_outbox, "s1"):
        assert await manual_outbox.park_workspace(WS, "flip") == 1  # s2 only
    assert await manual_outbox.park_workspace(WS, "flip") == 1  # s1's remaining entry now


async def test_sweep_unverifiable_rearms_only_unverifiable_errors(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    unverifiable = await make_error(manual_outbox, clock, "a", unverifiable=True)
    exhausted = await make_error(manual_outbox, clock, "b", ses="s2")
    assert await manual_outbox.sweep_workspace_unverifiable(WS) == 1
    [e] = await manual_outbox.list(WS, SES)
    assert (e.id, e.status, e.verify_attempts, e.next_attempt_at) == (
        unverifiable.id, Status.VERIFYING, 0, None,
    )  # fmt: skip
    assert (await manual_outbox.list(WS, "s2"))[0].id == exhausted.id
    assert (await manual_outbox.list(WS, "s2"))[0].status is Status.ERROR
    assert await manual_outbox.sweep_workspace_unverifiable(WS) == 0


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        (LEDGER_STATE_TURN_ENDED, "completed"),
        (LEDGER_STATE_PROMOTED, "completed"),
        ("", "rearmed"),
        (LEDGER_STATE_FAILED, "rearmed"),
        (LEDGER_STATE_LEDGERED, "left"),
        (LEDGER_STATE_ADMITTED, "left"),
        (RuntimeError("pod unreachable"), "left"),
    ],
)
async def test_parked_error_sweep_follows_the_ledger(
    manual_outbox: Outbox, state: str | Exception, outcome: str, clock: ManualClock
) -> None:
    delivered = HookLog()
    manual_outbox.set_on_delivered(delivered)
    asked: list[tuple[str, int]] = []

    async def probe(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        asked.append((entry_id, attempt))
        if isinstance(state, Exception):
            raise state
        return state

    assert await manual_outbox.sweep_workspace_parked_errors(WS) == 0  # no probe: no-op
    manual_outbox.set_ledger_probe(probe)
    e = await make_error(manual_outbox, clock, "a", unverifiable=True)
    proven = await make_error(
        manual_outbox, clock, "b", ses="s2"
    )  # attempts exhausted: never asked
    settled = await manual_outbox.sweep_workspace_parked_errors(WS)
    assert asked == [(e.id, 1)]
    listed = await manual_outbox.list(WS, SES)
    if outcome == "completed":
        assert settled == 1 and listed == [] and delivered.ids == [e.id]
    elif outcome == "rearmed":
        assert settled == 1 and listed[0].status is Status.PENDING and not delivered.ids
    else:
        assert settled == 0 and listed[0].status is Status.ERROR and not delivered.ids
    assert (await manual_outbox.list(WS, "s2"))[0].id == proven.id


async def test_parked_error_sweep_skips_a_busy_session(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    async def probe(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        return LEDGER_STATE_TURN_ENDED

    manual_outbox.set_ledger_probe(probe)
    await make_error(manual_outbox, clock, "a", unverifiable=True)
    await manual_outbox.accept(WS, SES, "u", "b", "in flight")
    async with delivery_in_flight(manual_outbox):
        assert await manual_outbox.sweep_workspace_parked_errors(WS) == 0
    assert await manual_outbox.sweep_workspace_parked_errors(WS) == 1


# -- cleanup ---------------------------------------------------------------------------------


async def test_cleanup_deletes_every_key_of_the_workspace_only(
    manual_outbox: Outbox, client: valkey_async.Valkey, clock: ManualClock
) -> None:
    await manual_outbox.accept(WS, "s1", "u", "a", "a")
    await make_error(manual_outbox, clock, "b", ses="s2")
    await manual_outbox.accept("wsx", "s1", "u", "a", "other tenant")
    await manual_outbox.accept("ws.x", "s1", "u", "a", "prefix-alike tenant")
    removed = await manual_outbox.cleanup_workspace(WS)
    keys = sorted(k.decode() for k in await client.keys("*"))
    assert not [k for k in keys if "{ws}" in k]
    assert removed >= 5  # queues, dedupe markers, indexes
    assert len(await manual_outbox.list("wsx", "s1")) == 1
    assert len(await manual_outbox.list("ws.x", "s1")) == 1
    assert await manual_outbox.cleanup_workspace(WS) == 0  # idempotent
    await manual_outbox.accept(WS, "s1", "u", "a", "a")  # markers are gone too


# -- racing completers -----------------------------------------------------------------------


@pytest.mark.parametrize("first", ["sync", "verified"])
async def test_sync_and_verified_completers_fire_on_delivered_once(
    connect_client: Callable[..., Client],
    client: Client,
    first: str,
) -> None:
    # Replica A's send stalls past its lease; replica B recovers the entry and verifies it
    # delivered; A's send returns 2xx before or after that. A's lease lapsed, so the fence
    # refuses its claim either way: the verification claims, and fires once.
    t = replace(FAST, lease_ttl=0.3)
    other = connect_client()
    b_clock = ManualClock()
    a, b = Outbox(client, t), Outbox(other, t, clock=b_clock)
    fired = HookLog()
    a.set_on_delivered(fired)
    b.set_on_delivered(fired)
    b.set_verifier(ScriptedVerifier([Verdict.DELIVERED]))
    entry = await a.accept(WS, SES, "u", "c", "hello")
    k = SessionKeys(WS, SES)
    release = asyncio.Event()

    async def stalled(ws: str, ses: str, e: Entry) -> None:
        await release.wait()

    a_task = asyncio.create_task(a.deliver_once(WS, SES, stalled))
    await eventually(lambda: _staged(client, k))
    await client.delete(k.lock)  # A's lease lapsed (as if its renewals were lost)
    b_clock.now = datetime.now(UTC)
    if first == "sync":
        release.set()
        assert await a_task
        assert fired.ids == []  # nobody holds the lock: A's claim is refused ('lost')
        assert await _staged(client, k)  # left staged, for the next holder to verify
        assert await b.deliver_once(WS, SES, ScriptedAgent())  # recover -> verifying
        b_clock.advance(60)  # past verify_delay
        assert await b.deliver_once(WS, SES, ScriptedAgent())  # verify -> claim -> fire
    else:
        assert await b.deliver_once(WS, SES, ScriptedAgent())  # recover -> verifying
        b_clock.advance(60)  # past verify_delay
        assert await b.deliver_once(WS, SES, ScriptedAgent())  # verify -> claim -> fire
        assert fired.ids == [entry.id]
        release.set()
        assert await a_task  # A's 2xx claims nothing: it must not fire again
    assert fired.ids == [entry.id]
    assert await a.list(WS, SES) == []


async def _staged(client: valkey_async.Valkey, k: SessionKeys) -> bool:
    return bool(await client.llen(k.staging))


async def test_counts_and_recovery_cover_every_workspace_on_every_shard(outbox: Outbox) -> None:
    # Twelve workspaces hash to slots all over a cluster's three primaries.
    workspaces = [f"tenant-{i}" for i in range(12)]
    for ws in workspaces:
        await outbox.accept(ws, SES, "u", "c1", "x")
    assert await outbox.count_by_status() == {"pending": 12}
    assert sorted(await outbox.count_by_workspace()) == sorted(workspaces)
    assert await outbox.recover() == 0
    assert sum([await outbox.park_workspace(ws, "hold") for ws in workspaces]) == 12
    assert await outbox.count_by_status() == {"parked": 12}
