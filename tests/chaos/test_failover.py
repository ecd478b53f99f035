"""The failover scenario (docs/reliability.md, "The scenarios"). A primary with one replica,
both from the bundled binary, AOF on, ``appendfsync everysec`` (so that ``WAITAOF`` matters),
and a 3-master cluster with one replica per master. Nothing is delivered before a failover, so a
second delivery could only come from the failover itself.

1. Standalone, ``replica``: concurrent clients (one task per session) accept for a while; the
   client task that gets an acknowledgement SIGKILLs the primary at once, while the others
   are in flight; the clients keep trying (and fail) for a moment; the replica is promoted
   (``REPLICAOF NO ONE``) and the old primary comes back on its own data as its replica. A
   new client and Outbox on the promoted replica: every acknowledged ID must be listed. Each
   client sends its unacknowledged prompt again with the same clientMessageID (the answer is
   recorded: ``Duplicate`` when the write had survived, a fresh accept when it had not), and
   one more. An in-process agent then delivers everything through the library's run loop;
   the History checker wants each acknowledged entry delivered once, none twice, each
   session's order kept.
2. The same under ``none``: the acknowledged accepts lost are counted and reported, not
   asserted. Both levels run on a direct link, and on a lagging one: the replica's link
   runs through a proxy that holds its bytes for a second, and the kill comes half a second
   into that, the held bytes dying with the primary (a replica behind when its primary dies).
3. A frozen replica (SIGSTOP) under load: N concurrent ``replica`` accepts each answer
   ``NotDurable`` within ``durability_timeout`` plus a margin (never hang); each entry is
   listed once; after the thaw the retries (same clientMessageID) answer ``Duplicate`` with
   the same IDs.
4. Cluster, ``replica``: clients accept into one workspace per master (``key_served_by``);
   one master fails over right after an acknowledgement from its shard (``CLUSTER FAILOVER
   FORCE`` through ``failover()``; the long form also SIGKILLs masters, waits for their
   replicas to take over and brings them back). Every acknowledged accept must be listed
   afterwards and delivered exactly once; the client that lived through the failover must
   still list, and every failed accept must have failed clearly (no error but Valkey's).

Each run adds a row to the chaos summary, and a line "scenario | level | acknowledged | lost |
delivered twice | not durable" to the one-line results.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from valkey.asyncio.cluster import ValkeyCluster
from valkey.crc import key_slot
from valkey.exceptions import ValkeyError

from prompt_outbox import (
    Duplicate,
    DurabilityLevel,
    Entry,
    NotDurable,
    Outbox,
    Tunables,
)
from prompt_outbox.embedded import answers_ping, free_port
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.connect import connect
from prompt_outbox.storage.store import TRANSIENT_ERRORS
from tests.chaos import report
from tests.chaos.harness import workspace_of
from tests.chaos.history import History, Verdict, check
from tests.chaos.proxy import FaultyProxy
from tests.chaos.settings import CHAOS_TUNABLES
from tests.cluster import LocalCluster, key_served_by, owner_of
from tests.replication import (
    REPLICATION_FLAGS,
    ReplicatedPair,
    halt,
    info,
    node_client,
    online_replica_ports,
    replica_synced,
    settle_replication,
    spawn,
    wait_until,
)

pytest_plugins = ["tests.replication_fixtures"]

DURABILITY_TIMEOUT = 3.0  # an everysec replica reports its fsync once a second
NEVER_HANGS = 10.0  # no accept may take longer than durability_timeout plus this
SOCKET_TIMEOUT = DURABILITY_TIMEOUT + NEVER_HANGS  # must exceed durability_timeout
RETRY_PAUSE = 0.1  # a client waits this long before it sends the same clientMessageID again
OUTAGE = 0.5  # seconds the clients keep trying the killed primary before the promotion
SETTLE = 60.0  # seconds the delivery of everything may take


# What a client takes for "not acknowledged, send it again": Valkey unavailable, any error reply.
UNAVAILABLE: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, ValkeyError)


def tunables(level: DurabilityLevel) -> Tunables:
    """The chaos timings, at ``level``; the cap is out of the way (nothing is delivered
    before the failover, so the sessions fill up)."""
    return replace(
        CHAOS_TUNABLES,
        accept_durability=level,
        durability_timeout=DURABILITY_TIMEOUT,
        cap=2000,
    )


def open_client(url: str) -> Client:
    return connect(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2)


# -- the clients ---------------------------------------------------------------------------


class Trigger:
    """A fault run from inside the client task that has just been acknowledged, before any
    other task runs: ``arm(when, action)``, then the next acknowledgement of a session for
    which ``when(session)`` holds runs ``action`` and sets the returned event."""

    def __init__(self) -> None:
        self._armed: tuple[Callable[[str], bool], Callable[[], None], asyncio.Event] | None = None

    def arm(self, when: Callable[[str], bool], action: Callable[[], None]) -> asyncio.Event:
        fired = asyncio.Event()
        self._armed = (when, action, fired)
        return fired

    def disarm(self) -> None:
        self._armed = None

    def __call__(self, ses: str, entry_id: str) -> None:
        if self._armed is not None and self._armed[0](ses):
            _, action, fired = self._armed
            self._armed = None
            action()
            fired.set()


@dataclass
class Clients:
    """The accepting clients of a run, one task per session. Each sends its prompts in
    order, and a prompt not acknowledged (``NotDurable``, an error, no answer) again with the
    same clientMessageID before the next one: what a careful client does."""

    where: dict[str, str]  # session -> workspace
    on_ack: Callable[[str, str], None] = lambda ses, entry_id: None
    history: History = field(default_factory=History)
    answers: Counter[str] = field(default_factory=Counter)  # every attempt's answer, by kind
    pending: dict[str, tuple[str, int]] = field(default_factory=dict)  # ses -> (cmid, i)
    sent: Counter[str] = field(default_factory=Counter)  # ses -> prompts begun
    slowest: float = 0.0  # seconds, the longest attempt

    async def attempt(self, outbox: Outbox, ses: str, cmid: str, i: int) -> tuple[str, str]:
        """One accept: (kind of answer, acknowledged ID or "")."""
        started = time.monotonic()
        kind, entry_id = "ok", ""
        try:
            async with asyncio.timeout(DURABILITY_TIMEOUT + NEVER_HANGS):
                entry = await outbox.accept(self.where[ses], ses, "u", cmid, f"{i} of {ses}")
            entry_id = entry.id
        except Duplicate as dup:
            kind, entry_id = "duplicate", dup.accepted_id
        except NotDurable:
            kind = "not durable"
        except TimeoutError:  # asyncio.timeout's (valkey's own TimeoutError is not this one)
            kind = "hung"
        except UNAVAILABLE as err:
            kind = f"error {type(err).__name__}"
        except Exception as err:  # not a clear "unavailable": counted, and failed on at the end
            kind = f"unexpected {type(err).__name__}: {err}"
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.answers[kind] += 1
        return kind, entry_id

    def _current(self, ses: str) -> tuple[str, int]:
        if ses not in self.pending:
            i = self.sent[ses]
            self.sent[ses] += 1
            self.pending[ses] = (f"{ses}-{i}", i)
        return self.pending[ses]

    def _acknowledged(self, ses: str, entry_id: str) -> None:
        del self.pending[ses]
        self.history.accepted.setdefault(ses, []).append(entry_id)
        self.on_ack(ses, entry_id)  # at once: a fault triggered here follows this answer

    async def load(self, outbox: Outbox, ses: str, stop: asyncio.Event, pause: float) -> None:
        """New prompts until ``stop``; the one not yet acknowledged then stays ``pending``."""
        while not stop.is_set():
            cmid, i = self._current(ses)
            _, entry_id = await self.attempt(outbox, ses, cmid, i)
            if entry_id:
                self._acknowledged(ses, entry_id)
                await asyncio.sleep(pause)
            else:
                await asyncio.sleep(RETRY_PAUSE)

    async def finish(self, outbox: Outbox, ses: str, more: int, deadline: float) -> str:
        """Send the pending prompt again until it is acknowledged, then ``more`` new ones.
        Returns the kind of answer that acknowledged the pending one ("" if none was)."""
        first = ""
        todo = more + (ses in self.pending)
        while todo and time.monotonic() < deadline:
            had_pending = ses in self.pending
            cmid, i = self._current(ses)
            kind, entry_id = await self.attempt(outbox, ses, cmid, i)
            if not entry_id:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            self._acknowledged(ses, entry_id)
            first = first or (kind if had_pending else "")
            todo -= 1
        return first

    async def finish_all(self, outbox: Outbox, more: int, within: float) -> Counter[str]:
        """``finish`` every session at once; what acknowledged each pending prompt."""
        deadline = time.monotonic() + within
        had = set(self.pending)
        kinds = await asyncio.gather(*(self.finish(outbox, s, more, deadline) for s in self.where))
        answered = zip(self.where, kinds, strict=True)
        return Counter(k or "unanswered" for s, k in answered if s in had)

    def acknowledged(self) -> list[str]:
        return [i for ids in self.history.accepted.values() for i in ids]


async def run_load(
    clients: Clients, outbox: Outbox, pause: float, faults: Callable[[], Awaitable[None]]
) -> None:
    """Every session's ``load`` while ``faults()`` (a coroutine) runs; then stop them."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(clients.load(outbox, s, stop, pause)) for s in clients.where]
    try:
        await faults()
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- delivery and the checks -----------------------------------------------------------------


