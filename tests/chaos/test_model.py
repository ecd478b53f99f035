"""Scenario 4: a hypothesis state machine drives the real Outbox (real Valkey, a manual clock)
and the reference model side by side: accept, sends with each outcome class, verdicts, retry,
dismiss, park, unpark, the unverifiable and ledger sweeps, a worker dying mid-send or
mid-verification (its lease live, then lapsed), recover, clock advance. After every step
the List output (order, status, counters, due time, why it stopped, the in-flight flag) and
the OnDelivered calls must agree."""

from __future__ import annotations

import asyncio

import pytest
import valkey.asyncio as valkey_async
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from prompt_outbox import (
    Duplicate,
    Entry,
    IdempotencyKeyReused,
    Outbox,
    OutboxFull,
    Tunables,
    Verdict,
    ambiguous,
    transient,
)
from prompt_outbox.core.keys import session_keys
from prompt_outbox.core.ledger import LEDGER_STATES, NO_LEDGER_ROW
from prompt_outbox.core.machine import (
    ATTEMPTS_EXHAUSTED,
    PARKED,
    PARKED_WHILE_VERIFYING,
    TRANSIENT_EXHAUSTED,
    UNVERIFIABLE,
)
from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.store import Store
from tests import tally
from tests.agents import WorkerDied
from tests.chaos import report
from tests.chaos.model import Model
from tests.support.clock import ManualClock

WS, SES = "model", "s1"
TUNABLES = Tunables(
    max_attempts=3,
    cap=4,
    retry_backoff=1.0,
    max_backoff=3.0,
    verify_delay=0.5,
    verify_backoff=1.0,
    max_verify_backoff=2.0,
    max_verify_attempts=3,
    max_transient_failures=3,
    delivery_timeout=5.0,
)
STOPPED = [
    (ATTEMPTS_EXHAUSTED, "exhausted"),
    (UNVERIFIABLE, "unverifiable"),
    (TRANSIENT_EXHAUSTED, "transient"),
    (PARKED_WHILE_VERIFYING, "parked-v"),
    (PARKED, "parked"),
]
OUTCOMES = {
    "ok": None,
    "definitive": RuntimeError("refused"),
    "ambiguous": ambiguous("cut"),
    "transient": transient("down"),
    "dies": WorkerDied(),  # the worker dies in the call; its lease is still live
    "dies-long-ago": WorkerDied(),  # ...and its lease has lapsed since
}
PROBE_FAILS = "probe fails"
VERDICTS = {
    "delivered": Verdict.DELIVERED,
    "absent": Verdict.ABSENT,
    "inconclusive": Verdict.INCONCLUSIVE,
}


# Preconditions: a rule only fires where it can do something, so the search reaches the deep
# states (a dead worker's entry next to an exhausted one...) within the default budget.


def head_due(m: OutboxVersusModel) -> bool:
    return m.model.head(m.clock.now) is not None


def holding(*statuses: str):  # type: ignore[no-untyped-def]
    def check(m: OutboxVersusModel) -> bool:
        return any(e.status in statuses for e in m.model.listed())

    return check


def stopped_kind(e: Entry) -> str:
    return next((kind for prefix, kind in STOPPED if e.last_error.startswith(prefix)), "")


