"""Long agent turns (docs/design.md, "Turns"; core/turns.py): a deliverer hands back a Turn, the
session stays held in turn by a record in Valkey (no worker task, slot or request), and its next
entry is sent only after the turn ends: through ``Outbox.end_turn``, a TurnWatcher, a check with
the agent, or the ceiling. Against a real Valkey (and the cluster), across Outbox instances as
across processes. tests/test_opencode_turns.py has it against a real opencode."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import replace

import pytest

from prompt_outbox import (
    Entry,
    Outbox,
    SessionBusy,
    Turn,
    TurnEnd,
    TurnEnded,
    TurnState,
)
from prompt_outbox.core.entry import Status, decode_entry
from prompt_outbox.core.events import QueueEvent
from prompt_outbox.core.keys import OWNERS, SessionKeys
from prompt_outbox.core.turns import TurnHold
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.replies import Write
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

WS, SES = "acme", "chat-1"
# Checks every 0.2 s, so a turn nobody heard end is found in a test's time.
TURNS = dataclasses.replace(FAST, turn_check_interval=0.2)


class TurnAgent:
    """An agent whose every prompt starts a turn that runs until ``finish`` (or an abort):
    the deliverer returns at once with the turn's ID, as opencode's prompt_async does."""

    def __init__(self) -> None:
        self.delivered: list[str] = []
        self.running: dict[str, str] = {}  # session -> turn ID
        self.strict = True  # a prompt sent into a running turn is a failure

    async def __call__(self, ws: str, ses: str, entry: Entry) -> Turn:
        assert not (self.strict and ses in self.running), "a prompt was sent into a running turn"
        self.delivered.append(entry.text)
        self.running[ses] = f"turn-{entry.text}"
        return Turn(self.running[ses])

    def finish(self, ses: str) -> str:
        return self.running.pop(ses)


class WatchingAgent(TurnAgent):
    """A TurnAgent that can be asked about its turns (TurnWatcher) and aborted (Aborter)."""

    def __init__(self, *, answer: TurnState | None = None) -> None:
        super().__init__()
        self.answer = answer  # a fixed answer (UNKNOWN: an agent that cannot say)
        self.ended: TurnEnded | None = None
        self.asked: list[str] = []
        self.aborts: list[str] = []

    def watch_turns(self, ended: TurnEnded | None) -> None:
        self.ended = ended

    async def turn_state(self, ws: str, ses: str, turn_id: str) -> TurnState:
        self.asked.append(turn_id)
        if self.answer is not None:
            return self.answer
        return TurnState.RUNNING if self.running.get(ses) == turn_id else TurnState.ENDED

    async def abort(self, ws: str, ses: str) -> None:
        self.aborts.append(ses)
        self.running.pop(ses, None)


async def _texts(outbox: Outbox, ses: str = SES) -> list[str]:
    return [e.text for e in await outbox.list(WS, ses)]


async def _collect(outbox: Outbox, into: list[QueueEvent]) -> None:
    """Every event of the session from now on (a watch started before the accepts)."""
    async for item in outbox.watch(WS, SES, poll=0.1):
        if isinstance(item, QueueEvent):
            into.append(item)


async def test_the_next_prompt_waits_for_the_turn_to_end(client: Client) -> None:
    worker, api = Outbox(client, TURNS), Outbox(client, TURNS)
    agent = TurnAgent()
    events: list[QueueEvent] = []
    watching = asyncio.create_task(_collect(api, events))
    await asyncio.sleep(0.2)  # the watch has read its reset
    # Both accepted before any worker runs, so the log's order below is the only one.
    await api.accept(WS, SES, "u", "c1", "A")
    await api.accept(WS, SES, "u", "c2", "B")
    async with worker.running(agent):
        await eventually(lambda: holds(agent.delivered == ["A"]))
        await eventually(lambda: holds(True))
        [b] = await eventually(lambda: api.list(WS, SES))
        assert b.text == "B" and b.blocked_by_in_flight and b.in_turn_for > 0
        await asyncio.sleep(0.6)  # several checks' worth: nobody asks this agent, B waits
        assert agent.delivered == ["A"]
        ended = await api.end_turn(WS, SES, agent.finish(SES))
        assert ended.ended and ended.seconds > 0
        await eventually(lambda: holds(agent.delivered == ["A", "B"]))
        # An end for a turn that is over, or never was, ends nothing.
        assert await api.end_turn(WS, SES, "turn-A") == TurnEnd(False)
        assert await api.end_turn(WS, SES, "no-such-turn") == TurnEnd(False)
        assert (await api.end_turn(WS, SES, agent.finish(SES))).ended
        await eventually(lambda: holds(len(events) >= 10))
    watching.cancel()
    kinds = [(e.kind, e.turn.turn if e.turn else e.entry_id) for e in events]
    a, b = events[0].entry_id, events[1].entry_id
    assert kinds == [
        ("accepted", a),
        ("accepted", b),
        ("delivering", a),
        ("sent", a),
        ("turn", "turn-A"),
        ("turn_ended", "turn-A"),
        ("delivering", b),
        ("sent", b),
        ("turn", "turn-B"),
        ("turn_ended", "turn-B"),
    ]
    assert events[5].turn is not None and events[5].turn.why == "ended"
    assert events[5].turn.seconds >= 0.6


async def test_a_turn_holds_no_send_slot(client: Client) -> None:
    # One slot, three sessions, every turn endless: each session still gets its send.
    t = dataclasses.replace(TURNS, concurrency=1)
    outbox = Outbox(client, t)
    agent = TurnAgent()
    async with outbox.running(agent):
        for n in range(3):
            await outbox.accept(WS, f"s{n}", "u", f"c{n}", f"p{n}")
        await eventually(lambda: holds(sorted(agent.delivered) == ["p0", "p1", "p2"]))
    assert set(agent.running) == {"s0", "s1", "s2"}


async def test_reject_and_interrupt_see_a_session_in_turn_as_busy(client: Client) -> None:
    outbox = Outbox(client, TURNS)
    agent = WatchingAgent()
    async with outbox.running(agent):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await eventually(lambda: holds(agent.running.get(SES) == "turn-A"))
        with pytest.raises(SessionBusy):
            await outbox.accept(WS, SES, "u", "c2", "rejected", while_busy="reject")
        assert await _texts(outbox) == []
        # An interrupt is taken, and the turn is aborted through the agent; B follows it.
        await outbox.accept(WS, SES, "u", "c3", "B", while_busy="interrupt")
        await eventually(lambda: holds(agent.aborts == [SES]))
        await eventually(lambda: holds(agent.delivered == ["A", "B"]))
    assert agent.aborts == [SES]


async def test_a_new_worker_learns_the_end_of_a_turn_an_old_one_started(client: Client) -> None:
    first = WatchingAgent()
    async with Outbox(client, TURNS).running(first):
        await Outbox(client, TURNS).accept(WS, SES, "u", "c1", "A")
        await eventually(lambda: holds(first.delivered == ["A"]))
    # That worker is gone; B waits. The turn ends while no worker runs.
    api = Outbox(client, TURNS)
    await api.accept(WS, SES, "u", "c2", "B")
    second = WatchingAgent()
    second.running = {}  # this agent's turn A is over: a check finds it ended
    async with Outbox(client, TURNS).running(second):
        await eventually(lambda: holds(second.delivered == ["B"]))
    assert second.asked[:1] == ["turn-A"]


async def test_a_watcher_ends_turns_as_its_agent_reports_them(client: Client) -> None:
    slow = dataclasses.replace(TURNS, turn_check_interval=600.0)  # no check would find it
    outbox = Outbox(client, slow)
    agent = WatchingAgent()
    async with outbox.running(agent):
        assert agent.ended is not None  # wired as the run loop starts
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        await eventually(lambda: holds(agent.delivered == ["A"]))
        await agent.ended(WS, SES, agent.finish(SES))
        await eventually(lambda: holds(agent.delivered == ["A", "B"]))
    assert agent.ended is None and agent.asked == []  # unwired as it stops; never asked


async def test_a_turn_past_its_ceiling_is_checked_aborted_and_let_go(client: Client) -> None:
    t = dataclasses.replace(TURNS, turn_ceiling=0.5, turn_grace=30.0)
    outbox = Outbox(client, t)
    agent = WatchingAgent()
    async with outbox.running(agent):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        await eventually(lambda: holds(agent.delivered == ["A", "B"]), within=10)
    assert agent.aborts[:1] == [SES] and "turn-A" in agent.asked
    assert outbox.metrics.turns_ended.labels(why="ceiling")._value.get() >= 1


async def _waiting_with_why(outbox: Outbox) -> list[Entry]:
    listed = await outbox.list(WS, SES)
    return listed if listed and listed[0].turn_why else []


async def test_an_agent_that_cannot_answer_holds_the_turn_to_its_bound(client: Client) -> None:
    t = dataclasses.replace(TURNS, turn_ceiling=0.3, turn_grace=1.0)
    outbox = Outbox(client, t)
    agent = WatchingAgent(answer=TurnState.UNKNOWN)
    agent.strict = False  # it never says the turn ended: the bound lets it go
    async with outbox.running(agent):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        await eventually(lambda: holds(len(agent.asked) >= 1))
        # The agent cannot say: held (past the ceiling too), and B says why it waits.
        [b] = await eventually(lambda: _waiting_with_why(outbox))
        assert b.in_turn_for > 0 and agent.delivered == ["A"]
        assert "did not say whether the turn ended" in b.turn_why
        assert '"turnWhy":' in b.to_list_json()
        await eventually(lambda: holds(agent.delivered == ["A", "B"]), within=10)
    assert agent.aborts == []  # nothing to abort on the agent's word
    assert outbox.metrics.turns_ended.labels(why="unreachable")._value.get() == 1


async def test_a_blocking_deliverer_still_holds_no_turn(client: Client) -> None:
    outbox = Outbox(client, TURNS)
    sent: list[str] = []

    async def blocking(ws: str, ses: str, entry: Entry) -> None:
        sent.append(entry.text)

    async with outbox.running(blocking):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        await eventually(lambda: holds(sent == ["A", "B"]))
    assert outbox.metrics.turns_started._value.get() == 0


async def test_the_turns_of_a_worker_whose_heartbeat_lapsed_are_released(client: Client) -> None:
    # A worker that owned a turn and died: its turn record names it, its heartbeat lapsed.
    gone = Outbox(client, TURNS)
    gone._engine.turns.owner = "w-gone"  # as a running worker's Turns.keeping sets it
    dead = WatchingAgent()
    await gone.accept(WS, SES, "u", "c1", "A")
    await gone.accept(WS, SES, "u", "c2", "B")
    assert await gone.deliver_once(WS, SES, dead)  # A sent; its turn held, owned by w-gone
    await client.zadd(OWNERS, {"w-gone": 1})
    [b] = await gone.list(WS, SES)
    assert b.in_turn_for >= 0 and b.blocked_by_in_flight
    # Its check in Valkey is at the ceiling (two hours): only the release brings it sooner.
    second = WatchingAgent()  # A's turn is over by now: a check finds it ended
    worker = Outbox(client, TURNS)
    async with worker.running(second):
        await eventually(lambda: holds(second.delivered == ["B"]))
    assert second.asked[:1] == ["turn-A"]
    assert await client.zscore(OWNERS, "w-gone") is None  # taken off, by the one who released


async def test_an_owner_whose_agent_cannot_answer_says_why_where_the_next_entry_waits(
    client: Client,
) -> None:
    outbox = Outbox(client, TURNS)  # a ceiling of two hours: only the owner asks
    agent = WatchingAgent(answer=TurnState.UNKNOWN)
    async with outbox.running(agent):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        [b] = await eventually(lambda: _waiting_with_why(outbox))
        assert "did not say whether the turn ended" in b.turn_why
        agent.answer = TurnState.RUNNING  # it answers again: the why is cleared
        await eventually(lambda: _waiting_without_why(outbox))
        assert agent.delivered == ["A"]


async def _waiting_without_why(outbox: Outbox) -> bool:
    listed = await outbox.list(WS, SES)
    return bool(listed) and not listed[0].turn_why and listed[0].in_turn_for > 0


async def test_a_release_whose_worker_died_is_taken_again(client: Client) -> None:
    gone = Outbox(client, TURNS)
    gone._engine.turns.owner = "w-gone"
    await gone.accept(WS, SES, "u", "c1", "A")
    await gone.accept(WS, SES, "u", "c2", "B")
    assert await gone.deliver_once(WS, SES, WatchingAgent())
    await client.zadd(OWNERS, {"w-gone": 1})
    # A worker took the release for a lease, then died before it released anything.
    assert await gone._store.turns.claim_dead("w-gone", 2, 1000)
    assert not await gone._store.turns.claim_dead("w-gone", 3, 1000)  # taken: not twice
    # Its lease lapses (the score is long past): the next worker takes it again.
    second = WatchingAgent()
    async with Outbox(client, TURNS).running(second):
        await eventually(lambda: holds(second.delivered == ["B"]))
    assert await client.zscore(OWNERS, "w-gone") is None


async def test_an_owner_forgets_turns_it_cannot_ask_about_past_their_bound(
    client: Client,
) -> None:
    """A turn of a deliverer that cannot be asked ends by ``end_turn``, maybe in another
    process: its owner never hears of it. Past the lock's own expiry its record goes, or a
    worker's memory would grow with every session it ever sent to."""
    # The records are kept some 2.8 s from each claim (the ceiling and its margins): the 0.4 s
    # below passes well inside that, however slowly a loaded machine made the three claims.
    short = dataclasses.replace(TURNS, turn_ceiling=2.0, turn_grace=0.1, lease_ttl=0.3)
    worker, api = Outbox(client, short), Outbox(client, short)
    agent = TurnAgent()
    async with worker.running(agent):
        for n in range(3):
            await api.accept(WS, f"s{n}", "u", f"c{n}", f"p{n}")
        await eventually(lambda: holds(len(worker._engine.turns.owned) == 3))
        for n in range(3):
            assert (await api.end_turn(WS, f"s{n}", agent.finish(f"s{n}"))).ended
        await asyncio.sleep(0.4)
        assert len(worker._engine.turns.owned) == 3  # ended elsewhere: not heard of here
        await eventually(lambda: holds(not worker._engine.turns.owned), within=10)