class Agent:
    """An in-process agent that records every deliverer call and OnDelivered in a History."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def deliver(self, ws: str, ses: str, entry: Entry) -> None:
        h = self.history
        h.sends += 1
        if not h.agent_seen[entry.id]:
            h.agent_order.setdefault(ses, []).append(entry.id)
        h.agent_seen[entry.id] += 1

    async def on_delivered(self, ws: str, ses: str, entry: Entry) -> None:
        self.history.hooks[entry.id] += 1


async def listed(outbox: Outbox, where: dict[str, str]) -> dict[str, list[Entry]]:
    return {ses: await outbox.list(ws, ses) for ses, ws in where.items()}


async def deliver_everything(outbox: Outbox, where: dict[str, str], history: History) -> None:
    """The library's run loop with the recording agent, until every session is empty (or
    SETTLE runs out); what is still listed then goes to ``history.final``. The harness's
    ``settle`` names workspaces by ``workspace_of``; the cluster's are picked per master."""
    agent = Agent(history)
    outbox.set_on_delivered(agent.on_delivered)
    deadline = time.monotonic() + SETTLE
    async with outbox.running(agent.deliver, tick=0.05):
        while True:
            history.final = await listed(outbox, where)
            if not any(history.final.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)


@dataclass(frozen=True)
class Outcome:
    """One run's figures, beyond the History checker's verdict."""

    scenario: str
    level: str
    verdict: Verdict
    missing: list[str]  # acknowledged, not listed after the failover (before any retry)
    unacknowledged_delivered: int  # delivered but never acknowledged to a client
    answers: Counter[str]
    retried: Counter[str]  # what acknowledged each prompt pending at the failover
    slowest: float

    def publish(self, faults: str) -> None:
        v = self.verdict
        answers = ", ".join(f"{k} {n}" for k, n in sorted(self.answers.items()))
        retried = ", ".join(f"{k} {n}" for k, n in sorted(self.retried.items())) or "-"
        report.add(self.scenario, faults, v)
        report.add_line(
            f"{self.scenario} | {self.level} | acknowledged {v.accepted} | lost {v.lost}"
            f"{' (nothing lost)' if not v.lost else ''} | delivered twice {v.agent_duplicates}"
            f" | not durable {self.answers['not durable']} | pending prompts sent again: "
            f"{retried} | every answer: {answers} | slowest accept {self.slowest:.1f} s"
        )

    def assert_delivered_once(self) -> None:
        """What holds at every level: what is there is delivered once, in order, with its
        OnDelivered; nothing unacknowledged surfaces (each pending prompt was sent again)."""
        v = self.verdict
        assert (v.agent_duplicates, v.hook_duplicates, v.hook_missing) == (0, 0, 0), v
        assert (v.stuck, v.order_violations, v.listed_stopped) == (0, 0, 0), v
        assert v.lost == len(self.missing), (v, self.missing)
        assert self.unacknowledged_delivered == 0, self
        assert self.answers["hung"] == 0 and self.slowest < DURABILITY_TIMEOUT + NEVER_HANGS
        assert "unanswered" not in self.retried, self.retried

    def assert_clear_answers(self) -> None:
        """Every accept that failed said so clearly (Valkey unavailable, NotDurable): over
        HTTP anything else is a 500."""
        unexpected = {k: n for k, n in self.answers.items() if k.startswith("unexpected")}
        assert not unexpected, unexpected