class OutboxVersusModel(RuleBasedStateMachine):
    url = ""
    checks = 0  # invariant checks run (each compares List and the hooks with the model)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.client = valkey_async.Valkey.from_url(self.url)
        self.run(self.client.flushall())
        self.clock = ManualClock()
        self.outbox = Outbox(self.client, TUNABLES, clock=self.clock)
        self.store = Store(self.client)  # only to run repair.lua: the full re-derivation
        self.model = Model(TUNABLES)
        self.hooks: list[str] = []
        self.verdict = Verdict.INCONCLUSIVE
        self.calls = 0

        async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
            self.hooks.append(entry.id)

        async def verifier(ws: str, ses: str, entry: Entry) -> Verdict:
            self.calls += 1
            if self.dies:
                raise WorkerDied
            return self.verdict

        async def probe(ws: str, ses: str, entry_id: str, attempt: int) -> str:
            if self.ledger == PROBE_FAILS:
                raise ConnectionError("agent unreachable")
            return self.ledger

        self.ledger = NO_LEDGER_ROW
        self.outbox.set_on_delivered(on_delivered)
        self.outbox.set_verifier(verifier)
        self.outbox.set_ledger_probe(probe)
        self.cmids = 0
        self.dies = False
        self.log_overhead: int | None = None  # what the log took beyond its first event

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.client.aclose())
        self.loop.close()

    @rule(repeat=st.booleans(), other_text=st.booleans())
    def accept(self, repeat: bool, other_text: bool) -> None:
        if not repeat or not self.cmids:
            self.cmids += 1
        cmid = f"c{self.cmids}"
        text = "other text" if other_text else "text"  # a repeat with it reuses the key
        self.clock.advance(0.001)  # accept order is time order, as with a real clock
        new_id = ""
        try:
            new_id = self.run(self.outbox.accept(WS, SES, "u", cmid, text)).id
            got = "ok"
        except Duplicate as exc:
            got = f"dup:{exc.accepted_id}"
        except IdempotencyKeyReused as exc:
            got = f"reused:{exc.accepted_id}"
        except OutboxFull:
            got = "full"
        assert self.model.accept(cmid, new_id, text) == got

    @initialize(
        stopped=st.lists(st.sampled_from(["definitive", "transient", "ambiguous"]), max_size=2),
        pending=st.integers(0, 3),
        dead_worker=st.sampled_from(["", "dies", "dies-long-ago"]),
    )
    def a_session_with_a_past(self, stopped: list[str], pending: int, dead_worker: str) -> None:
        """Start deep: entries that already stopped in error (by each cause), then pending
        ones, perhaps the first of them left staged by a worker that died, so the budget of
        examples is spent on the interleavings that matter."""
        for outcome in stopped:
            self.accept(repeat=False, other_text=False)
            self.agent_down_until_the_head_stops(outcome)
        for _ in range(pending):
            self.accept(repeat=False, other_text=False)
        if dead_worker and head_due(self):
            self.step(dead_worker, "inconclusive")

    @rule(outcome=st.sampled_from(list(OUTCOMES)), verdict=st.sampled_from(list(VERDICTS)))
    def step(self, outcome: str, verdict: str) -> None:
        """One deliver_once. With outcome "dies" the worker dies inside the agent call (the
        entry stays staged) or inside the verifier call (it stays verifying), its lease still
        live; with "dies-long-ago" the lease has lapsed too."""
        calls: list[str] = []

        async def agent(ws: str, ses: str, entry: Entry) -> None:
            calls.append(entry.id)
            if OUTCOMES[outcome] is not None:
                raise OUTCOMES[outcome]  # type: ignore[misc]

        dies = outcome.startswith("dies")
        self.verdict, self.calls, self.dies = VERDICTS[verdict], 0, dies
        head = self.model.head(self.clock.now)
        try:
            acted, died = self.run(self.outbox.deliver_once(WS, SES, agent)), False
        except WorkerDied:
            acted = died = True
        finally:
            self.dies = False
        if self.model.staged and not self.model.locked:  # a dead worker's send: recovered
            assert acted and not died and not calls and not self.calls
            self.model.recover(self.clock.now)
            return
        assert acted == (head is not None)
        assert died == (head is not None and dies)
        if head is None:
            assert not calls and not self.calls
        elif head.status == "pending":
            assert calls == [head.id] and not self.calls
            if died:
                self.model.died_sending(head)
            else:
                self.model.send(head, outcome, self.clock.now)
        else:
            assert not calls and self.calls == 1
            if died:
                self.model.locked = True
            else:
                self.model.verify(head, verdict, self.clock.now)
        if died and outcome == "dies-long-ago":
            self.lease_lapses()

    @precondition(head_due)
    @rule(outcome=st.sampled_from(["definitive", "transient", "ambiguous"]))
    def agent_down_until_the_head_stops(self, outcome: str) -> None:
        """The agent stays down: the head fails (an ambiguous send then verifies inconclusive)
        at each due time until it stops in error. Reaches the deep states quickly."""
        head = self.model.head(self.clock.now)
        for _ in range(2 * (TUNABLES.max_attempts + TUNABLES.max_verify_attempts) + 2):
            if head is None or head.status == "error" or head not in self.model.entries:
                return
            self.advance_to_the_head()
            self.step(outcome, "inconclusive")
            self.list_and_hooks_agree()
        raise AssertionError(f"the head never stopped: {head}")

    @precondition(lambda m: m.model.locked)
    @rule()
    def lease_lapses(self) -> None:
        """The dead worker's lease runs out (the lock key expires)."""
        self.run(self.client.delete(session_keys(WS, SES).lock))
        self.model.locked = False

    @rule(pick=st.integers(0, 5), known=st.booleans())
    def retry(self, pick: int, known: bool) -> None:
        entry_id = self._pick(pick) if known else "nosuchentry"
        got = self.run(self.outbox.retry(WS, SES, entry_id))
        assert got.name == self.model.retry(entry_id, self.clock.now)

    @rule(pick=st.integers(0, 5), known=st.booleans())
    def dismiss(self, pick: int, known: bool) -> None:
        entry_id = self._pick(pick) if known else "nosuchentry"
        got = self.run(self.outbox.dismiss(WS, SES, entry_id))
        assert got.name == self.model.dismiss(entry_id, self.clock.now)

    @rule()
    def park(self) -> None:
        assert self.run(self.outbox.park_workspace(WS, "ops")) == self.model.park(self.clock.now)

    @precondition(holding("parked", "delivering"))
    @rule()
    def unpark(self) -> None:
        assert self.run(self.outbox.unpark_workspace(WS)) == self.model.unpark(self.clock.now)

    @precondition(holding("error", "delivering"))
    @rule()
    def sweep_unverifiable(self) -> None:
        got = self.run(self.outbox.sweep_workspace_unverifiable(WS))
        assert got == self.model.sweep_unverifiable(self.clock.now)

    @precondition(holding("error"))
    @rule(answer=st.sampled_from([NO_LEDGER_ROW, *LEDGER_STATES, PROBE_FAILS]))
    def ledger_sweep(self, answer: str) -> None:
        self.ledger = answer
        got = self.run(self.outbox.sweep_workspace_parked_errors(WS))
        assert got == self.model.ledger_sweep(answer, self.clock.now)

    @rule()
    def recover(self) -> None:
        assert self.run(self.outbox.recover()) == self.model.recover(self.clock.now)

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda m: any(e.status in ("pending", "verifying") for e in m.model.entries))
    @rule()
    def advance_to_the_head(self) -> None:
        """Jump to when the head is due (so long failure chains are reached quickly)."""
        for e in self.model.entries:
            if e.status in ("pending", "verifying"):
                if e.next_at is not None and e.next_at > self.clock.now:
                    self.clock.now = e.next_at
                return

    def _pick(self, i: int) -> str:
        ids = [e.id for e in self.model.listed()]
        return ids[i % len(ids)] if ids else "nosuchentry"

    @invariant()
    def list_and_hooks_agree(self) -> None:
        OutboxVersusModel.checks += 1
        listed = self.run(self.outbox.list(WS, SES))
        got = [
            (e.id, str(e.status), e.attempts, e.verify_attempts, e.transient_fails,
             e.next_attempt_at, stopped_kind(e), e.blocked_by_in_flight)
            for e in listed
        ]  # fmt: skip
        locked = self.model.locked
        want = [
            (e.id, e.status, e.attempts, e.verify_attempts, e.transient_fails, e.next_at,
             e.stopped, locked and e.status == "pending")
            for e in self.model.listed()
        ]  # fmt: skip
        assert got == want
        assert self.hooks == self.model.delivered

    @invariant()
    def indexes_are_what_a_full_refresh_derives(self) -> None:
        # The hot scripts re-derive only what they can have changed (refresh_head reads the
        # queue up to its head, not the whole queue): the sessions and errors indexes must
        # still be exactly what repair.lua, which reads everything, derives from the same
        # lists. (The ready score is left out: after a lease the test lapsed by deleting the
        # lock, it still says when the lease would have ended, as it should.) The workspace
        # quota's count, kept by every script, must be the session's entries, as repair says;
        # the overview's tally (entries by status, the oldest pending entry, the send start of
        # the entry in flight), moved by accept, stage and complete and derived by the rest,
        # must be what a recount of the lists gives, and what repair derives.
        k = session_keys(WS, SES)
        keys = k.script_keys()
        sessions, errors, count = keys[4], keys[5], keys[7]

        async def indexes() -> tuple[bool, bool, int]:
            return (
                bool(await self.client.sismember(sessions, SES)),
                bool(await self.client.sismember(errors, SES)),
                int(await self.client.hget(count, SES) or 0),
            )

        async def entries() -> int:
            return int(await self.client.llen(k.queue)) + int(await self.client.llen(k.staging))

        incremental = self.run(indexes())
        assert incremental[2] == self.run(entries())
        kept = self.run(tally.stored(self.client, WS))
        assert kept == self.run(tally.recounted(self.client, WS))
        sized = self.run(tally.sized(self.client, WS))
        assert sized == self.run(tally.resized(self.client, WS))  # the budget's queued bytes
        self.run(self.store.repair(k, round(self.clock.now.timestamp() * 1000)))
        assert incremental == self.run(indexes())
        assert kept == self.run(tally.stored(self.client, WS))
        assert sized == self.run(tally.sized(self.client, WS))

    @invariant()
    def log_bytes_count_every_event(self) -> None:
        # The workspace's byte budget counts what each event carries (its ID, its fields'
        # names and values) as emit() logs it, every script's events, exactly; and the log's
        # first event at what the new log took whole, a fixed sum beyond what it carries; the
        # log's own record says the same. (One session, a log that neither trims, nor expires,
        # nor begins again within a run.)
        k = session_keys(WS, SES)
        rows = self.run(self.client.xrange(k.events))
        carried = sum(
            len(event_id) + sum(len(name) + len(value) for name, value in fields.items())
            for event_id, fields in rows
        )
        written = self.run(self.client.hgetall(k.workspace.log_bytes))
        counted = sum(int(n) for field, n in written.items() if field.isdigit())
        if rows:
            record = written[k.events.encode()].decode()
            assert int(record.partition(":")[2]) == counted
        if not rows:
            assert counted == 0
        elif self.log_overhead is None:
            self.log_overhead = counted - carried
            assert self.log_overhead > 0  # the stream's own node, key and structure
        else:
            assert counted - carried == self.log_overhead


RUNS = [
    pytest.param(300, id="short"),
    pytest.param(3000, id="long", marks=pytest.mark.slow),
]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("examples", RUNS)
def test_the_outbox_follows_the_reference_model(
    valkey_server: EmbeddedValkey, examples: int
) -> None:
    OutboxVersusModel.url = valkey_server.url
    OutboxVersusModel.checks = 0
    run_state_machine_as_test(
        OutboxVersusModel,
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    report.add_line(
        f"model-based ({examples} examples, up to 40 steps): "
        f"{OutboxVersusModel.checks} List / hook comparisons, 0 divergences"
    )