async def test_an_end_that_outruns_its_claim_is_kept_for_it(client: Client) -> None:
    # The agent's end can come before the claim that holds its turn (a receiver that ends at
    # once): the claim then holds none, and the next prompt goes without waiting for a check.
    slow = dataclasses.replace(TURNS, turn_check_interval=600.0)
    outbox = Outbox(client, slow)
    sent: list[str] = []

    async def agent(ws: str, ses: str, entry: Entry) -> Turn:
        sent.append(entry.text)
        if entry.text == "A":  # its end is reported before this send returns
            assert await outbox.end_turn(ws, ses, "turn-A") == TurnEnd(False)
        return Turn(f"turn-{entry.text}")

    events: list[QueueEvent] = []
    watching = asyncio.create_task(_collect(outbox, events))
    await asyncio.sleep(0.2)
    async with outbox.running(agent):
        await outbox.accept(WS, SES, "u", "c1", "A")
        await outbox.accept(WS, SES, "u", "c2", "B")
        await eventually(lambda: holds(sent == ["A", "B"]))
        assert (await outbox.turn(WS, SES)) is not None  # B's turn is held, A's never was
        await eventually(lambda: holds(any(e.kind == "turn_ended" for e in events)))
    watching.cancel()
    [ended] = [e for e in events if e.kind == "turn_ended"]
    assert ended.turn is not None and (ended.turn.turn, ended.turn.seconds) == ("turn-A", 0.0)


