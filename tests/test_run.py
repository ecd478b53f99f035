"""run(): one delivery in flight per session across replicas, sessions in parallel, wake-ups,
the join on cancellation, and work found without scanning the keyspace."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import (
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_TURN_ENDED,
    Entry,
    Outbox,
    Status,
    ambiguous,
)
from prompt_outbox.core.keys import WorkspaceKeys
from prompt_outbox.storage.client import Client
from tests.agents import HookLog, ScriptedAgent, WorkerDied
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too


class InFlightTracker:
    """A deliverer that records how many sends of one session overlap."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self.order: dict[str, list[str]] = defaultdict(list)

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.in_flight[ses] += 1
        self.max_in_flight[ses] = max(self.max_in_flight[ses], self.in_flight[ses])
        try:
            await asyncio.sleep(self.delay)
            self.order[ses].append(entry.text)
        finally:
            self.in_flight[ses] -= 1


async def test_two_replicas_keep_one_in_flight_per_session_in_order(
    connect_client: Callable[..., Client], client: Client
) -> None:
    other_client = connect_client()
    a, b = Outbox(client, FAST), Outbox(other_client, FAST)
    delivered: list[str] = []
    hook = HookLog(on_call=lambda e: delivered.append(e.id))
    a.set_on_delivered(hook)
    b.set_on_delivered(hook)
    tracker = InFlightTracker(delay=0.02)
    sessions = [f"s{i}" for i in range(4)]
    accepted = []
    for ses in sessions:
        for n in range(8):
            accepted.append((await a.accept("ws", ses, "u", f"{ses}-{n}", f"{ses} #{n}")).id)
    async with a.running(tracker), b.running(tracker):
        await eventually(lambda: holds(len(delivered) == len(accepted)), within=20)
    assert sorted(delivered) == sorted(accepted)  # each OnDelivered exactly once
    for ses in sessions:
        assert tracker.max_in_flight[ses] == 1
        assert tracker.order[ses] == [f"{ses} #{n}" for n in range(8)]


async def test_a_slow_session_does_not_stall_the_others(outbox: Outbox) -> None:
    done: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        if ses == "slow":
            await asyncio.sleep(1.5)
        done[entry.text] = loop.time()

    await outbox.accept("ws", "slow", "u", "c", "slow one")
    for i in range(5):
        await outbox.accept("ws", f"fast{i}", "u", "c", f"fast {i}")
    start = loop.time()
    async with outbox.running(deliver):
        await eventually(lambda: holds(len(done) == 6), within=10)
    fast = [done[f"fast {i}"] - start for i in range(5)]
    assert max(fast) < done["slow one"] - start  # all fast sessions finished first


async def test_accept_wakes_an_idle_loop_long_before_the_tick(outbox: Outbox) -> None:
    loop = asyncio.get_running_loop()
    delivered_at: list[float] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        delivered_at.append(loop.time())

    async with outbox.running(deliver, tick=30.0):
        await asyncio.sleep(0.3)  # the loop is now asleep for up to 30 s
        accepted_at = loop.time()
        await outbox.accept("ws", "s1", "u", "c1", "wake up")
        await eventually(lambda: holds(bool(delivered_at)), within=10)
    assert delivered_at[0] - accepted_at < 3.0  # milliseconds in practice; the tick is 30 s


async def test_accept_through_another_client_wakes_the_loop(
    connect_client: Callable[..., Client], outbox: Outbox
) -> None:
    # The wake-up travels through Valkey pub/sub, so an API replica wakes a worker replica.
    loop = asyncio.get_running_loop()
    delivered_at: list[float] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        delivered_at.append(loop.time())

    api_client = connect_client()
    api = Outbox(api_client, FAST)
    async with outbox.running(deliver, tick=30.0):
        await asyncio.sleep(0.3)
        accepted_at = loop.time()
        await api.accept("ws", "s1", "u", "c1", "from the API replica")
        await eventually(lambda: holds(bool(delivered_at)), within=10)
    assert delivered_at[0] - accepted_at < 3.0