def outcome(
    scenario: str,
    level: str,
    clients: Clients,
    missing: list[str],
    retried: Counter[str],
) -> Outcome:
    history = clients.history
    acknowledged = set(clients.acknowledged())
    return Outcome(
        scenario=scenario,
        level=level,
        verdict=check(history),
        missing=missing,
        unacknowledged_delivered=sum(1 for i in history.agent_seen if i not in acknowledged),
        answers=clients.answers,
        retried=retried,
        slowest=clients.slowest,
    )


# -- 1 and 2: a standalone primary SIGKILLed, its replica promoted -------------------------------

LAG = 1.0  # seconds the replica link holds its bytes, in the lagging form
LAG_KILL = 0.5  # ...and how far into that the kill is armed


def replicate_through(pair: ReplicatedPair, port: int, timeout: float = 20.0) -> None:
    """Point the replica at ``port`` (a proxy to its primary): it resumes with a partial
    resync. Blocking: run it in a thread while the proxy runs on the loop."""
    with node_client(pair.replica_port) as replica:
        replica.execute_command("REPLICAOF", "127.0.0.1", port)

    def resumed() -> bool:
        return info(pair.replica_port, "replication")["master_port"] == port and replica_synced(
            pair.replica_port
        )

    wait_until(resumed, timeout, "replica through the proxy")
    wait_until(
        lambda: pair.replica_port in online_replica_ports(pair.primary_port), timeout, "online"
    )
    settle_replication(pair.primary_port, 1, timeout)


