"""deliver_once: every outcome class does exactly what the contract says (docs/contract.md)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import (
    Entry,
    Outbox,
    Status,
    Verdict,
    ambiguous,
    prior_attempt_pending,
    transient,
)
from prompt_outbox.core.keys import session_keys
from prompt_outbox.storage.replies import Acquire, Claim, Lock, Replace, ReplyError, parse
from prompt_outbox.storage.store import Store, notice_member
from tests.agents import HookLog, ScriptedAgent, ScriptedVerifier, WorkerDied
from tests.support.clock import ManualClock
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

WS, SES = "ws", "s1"


async def only(outbox: Outbox):  # type: ignore[no-untyped-def]
    [e] = await outbox.list(WS, SES)
    return e


async def test_success_stages_delivers_and_fires_hooks_once(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    staged, delivered = HookLog(), HookLog()
    manual_outbox.set_on_staged(staged)
    manual_outbox.set_on_delivered(delivered)
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent()
    assert await manual_outbox.deliver_once(WS, SES, agent)
    assert await manual_outbox.list(WS, SES) == []
    [(_, _, sent)] = agent.calls
    assert sent.id == entry.id and sent.status is Status.DELIVERING
    assert sent.last_attempt_at == clock.now  # the send window's start, for the verifier
    assert staged.ids == [entry.id] and delivered.ids == [entry.id]
    assert not await manual_outbox.deliver_once(WS, SES, agent)  # nothing left
    assert len(agent.calls) == 1


async def test_definitive_failure_backs_off_then_errors_at_max_attempts(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent([RuntimeError("400 bad request")] * 5)
    expected_backoffs = [0.05, 0.1]  # retry_backoff doubling (max_backoff 0.2)
    for attempt, delay in enumerate(expected_backoffs, start=1):
        assert await manual_outbox.deliver_once(WS, SES, agent)
        e = await only(manual_outbox)
        assert (e.status, e.attempts, e.last_error) == (Status.PENDING, attempt, "400 bad request")
        assert e.next_attempt_at == clock.now + timedelta(seconds=delay)
        # Not due yet: nothing is sent before the backoff has passed.
        assert not await manual_outbox.deliver_once(WS, SES, agent)
        assert len(agent.calls) == attempt
        clock.advance(delay)
    assert await manual_outbox.deliver_once(WS, SES, agent)
    e = await only(manual_outbox)
    assert e.status is Status.ERROR and e.attempts == FAST.max_attempts
    assert e.last_error.startswith("attempts exhausted")
    clock.advance(60)
    assert not await manual_outbox.deliver_once(WS, SES, agent)  # error entries are never retried
    assert len(agent.calls) == FAST.max_attempts


def test_backoff_caps_at_max_backoff() -> None:
    from prompt_outbox.core.machine import backoff

    assert [backoff(10, 120, n) for n in range(1, 7)] == [10, 20, 40, 80, 120, 120]
    assert backoff(10, 120, 10_000) == 120


async def test_ambiguous_goes_verifying_and_a_delivered_verdict_completes_without_resend(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    verifier = ScriptedVerifier([Verdict.DELIVERED])
    delivered = HookLog()
    manual_outbox.set_verifier(verifier)
    manual_outbox.set_on_delivered(delivered)
    entry = await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent([ambiguous(ConnectionResetError("cut mid-turn"))])
    assert await manual_outbox.deliver_once(WS, SES, agent)
    e = await only(manual_outbox)
    assert (e.status, e.attempts, e.verify_attempts) == (Status.VERIFYING, 0, 0)
    assert e.next_attempt_at == clock.now + timedelta(seconds=FAST.verify_delay)
    assert e.last_attempt_at == clock.now
    assert not await manual_outbox.deliver_once(WS, SES, agent)  # verify_delay not over
    clock.advance(FAST.verify_delay)
    assert await manual_outbox.deliver_once(WS, SES, agent)
    assert await manual_outbox.list(WS, SES) == []
    assert len(agent.calls) == 1  # never blind-retried
    assert [v.id for v in verifier.calls] == [entry.id]
    assert delivered.ids == [entry.id]


async def test_absent_verdict_is_a_definitive_failure_then_resent(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    manual_outbox.set_verifier(ScriptedVerifier([Verdict.ABSENT]))
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent([ambiguous("timeout")])
    await manual_outbox.deliver_once(WS, SES, agent)
    clock.advance(FAST.verify_delay)
    assert await manual_outbox.deliver_once(WS, SES, agent)
    e = await only(manual_outbox)
    assert (e.status, e.attempts, e.verify_attempts) == (Status.PENDING, 1, 0)
    clock.advance(FAST.retry_backoff)
    assert await manual_outbox.deliver_once(WS, SES, agent)
    assert len(agent.calls) == 2 and await manual_outbox.list(WS, SES) == []


async def test_inconclusive_rechecks_with_doubling_backoff_then_errors(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    verifier = ScriptedVerifier([Verdict.INCONCLUSIVE, RuntimeError("agent unreachable")])
    manual_outbox.set_verifier(verifier)
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    await manual_outbox.deliver_once(WS, SES, ScriptedAgent([ambiguous("cut")]))
    clock.advance(FAST.verify_delay)
    for passes, delay in [(1, 0.05), (2, 0.1)]:
        assert await manual_outbox.deliver_once(WS, SES, ScriptedAgent())
        e = await only(manual_outbox)
        assert (e.status, e.verify_attempts) == (Status.VERIFYING, passes)
        assert e.next_attempt_at == clock.now + timedelta(seconds=delay)
        clock.advance(delay)
    assert "agent unreachable" in e.last_error  # a raising verifier is inconclusive
    assert await manual_outbox.deliver_once(WS, SES, ScriptedAgent())
    e = await only(manual_outbox)
    assert e.status is Status.ERROR and e.verify_attempts == FAST.max_verify_attempts
    assert e.last_error.startswith("unverifiable")
    assert len(verifier.calls) == FAST.max_verify_attempts


async def test_ambiguous_without_verifier_is_an_unverifiable_error(manual_outbox: Outbox) -> None:
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent([ambiguous("cut")])
    assert await manual_outbox.deliver_once(WS, SES, agent)
    e = await only(manual_outbox)
    assert e.status is Status.ERROR and e.last_error.startswith("unverifiable")
    assert e.attempts == 0


async def test_timeout_is_ambiguous(client: valkey_async.Valkey, clock: ManualClock) -> None:
    outbox = Outbox(client, replace(FAST, delivery_timeout=0.2), clock=clock)
    outbox.set_verifier(ScriptedVerifier([Verdict.DELIVERED]))
    await outbox.accept(WS, SES, "u", "c1", "hello")
    slow = ScriptedAgent(delay=30)
    started = asyncio.get_running_loop().time()
    assert await outbox.deliver_once(WS, SES, slow)
    assert asyncio.get_running_loop().time() - started < 5  # bounded by delivery_timeout
    assert (await only(outbox)).status is Status.VERIFYING


@pytest.mark.parametrize("wrap", [transient, prior_attempt_pending])
async def test_transient_mints_no_attempt_and_has_its_own_bound(
    manual_outbox: Outbox,
    clock: ManualClock,
    wrap,  # type: ignore[no-untyped-def]
) -> None:
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent([wrap(OSError("resolve failed"))] * 5)
    for fails in range(1, FAST.max_transient_failures):
        assert await manual_outbox.deliver_once(WS, SES, agent)
        e = await only(manual_outbox)
        assert (e.status, e.attempts, e.transient_fails) == (Status.PENDING, 0, fails)
        clock.advance(1)
    assert await manual_outbox.deliver_once(WS, SES, agent)
    e = await only(manual_outbox)
    assert e.status is Status.ERROR and e.attempts == 0
    assert e.transient_fails == FAST.max_transient_failures
    assert e.last_error.startswith("transient failures exhausted")


async def test_wrapper_found_along_the_cause_chain(manual_outbox: Outbox) -> None:
    await manual_outbox.accept(WS, SES, "u", "c1", "hello")
    try:
        raise transient("endpoint not resolved")
    except Exception as inner:
        outer = RuntimeError("deliverer gave up")
        outer.__cause__ = inner
    await manual_outbox.deliver_once(WS, SES, ScriptedAgent([outer]))
    e = await only(manual_outbox)
    assert (e.attempts, e.transient_fails) == (0, 1)


async def test_blocking_head_holds_back_the_rest_but_errors_do_not(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    a = await manual_outbox.accept(WS, SES, "u", "a", "first")
    b = await manual_outbox.accept(WS, SES, "u", "b", "second")
    agent = ScriptedAgent([RuntimeError("down"), RuntimeError("down"), RuntimeError("down")])
    assert await manual_outbox.deliver_once(WS, SES, agent)  # a fails, backs off
    assert not await manual_outbox.deliver_once(WS, SES, agent)  # b must wait behind a
    assert agent.texts == ["first"]
    for _ in range(2):  # a runs out of attempts -> error
        clock.advance(1)
        await manual_outbox.deliver_once(WS, SES, agent)
    assert [(e.id, e.status) for e in await manual_outbox.list(WS, SES)] == [
        (a.id, Status.ERROR),
        (b.id, Status.PENDING),
    ]
    assert await manual_outbox.deliver_once(WS, SES, agent)  # error does not block b
    assert agent.texts == ["first"] * 3 + ["second"]


async def test_verifying_head_blocks_entries_behind(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    manual_outbox.set_verifier(ScriptedVerifier([Verdict.INCONCLUSIVE, Verdict.DELIVERED]))
    await manual_outbox.accept(WS, SES, "u", "a", "first")
    await manual_outbox.accept(WS, SES, "u", "b", "second")
    agent = ScriptedAgent([ambiguous("cut")])
    await manual_outbox.deliver_once(WS, SES, agent)
    clock.advance(FAST.verify_delay)
    await manual_outbox.deliver_once(WS, SES, agent)  # inconclusive: still verifying
    assert agent.texts == ["first"]
    assert not await manual_outbox.deliver_once(WS, SES, agent)
    clock.advance(1)
    await manual_outbox.deliver_once(WS, SES, agent)  # delivered verdict
    await manual_outbox.deliver_once(WS, SES, agent)
    assert agent.texts == ["first", "second"]


async def test_delivery_is_detached_from_a_cancelled_caller(outbox: Outbox) -> None:
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    entry = await outbox.accept(WS, SES, "u", "c1", "hello")
    agent = ScriptedAgent(delay=0.3)
    caller = asyncio.create_task(outbox.deliver_once(WS, SES, agent))
    await asyncio.sleep(0.1)
    assert agent.calls  # the send is under way
    caller.cancel()  # the phone killed its request
    with pytest.raises(asyncio.CancelledError):
        await caller
    await eventually(lambda: holds(delivered.ids == [entry.id]))
    assert await outbox.list(WS, SES) == []


async def test_a_restored_entry_keeps_its_fifo_place_behind_older_errors(
    manual_outbox: Outbox, clock: ManualClock
) -> None:
    # Regression: restore once LPUSHed, moving a failed entry in front of older error entries.
    ids = [(await manual_outbox.accept(WS, SES, "u", f"c{i}", f"p{i}")).id for i in range(3)]
    agent = ScriptedAgent([RuntimeError("no")] * (FAST.max_attempts + 1))
    for _ in range(FAST.max_attempts + 1):  # p0 to error, then one failure of p1
        clock.advance(60)
        await manual_outbox.deliver_once(WS, SES, agent)
    listed = await manual_outbox.list(WS, SES)
    assert [e.id for e in listed] == ids
    assert [e.status for e in listed] == [Status.ERROR, Status.PENDING, Status.PENDING]
    assert listed[1].attempts == 1


async def test_a_completion_retried_after_a_lost_reply_is_still_the_claim(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    """Regression (reasoned out from the network-fault scenario): a completion that ran but
    whose reply was lost is retried; if our lease lapsed meanwhile and another worker holds
    the session, the retry must still learn it claimed the entry, or OnDelivered never fires
    for a delivered prompt. The other holder claims nothing."""
    store = Store(client)
    entry = await outbox.accept(WS, SES, "u", "c1", "hello")
    k = session_keys(WS, SES)

    async def complete(lockval: str) -> Claim:
        got = await store.complete(k, entry.to_json(), entry.id, lockval, 1, grace_ms=0)
        return got.claim

    assert (await store.acquire(k, "mine:1", 10_000, 1)).kind is Acquire.HEAD
    assert await complete("mine:1") is Claim.CLAIMED  # its reply lost
    assert await complete("mine:1") is Claim.CLAIMED  # the retry
    await client.set(k.lock, "theirs:2", px=10_000)  # our lease lapsed; another holds it now
    assert await complete("mine:1") is Claim.CLAIMED
    assert await complete("theirs:2") is Claim.GONE
    assert await complete("third:3") is Claim.BUSY


# -- OnDelivered survives the death of the worker that claimed the entry ---------------------


async def test_a_hook_its_worker_never_made_is_made_by_another_worker(
    client: valkey_async.Valkey,
) -> None:
    """A worker killed between the claim and its OnDelivered (modelled by a hook that raises
    WorkerDied: nothing after it runs) leaves the call owed; a living replica makes it after
    hook_retry_after, once, with the entry as claimed."""
    t = replace(FAST, bookkeeping_timeout=0.4, hook_retry_after=0.5)
    dying = Outbox(client, t)

    async def killed(ws: str, ses: str, e: Entry) -> None:
        raise WorkerDied

    dying.set_on_delivered(killed)
    entry = await dying.accept(WS, SES, "u", "c1", "hello")
    with pytest.raises(WorkerDied):
        await dying.deliver_once(WS, SES, ScriptedAgent())
    assert await dying.list(WS, SES) == []  # claimed: it will not be sent again
    w = session_keys(WS, SES).workspace
    assert await client.hlen(w.notices) == 1  # ...and its hook is owed

    replica = Outbox(client, t)
    delivered = HookLog()
    replica.set_on_delivered(delivered)
    async with replica.running(ScriptedAgent(), tick=0.05):
        await eventually(lambda: holds(len(delivered.events) == 1), within=5)
        await asyncio.sleep(3 * t.hook_retry_after)  # long enough to fire twice, if it would
    assert [(ws, ses, e.id, e.text) for ws, ses, e in delivered.events] == [
        (WS, SES, entry.id, "hello")
    ]
    assert await client.hlen(w.notices) == 0 and await client.zcard(w.notices_due) == 0
    assert replica.metrics.hooks_refired._value.get() == 1


async def test_delivery_leaves_no_owed_hook_and_no_hook_means_no_record(
    client: valkey_async.Valkey,
) -> None:
    w = session_keys(WS, SES).workspace
    with_hook = Outbox(client, FAST)
    with_hook.set_on_delivered(HookLog())
    await with_hook.accept(WS, SES, "u", "c1", "hello")
    assert await with_hook.deliver_once(WS, SES, ScriptedAgent())
    assert await client.hlen(w.notices) == 0 and await client.zcard(w.notices_due) == 0
    without = Outbox(client, FAST)
    await without.accept(WS, SES, "u", "c2", "hello")
    assert await without.deliver_once(WS, SES, ScriptedAgent())
    assert not await client.exists(w.notices, w.notices_due)


async def test_an_owed_hook_is_taken_by_one_worker_at_a_time(client: valkey_async.Valkey) -> None:
    store = Store(client)
    w = session_keys(WS, SES).workspace
    await client.hset(w.notices, "s1:e1", '{"id":"e1"}')
    await client.zadd(w.notices_due, {"s1:e1": 1000})
    assert await store.take_notices(w, 999, 5000, 10) == []  # not overdue yet
    assert await store.take_notices(w, 1000, 5000, 10) == [("s1", "e1", '{"id":"e1"}')]
    assert await store.take_notices(w, 1001, 5000, 10) == []  # taken until 6000
    assert await store.take_notices(w, 6000, 5000, 10) == [("s1", "e1", '{"id":"e1"}')]
    assert await store.notified(w, [notice_member("s1", "e1")])
    assert await store.take_notices(w, 99_999, 5000, 10) == []


async def test_a_reply_word_a_script_does_not_list_is_an_error(client: valkey_async.Valkey) -> None:
    """One reply convention, checked per script: a word outside a script's own set (or a
    reply that is not {word, ...}) raises, never passes as a default."""
    assert parse(Lock, [b"busy"]) == (Lock.BUSY, [])
    assert parse(Replace, ["ok", 2]) == (Replace.OK, [2])
    with pytest.raises(ReplyError, match="Lock has no reply 'lost'"):
        parse(Lock, [b"lost"])
    with pytest.raises(ReplyError):
        parse(Claim, 1)
    with pytest.raises(ReplyError):
        parse(Claim, [])