async def test_run_finds_work_without_scanning_the_keyspace(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    for i in range(20):  # unrelated keys the loop must never walk
        await client.set(f"unrelated:{i}", "x")
    await client.config_resetstat()
    agent = ScriptedAgent()
    async with outbox.running(agent, tick=0.05):
        for w in range(3):
            for s in range(3):
                await outbox.accept(f"ws{w}", f"s{s}", "u", "c", "hi")
        await eventually(lambda: holds(len(agent.calls) == 9), within=10)
        await asyncio.sleep(0.5)  # several idle ticks
    stats = await client.info("commandstats")
    assert not any(name in stats for name in ("cmdstat_scan", "cmdstat_keys"))


async def test_run_sweeps_parked_errors_with_a_ledger_probe(client: valkey_async.Valkey) -> None:
    outbox = Outbox(client, replace(FAST, parked_sweep_interval=0.2))
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    probed: list[tuple[str, int]] = []

    async def probe(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        probed.append((entry_id, attempt))
        return LEDGER_STATE_TURN_ENDED

    outbox.set_ledger_probe(probe)
    entry = await outbox.accept("ws", "s1", "u", "c1", "hello")
    # No verifier wired: the ambiguous send parks the entry as an unverifiable error.
    async with outbox.running(ScriptedAgent([ambiguous("cut")]), tick=0.05):
        await eventually(lambda: holds(delivered.ids == [entry.id]), within=10)
    assert probed[0] == (entry.id, 1)
    assert await outbox.list("ws", "s1") == []


async def test_errors_left_alone_without_a_probe(outbox: Outbox) -> None:
    await outbox.accept("ws", "s1", "u", "c1", "hello")
    agent = ScriptedAgent([ambiguous("cut")])
    async with outbox.running(agent, tick=0.05):
        await eventually(lambda: _listed_status(outbox, Status.ERROR))
        await asyncio.sleep(0.5)
    [e] = await outbox.list("ws", "s1")
    assert e.status is Status.ERROR and len(agent.calls) == 1


async def _listed_status(outbox: Outbox, status: Status) -> bool:
    entries = await outbox.list("ws", "s1")
    return bool(entries) and entries[0].status is status


async def test_run_stops_when_cancelled_at_any_moment(outbox: Outbox) -> None:
    # Regression: valkey-py 6.2 asyncio commands sometimes swallow a CancelledError; run() once
    # kept looping forever when the cancel landed inside one. It must stop on every cancel.
    import random

    rng = random.Random(7)
    agent = ScriptedAgent()
    before = asyncio.all_tasks()
    for i in range(40):
        await outbox.accept("ws", f"s{i % 4}", "u", f"c{i}", "x")
        task = asyncio.create_task(outbox.run(agent, tick=0.01))
        await asyncio.sleep(rng.random() * 0.03)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, f"run() ignored cancel #{i}"
        assert task.cancelled()
    assert asyncio.all_tasks() == before  # every delivery it started has finished


async def test_repair_pass_restores_a_lost_index_entry(client: valkey_async.Valkey) -> None:
    from prompt_outbox.core.keys import WorkspaceKeys

    outbox = Outbox(client, replace(FAST, repair_interval=0.3))
    await outbox.accept("ws", "s1", "u", "c1", "hello")
    await client.zrem(WorkspaceKeys("ws").ready, "s1")  # the index lost the session
    agent = ScriptedAgent()
    async with outbox.running(agent, tick=0.05):
        await asyncio.sleep(0.15)
        assert not agent.calls  # nothing points the loop at the session...
        await eventually(lambda: holds(bool(agent.calls)), within=5)  # ...until the repair pass
    assert await outbox.list("ws", "s1") == []


async def test_idle_workspaces_leave_the_registry_but_busy_ones_stay(
    client: valkey_async.Valkey,
) -> None:
    outbox = Outbox(client, replace(FAST, repair_interval=0.1, idle_workspace_ttl=0.2))
    await outbox.accept("idle", "s1", "u", "c1", "x")
    await outbox.accept("busy", "s1", "u", "c1", "x")
    await outbox.park_workspace("busy", "hold")  # keeps an entry, so it must stay registered
    async with outbox.running(ScriptedAgent(), tick=0.05):
        await eventually(lambda: _not_registered(client, "idle"), within=5)
    assert not await _not_registered(client, "busy")
    await outbox.accept("idle", "s1", "u", "c2", "back")  # an accept registers it again
    assert not await _not_registered(client, "idle")


async def _not_registered(client: valkey_async.Valkey, ws: str) -> bool:
    from prompt_outbox.core.keys import WorkspaceKeys

    return not await client.hexists(WorkspaceKeys(ws).bucket.registry, ws)


async def test_works_with_a_decoding_client(
    connect_client: Callable[..., Client], client: Client
) -> None:
    decoding = connect_client(decode_responses=True)
    outbox = Outbox(decoding, FAST)
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    entry = await outbox.accept("ws", "s1", "u", "c1", "héllo", model='{"a":[]}')
    assert (await outbox.list("ws", "s1"))[0].model == '{"a":[]}'
    async with outbox.running(ScriptedAgent(), tick=0.05):
        await eventually(lambda: holds(delivered.ids == [entry.id]))
    assert await outbox.recover() == 0


async def _stop_mid_send(outbox: Outbox, agent: ScriptedAgent, how: str) -> None:
    """Start delivery, wait until the agent is mid-send, then stop delivery ``how``."""
    if how == "cancel run()":
        run = asyncio.create_task(outbox.run(agent, tick=0.1))
        await eventually(lambda: holds(bool(agent.calls)))
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    elif how == "leave the running() block":
        async with outbox.running(agent, tick=0.1):
            await eventually(lambda: holds(bool(agent.calls)))
    else:
        with pytest.raises(LookupError, match="the caller's own error"):
            async with outbox.running(agent, tick=0.1):
                await eventually(lambda: holds(bool(agent.calls)))
                raise LookupError("the caller's own error")


@pytest.mark.parametrize(
    "how", ["cancel run()", "leave the running() block", "raise in the running() block"]
)
async def test_stopping_mid_delivery_joins_it_and_leaves_no_task(outbox: Outbox, how: str) -> None:
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    entry = await outbox.accept("ws", "s1", "u", "c1", "long turn")
    before = asyncio.all_tasks()
    await _stop_mid_send(outbox, ScriptedAgent(delay=0.5), how)
    # Stopping returned only after the in-flight send finished under its own context.
    assert delivered.ids == [entry.id]
    assert await outbox.list("ws", "s1") == []
    assert asyncio.all_tasks() == before


async def test_seeded_go_entries_are_delivered_as_written(outbox: Outbox) -> None:
    """seed_entry_for_test (the contract's SeedEntryForTest): a queue written by the Go service,
    with its nanosecond times and raw model, is delivered in order with the model intact."""
    first = (
        '{"id":"go-1","clientMessageID":"c1","userID":"u","text":"one","model":[],'
        '"acceptedAt":"2026-08-15T10:00:00.123456789Z","attempts":0,'
        '"lastAttemptAt":"0001-01-01T00:00:00Z","status":"pending"}'
    )
    second = first.replace("go-1", "go-2").replace('"one"', '"two"').replace("c1", "c2")
    await outbox.seed_entry_for_test("ws", "s1", first)
    await outbox.seed_entry_for_test("ws", "s1", second)
    with pytest.raises(ValueError):
        await outbox.seed_entry_for_test("ws", "s1", '{"id":"no acceptedAt"}')
    assert [e.id for e in await outbox.list("ws", "s1")] == ["go-1", "go-2"]
    agent = ScriptedAgent()
    async with outbox.running(agent, tick=0.05):
        await eventually(lambda: holds(len(agent.calls) == 2))
    assert [(e.id, e.model) for _, _, e in agent.calls] == [("go-1", "[]"), ("go-2", "[]")]
    assert await outbox.list("ws", "s1") == []


async def test_a_cancel_during_running_shutdown_is_raised_not_swallowed(outbox: Outbox) -> None:
    """Leaving running() waits for the send in flight; a cancel that lands meanwhile (a
    timeout, a task group, shutdown) must still end the caller as cancelled, after the join."""
    delivered = HookLog()
    outbox.set_on_delivered(delivered)
    entry = await outbox.accept("ws", "s1", "u", "c1", "long turn")
    agent = ScriptedAgent(delay=0.5)

    async def user() -> str:
        async with outbox.running(agent, tick=0.1):
            await eventually(lambda: holds(bool(agent.calls)))
        await asyncio.sleep(10)  # past the block: a swallowed cancel would end up here
        return "went on as if not cancelled"

    task = asyncio.create_task(user())
    await eventually(lambda: holds(bool(agent.calls)))
    await asyncio.sleep(0.05)  # most likely inside the join by now (either way: cancelled)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done and task.cancelled()
    assert delivered.ids == [entry.id]  # the send finished under its own context first


async def test_stopping_does_not_wait_for_the_whole_ledger_sweep(outbox: Outbox) -> None:
    """Each ledger probe may take up to delivery_timeout: a stopping loop finishes the probe
    in flight, then stops sweeping, instead of visiting every remaining session first."""
    for i in range(5):
        await outbox.accept("ws", f"s{i}", "u", "c1", "x")
        assert await outbox.deliver_once("ws", f"s{i}", ScriptedAgent([ambiguous("cut")]))
    probed: list[str] = []

    async def slow_probe(ws: str, ses: str, entry_id: str, attempt: int) -> str:
        probed.append(ses)
        await asyncio.sleep(0.5)
        return LEDGER_STATE_LEDGERED  # leaves the entry as it is

    outbox.set_ledger_probe(slow_probe)
    async with outbox.running(ScriptedAgent(), tick=0.05):
        await eventually(lambda: holds(bool(probed)))
    assert len(probed) == 1  # the sweep saw the loop stop before its next session


class Stuck:
    """An OnDelivered hook or a ledger probe that never returns by itself (until ``free``):
    it records that it started and whether it was cancelled."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.free = asyncio.Event()

    async def wait(self) -> None:
        self.started += 1
        try:
            await self.free.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def hook(self, ws: str, ses: str, entry: Entry) -> None:
        await self.wait()

    async def probe(self, ws: str, ses: str, entry_id: str, attempt: int) -> str:
        await self.wait()
        return LEDGER_STATE_LEDGERED


async def _stopped(outbox: Outbox, stuck: Stuck) -> None:
    """Run delivery until ``stuck`` is called, then leave the block: stopping must return
    (30 s is a hang guard, far above the grace), and the stuck call must have been cut."""

    async def run_until_stuck() -> None:
        async with outbox.running(ScriptedAgent(), tick=0.05):
            await eventually(lambda: holds(stuck.started > 0))

    task = asyncio.create_task(run_until_stuck())
    try:
        done, _ = await asyncio.wait({task}, timeout=30)
        assert done, "stopping waited on a call that never returns"
        task.result()
    finally:
        stuck.free.set()  # lets a hung stop (today's) end
        await asyncio.wait({task})
    assert stuck.cancelled == 1


async def test_stopping_cuts_an_owed_hook_that_never_returns(client: Client) -> None:
    """A pass that makes a dead worker's owed OnDelivered call started by the loop; the hook
    hangs. Stopping gives it the grace, then cancels it; the call stays owed (another worker
    makes it), nothing is lost."""
    t = replace(FAST, bookkeeping_timeout=0.4, hook_retry_after=0.5)
    dying = Outbox(client, t)

    async def killed(ws: str, ses: str, e: Entry) -> None:
        raise WorkerDied

    dying.set_on_delivered(killed)
    await dying.accept("ws", "s1", "u", "c1", "hello")
    with pytest.raises(WorkerDied):
        await dying.deliver_once("ws", "s1", ScriptedAgent())
    replica, stuck = Outbox(client, t), Stuck()
    replica.set_on_delivered(stuck.hook)
    before = asyncio.all_tasks()
    await _stopped(replica, stuck)
    assert asyncio.all_tasks() == before
    assert await client.hlen(WorkspaceKeys("ws").notices) == 1  # still owed


async def test_stopping_cuts_a_ledger_probe_that_takes_a_whole_turn(client: Client) -> None:
    """A ledger probe may take up to delivery_timeout (ten minutes by default): a stopping
    loop cuts the sweep after the grace instead of waiting for it."""
    outbox = Outbox(client, replace(FAST, delivery_timeout=120.0))
    await outbox.accept("ws", "s1", "u", "c1", "x")
    assert await outbox.deliver_once("ws", "s1", ScriptedAgent([ambiguous("cut")]))
    stuck = Stuck()
    outbox.set_ledger_probe(stuck.probe)
    await _stopped(outbox, stuck)
    assert [e.status for e in await outbox.list("ws", "s1")] == [Status.ERROR]