@contextlib.contextmanager
def old_primary_rejoins(pair: ReplicatedPair, timeout: float = 20.0) -> Iterator[int]:
    """The SIGKILLed primary comes back on its own data directory as a replica of the
    promoted one (it resyncs from it), so ``replica`` accepts have a replica again. Its port."""
    port = free_port()
    flags = ["--appendonly", "yes", "--appendfsync", pair.primary_fsync, *REPLICATION_FLAGS]
    proc = spawn(pair.root / "primary", port, flags)
    try:
        wait_until(lambda: answers_ping(port), timeout, "old primary PING")
        with node_client(port) as node:
            node.execute_command("REPLICAOF", "127.0.0.1", pair.replica_port)
        wait_until(lambda: replica_synced(port), timeout, "old primary resynced")
        wait_until(
            lambda: port in online_replica_ports(pair.replica_port), timeout, "rejoined online"
        )
        settle_replication(pair.replica_port, 1, timeout)
        yield port
    finally:
        halt(proc)


async def standalone_failover(
    root: Path, level: DurabilityLevel, lagging: bool, sessions: int, seconds: float, label: str
) -> Outcome:
    """One round: a fresh pair, the load, the kill after an acknowledgement, the promotion,
    the checks on the promoted replica. ``lagging``: the replica's link runs through a proxy
    that holds its bytes for LAG s, the kill comes LAG_KILL s into that, and the bytes still
    held are dropped with it (what a replica behind by half a second has not received)."""
    where = {f"s{n:03d}": workspace_of(f"s{n:03d}") for n in range(sessions)}
    trigger = Trigger()
    clients = Clients(where, on_ack=trigger)
    with ReplicatedPair(root) as pair:
        old = open_client(pair.primary_url)
        try:
            outbox = Outbox(old, tunables(level))
            assert (await outbox.check_durability()).level == level
            async with FaultyProxy(pair.primary_port) as proxy:
                if lagging:
                    await asyncio.to_thread(replicate_through, pair, proxy.port)

                def crash() -> None:
                    pair.kill_primary()
                    proxy.reset()  # what the link still held dies with the primary

                async def kill_after_an_acknowledgement() -> None:
                    await asyncio.sleep(seconds)
                    if lagging:
                        proxy.stall(LAG)
                        await asyncio.sleep(LAG_KILL)
                    killed = trigger.arm(lambda ses: True, crash)
                    async with asyncio.timeout(DURABILITY_TIMEOUT + NEVER_HANGS):
                        await killed.wait()
                    await asyncio.sleep(OUTAGE)  # the clients keep trying the dead primary

                await run_load(clients, outbox, 0.02, kill_after_an_acknowledgement)
        finally:
            await old.aclose()
        before = clients.acknowledged()
        await asyncio.to_thread(pair.promote_replica)
        with old_primary_rejoins(pair):
            new = open_client(pair.replica_url)
            try:
                outbox = Outbox(new, tunables(level))
                assert (await outbox.check_durability()).level == level
                there = {e.id for es in (await listed(outbox, where)).values() for e in es}
                missing = [i for i in before if i not in there]
                retried = await clients.finish_all(outbox, more=1, within=60)
                await deliver_everything(outbox, where, clients.history)
            finally:
                await new.aclose()
    link = f"replica link held {LAG:.1f} s, kill {LAG_KILL:.1f} s in" if lagging else "direct"
    scenario = f"failover, standalone, {level}, {link} ({label}, {sessions} sessions)"
    result = outcome(scenario, level, clients, missing, retried)
    errors = sum(n for k, n in clients.answers.items() if k.startswith("error"))
    stall = " | replica link stall 1" if lagging else ""
    result.publish(
        f"primary SIGKILL 1{stall} | not durable {clients.answers['not durable']} | errors {errors}"
    )
    return result