async def test_a_retried_claim_keeps_a_turn_that_ended_early_ended(client: Client) -> None:
    # The claim found the turn's end first (none held), and its reply was lost: the retry
    # must not hold the turn after all (it would wait for a check, or the ceiling).
    outbox = Outbox(client, TURNS)
    store = outbox._store
    k = SessionKeys(WS, SES)
    entry = await outbox.accept(WS, SES, "u", "c1", "A")
    now = 1_800_000_000_000
    got = await store.acquire(k, "tok:1", 30_000, now)
    staged = replace(decode_entry(got.entries[0]), status=Status.DELIVERING).to_json()
    assert await store.stage(k, "tok:1", got.entries[0], staged) is Write.OK
    assert await outbox.end_turn(WS, SES, "t1") == TurnEnd(False)  # the end outruns the claim
    value = TurnHold("t1", entry.id, now, now + 1000).encode()
    for _ in range(2):  # the claim, then its retry
        claimed = await store.complete(
            k, staged, entry.id, "tok:1", now, 0, 0, value, 60_000, "", "t1"
        )
        assert claimed.ended_early
        assert await store.turns.lock_value(k) == "tok:1"  # our token, not the turn


async def test_an_early_end_is_kept_only_while_a_send_is_in_flight(client: Client) -> None:
    # An end that names no held turn is kept for the claim of a send in flight, the only claim
    # it can be for. Any other session (never seen, idle with a queue, locked with nothing
    # staged, held in another turn) gets no key: an end per invented session name cost one.
    outbox = Outbox(client, TURNS)
    store = outbox._store
    now = 1_800_000_000_000

    async def kept(ses: str, turn: str) -> bool:
        assert await outbox.end_turn(WS, ses, turn) == TurnEnd(False)
        return bool(await client.exists(SessionKeys(WS, ses).early_end))

    assert not await kept("never-seen", "t")
    await outbox.accept(WS, "idle", "u", "c1", "A")
    assert not await kept("idle", "t")  # queued, nothing sent
    locked = SessionKeys(WS, "locked")
    await outbox.accept(WS, "locked", "u", "c1", "A")
    got = await store.acquire(locked, "tok:1", 30_000, now)
    assert got.entries
    assert not await kept("locked", "t")  # a worker holds it, nothing staged yet
    staged = replace(decode_entry(got.entries[0]), status=Status.DELIVERING).to_json()
    assert await store.stage(locked, "tok:1", got.entries[0], staged) is Write.OK
    assert await kept("locked", "t")  # in flight: kept for its claim
    entry = await outbox.accept(WS, "held", "u", "c1", "A")
    held = SessionKeys(WS, "held")
    got = await store.acquire(held, "tok:2", 30_000, now)
    staged = replace(decode_entry(got.entries[0]), status=Status.DELIVERING).to_json()
    assert await store.stage(held, "tok:2", got.entries[0], staged) is Write.OK
    value = TurnHold("t1", entry.id, now, now + 60_000).encode()
    claimed = await store.complete(
        held, staged, entry.id, "tok:2", now, 0, 0, value, 60_000, "", "t1"
    )
    assert not claimed.ended_early and await outbox.turn(WS, "held") is not None
    assert not await kept("held", "t2")  # held in another turn: no send in flight
    assert (await outbox.end_turn(WS, "held", "t1")).ended