STANDALONE_RUNS = [
    pytest.param(1, 30, 2.0, id="short"),
    pytest.param(4, 50, 5.0, id="long", marks=pytest.mark.slow),
]
LINKS = [pytest.param(False, id="direct"), pytest.param(True, id="lagging")]


async def failover_rounds(
    tmp_path: Path,
    level: DurabilityLevel,
    lagging: bool,
    rounds: int,
    sessions: int,
    seconds: float,
) -> list[Outcome]:
    """``rounds`` standalone failovers one after another, each on a fresh pair."""
    return [
        await standalone_failover(
            tmp_path / f"round-{r}", level, lagging, sessions, seconds, f"{r + 1}/{rounds}"
        )
        for r in range(rounds)
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lagging", LINKS)
@pytest.mark.parametrize(("rounds", "sessions", "seconds"), STANDALONE_RUNS)
async def test_a_failover_keeps_every_acknowledged_replica_accept(
    tmp_path: Path, rounds: int, sessions: int, seconds: float, lagging: bool
) -> None:
    for result in await failover_rounds(tmp_path, "replica", lagging, rounds, sessions, seconds):
        assert result.missing == [], result  # an acknowledged accept lost: the level failed
        assert result.verdict.ok, result
        result.assert_delivered_once()
        result.assert_clear_answers()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lagging", LINKS)
@pytest.mark.parametrize(("rounds", "sessions", "seconds"), STANDALONE_RUNS)
async def test_a_failover_without_the_wait_shows_what_it_can_lose(
    tmp_path: Path, rounds: int, sessions: int, seconds: float, lagging: bool
) -> None:
    """``none``: the count of acknowledged accepts lost is reported, not asserted."""
    for result in await failover_rounds(tmp_path, "none", lagging, rounds, sessions, seconds):
        result.assert_delivered_once()
        result.assert_clear_answers()


# -- 3: a frozen replica under load ----------------------------------------------------------

FROZEN_RUNS = [
    pytest.param(40, 1, id="short"),
    pytest.param(200, 3, id="long", marks=pytest.mark.slow),
]
PER_SESSION = 4  # concurrent accepts into each session


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("accepts", "rounds"), FROZEN_RUNS)
async def test_a_frozen_replica_under_load_answers_not_durable_in_time_never_hangs(
    replicated_pair: ReplicatedPair, accepts: int, rounds: int
) -> None:
    client = open_client(replicated_pair.primary_url)
    outbox = Outbox(client, tunables("replica"))
    clients = Clients({})
    waits: list[list[float]] = []  # per round
    twice: Counter[str] = Counter()  # retries after the thaw that needed a second one
    try:
        assert (await outbox.check_durability()).level == "replica"
        for r in range(rounds):
            where = {f"r{r}s{n:03d}": f"frozen-{n % 4}" for n in range(accepts // PER_SESSION)}
            clients.where.update(where)
            sends = [(ses, f"{ses}-{i}", i) for ses in where for i in range(PER_SESSION)]

            replicated_pair.freeze_replica()
            try:
                async with asyncio.timeout(DURABILITY_TIMEOUT + NEVER_HANGS):
                    answers = await asyncio.gather(
                        *(timed_accept(outbox, where[s], s, c, i) for s, c, i in sends)
                    )
                there = await listed(outbox, where)
            finally:
                replicated_pair.thaw_replica()
            waits.append([w for w, _ in answers])
            kinds = Counter(type(err).__name__ for _, err in answers)
            clients.answers["not durable"] += kinds["NotDurable"]
            assert kinds == {"NotDurable": len(sends)}, kinds
            written = {
                cmid: err.entry_id
                for (_, cmid, _), (_, err) in zip(sends, answers, strict=True)
                if isinstance(err, NotDurable)
            }
            # Each is written (NotDurable carries its ID), and listed exactly once.
            for ses, entries in there.items():
                ids = sorted(e.id for e in entries)
                assert ids == sorted(written[f"{ses}-{i}"] for i in range(PER_SESSION)), ses
            # The thaw: the same clientMessageIDs again answer Duplicate with the same IDs.
            async with asyncio.timeout(3 * (DURABILITY_TIMEOUT + NEVER_HANGS)):
                again = await asyncio.gather(
                    *(retry_until_acknowledged(outbox, clients, s, twice) for s in sends)
                )
            for (_, cmid, _), (kind, entry_id) in zip(sends, again, strict=True):
                assert (kind, entry_id) == ("duplicate", written[cmid])
            for ses, entries in (await listed(outbox, where)).items():
                assert [e.id for e in entries] == [e.id for e in there[ses]]
                clients.history.accepted[ses] = [e.id for e in entries]
        await deliver_everything(outbox, clients.where, clients.history)
    finally:
        replicated_pair.thaw_replica()
        await client.aclose()
    slowest = max(max(w) for w in waits)
    clients.slowest = slowest
    result = outcome(
        f"frozen replica ({accepts} concurrent accepts x {rounds})",
        "replica",
        clients,
        [],
        Counter({"duplicate": sum(len(ids) for ids in clients.history.accepted.values())}),
    )
    result.publish(f"replica SIGSTOP {rounds} | not durable {clients.answers['not durable']}")
    spread = ", ".join(f"round {r + 1} {min(w):.2f}-{max(w):.2f} s" for r, w in enumerate(waits))
    report.add_line(
        f"frozen replica ({accepts} concurrent accepts): NotDurable after {spread} "
        f"(durability_timeout {DURABILITY_TIMEOUT} s); retries after the thaw that needed a "
        f"second one: {sum(twice.values())}"
    )
    assert slowest < DURABILITY_TIMEOUT + NEVER_HANGS
    assert result.verdict.ok, result
    assert result.verdict.accepted == accepts * rounds
    result.assert_delivered_once()
    result.assert_clear_answers()


async def timed_accept(
    outbox: Outbox, ws: str, ses: str, cmid: str, i: int
) -> tuple[float, BaseException | None]:
    """One accept: how long it took, and what it raised."""
    started = time.monotonic()
    try:
        await outbox.accept(ws, ses, "u", cmid, f"{i} of {ses}")
    except (NotDurable, Duplicate) as err:
        return time.monotonic() - started, err
    except UNAVAILABLE as err:
        return time.monotonic() - started, err
    return time.monotonic() - started, None


async def retry_until_acknowledged(
    outbox: Outbox, clients: Clients, send: tuple[str, str, int], twice: Counter[str]
) -> tuple[str, str]:
    """The client's retry after NotDurable: the same clientMessageID until acknowledged."""
    ses, cmid, i = send
    while True:
        kind, entry_id = await clients.attempt(outbox, ses, cmid, i)
        if entry_id:
            return kind, entry_id
        twice[kind] += 1
        await asyncio.sleep(RETRY_PAUSE)


# -- 4: a cluster's master fails over --------------------------------------------------------

CLUSTER_RUNS = [
    pytest.param(6, ["force"], id="short"),
    pytest.param(15, ["force", "kill", "force", "kill"], id="long", marks=pytest.mark.slow),
]


ACK_WAIT = 20.0  # seconds a round waits for an acknowledgement from the shard it fails over


def workspace_served_by(port: int) -> str:
    """A workspace whose slot the primary on ``port`` serves (its hash tag is the workspace)."""
    key = key_served_by(port, "ws")
    return key[key.index("{") + 1 : key.rindex("}")]


def slot_table(client: Client, where: dict[str, str]) -> str:
    """The client's slot table for the workspaces (valkey-py's NodesManager: the node that
    serves each slot first), and the primaries it knows."""
    if not isinstance(client, ValkeyCluster):
        return ""
    slots = client.nodes_manager.slots_cache
    table = "; ".join(
        f"{ws} (slot {key_slot(ws.encode())}) -> "
        + str([f"{n.port} {n.server_type}" for n in slots[key_slot(ws.encode())]])
        for ws in sorted(set(where.values()))
    )
    primaries = sorted(n.port for n in client.get_primaries())
    return f"its slot table: {table}; its primaries: {primaries}"


async def still_works(
    cluster: LocalCluster,
    client: Client,
    outbox: Outbox,
    where: dict[str, str],
    *,
    at_once: bool = False,
) -> str:
    """'' if a client that lived through a failover still lists every session (within a few
    seconds: the cluster may still be settling) and knows the cluster's primaries (where it
    loads scripts, and what the durability probe and the repair pass visit); else what is
    wrong, with its slot table. ``at_once``: the sessions listed concurrently, as a service's
    concurrent requests would."""
    deadline = time.monotonic() + 3.0
    while True:
        try:
            if at_once:
                await asyncio.gather(*(outbox.list(ws, ses) for ses, ws in where.items()))
            else:
                await listed(outbox, where)
            break
        except Exception as err:  # valkey-py's own errors, and AttributeErrors from it too
            if time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                continue
            return f"{type(err).__name__}: {err}; {slot_table(client, where)}"
    if isinstance(client, ValkeyCluster):
        known = sorted(n.port for n in client.get_primaries())
        live = await asyncio.to_thread(cluster.primaries)
        if known != live:
            return f"lists, but the cluster's primaries are {live}; {slot_table(client, where)}"
    return ""


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("per_master", "rounds"), CLUSTER_RUNS)
async def test_a_cluster_failover_keeps_every_acknowledged_replica_accept(
    replicated_cluster: LocalCluster, per_master: int, rounds: list[str]
) -> None:
    """Each round: a client and Outbox (a service), the load, one failover right after an
    acknowledgement from the shard it fails over, a little more load. Then whether that
    client still lists every session, and whether a second one (another service replica,
    idle through the failover) lists them all at once. A round's clients are its own, so a
    client broken by one failover does not keep the next round from failing over under load."""
    cluster = replicated_cluster
    spaces = [workspace_served_by(port) for port in cluster.primaries()]
    where = {f"m{k}s{n:02d}": ws for k, ws in enumerate(spaces) for n in range(per_master)}
    trigger = Trigger()
    clients = Clients(where, on_ack=trigger)
    done: Counter[str] = Counter()
    broken: list[str] = []  # per round, what the client that lived through it could not do
    loop = asyncio.get_running_loop()
    forced: list[asyncio.Future[int]] = []  # failover() calls, begun in a client task

    def master_of(ws: str) -> int:
        return owner_of(cluster.live_ports(), key_slot(ws.encode()))

    def on_shard(ws: str) -> Callable[[str], bool]:
        return lambda ses: where[ses] == ws

    def force(master: int) -> Callable[[], None]:
        """failover(): CLUSTER FAILOVER FORCE on its replica, then the wait."""
        return lambda: forced.append(loop.run_in_executor(None, cluster.failover, master))

    def kill(master: int) -> Callable[[], None]:
        return lambda: cluster.kill_node(master)

    async def fail_over_after_an_acknowledgement(ws: str, how: str) -> None:
        await asyncio.sleep(2.0)
        master = await asyncio.to_thread(master_of, ws)
        replica = await asyncio.to_thread(cluster.replica_of, master)
        fired = trigger.arm(on_shard(ws), force(master) if how == "force" else kill(master))
        try:
            async with asyncio.timeout(ACK_WAIT):
                await fired.wait()
        except TimeoutError:  # no accept into that shard succeeds any more
            trigger.disarm()
            done[f"{how} skipped (its shard acknowledged nothing in {ACK_WAIT:.0f} s)"] += 1
            return
        if how == "force":
            await forced[-1]
        else:  # a crash: the replica takes over after cluster-node-timeout
            await asyncio.to_thread(cluster.wait_promoted, replica, 30.0)
            await asyncio.to_thread(cluster.heal)  # the old master rejoins
        done[f"master {how}"] += 1
        await asyncio.sleep(1.5)

    for n, how in enumerate(rounds):
        client, idle = open_client(cluster.url), open_client(cluster.url)
        try:
            outbox = Outbox(client, tunables("replica"))
            idle_outbox = Outbox(idle, tunables("replica"))
            for o in (outbox, idle_outbox):  # also reads each client's slot table
                assert (await o.check_durability()).level == "replica"
            ws = spaces[n % len(spaces)]
            faults = functools.partial(fail_over_after_an_acknowledgement, ws, how)
            await run_load(clients, outbox, 0.02, faults)
            if failure := await still_works(cluster, client, outbox, where):
                broken.append(f"round {n + 1} ({how}), the loaded client: {failure}")
            if failure := await still_works(cluster, idle, idle_outbox, where, at_once=True):
                broken.append(f"round {n + 1} ({how}), an idle client, all at once: {failure}")
        finally:
            await client.aclose()
            await idle.aclose()
    # The checks and the delivery on a fresh client, as a restarted service would have: what
    # was acknowledged is counted even if the running client cannot read it any more.
    fresh = open_client(cluster.url)
    try:
        outbox = Outbox(fresh, tunables("replica"))
        there = {e.id for es in (await listed(outbox, where)).values() for e in es}
        missing = [i for i in clients.acknowledged() if i not in there]
        retried = await clients.finish_all(outbox, more=0, within=60)
        await deliver_everything(outbox, where, clients.history)
    finally:
        await fresh.aclose()
    result = outcome(
        f"failover, cluster 3x2, replica ({per_master * 3} sessions, {len(rounds)} failovers)",
        "replica",
        clients,
        missing,
        retried,
    )
    errors = sum(n for k, n in clients.answers.items() if k.startswith("error"))
    injected = " | ".join(f"{k} {n}" for k, n in sorted(done.items()))
    result.publish(f"{injected} | not durable {clients.answers['not durable']} | errors {errors}")
    for line in broken:
        report.add_line(f"{result.scenario}: {line}")
    assert sum(n for k, n in done.items() if k.startswith("master")) == len(rounds), done
    assert result.missing == [], result
    assert result.verdict.ok, result
    result.assert_delivered_once()
    # The service that lived through a failover must still work, not only a restarted one.
    result.assert_clear_answers()
    assert not broken, broken
