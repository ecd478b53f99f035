"""Fair send slots and a worker's capacity: the ``concurrency`` slots go round-robin across
workspaces, so one tenant's backlog cannot hold up another's prompt; one worker holds 1,000
deliverers that block for their whole turn; a loop with no free slot reads nothing.

Every assertion is on the order or the count of sends, never on wall time."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox import Entry, Outbox, Tunables
from prompt_outbox.core.keys import bucket_of
from prompt_outbox.delivery.runloop import START_BURST
from prompt_outbox.storage.client import Client
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

# Today's loop started due sessions in the order it read them: bucket by bucket, and within a
# bucket by mark. These names put the backlog's bucket first, so that order starves QUIET.
BUSY, QUIET = "busy", "quiet"
assert bucket_of(BUSY) < bucket_of(QUIET)


class Sends:
    """A deliverer that records the workspace of every send as it starts, and holds each for
    ``hold`` seconds (or until ``release`` is set, when ``hold`` is None)."""

    def __init__(self, hold: float | None) -> None:
        self.hold = hold
        self.release = asyncio.Event()
        self.order: list[str] = []
        self.inside = 0
        self.most_inside = 0

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.order.append(ws)
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.hold is None:
                await self.release.wait()
            else:
                await asyncio.sleep(self.hold)
        finally:
            self.inside -= 1


async def accept_many(outbox: Outbox, ws: str, sessions: int, prefix: str = "s") -> None:
    """One prompt for each of ``sessions`` sessions of ``ws`` (200 accepts in flight at once)."""
    for first in range(0, sessions, 200):
        last = min(sessions, first + 200)
        await asyncio.gather(
            *(outbox.accept(ws, f"{prefix}{i}", "u", "c", "x") for i in range(first, last))
        )


async def test_a_fresh_prompt_is_not_held_up_by_another_workspaces_backlog(client: Client) -> None:
    """2,000 due sessions in one workspace, 16 slots, each send held 0.5 s; a prompt to
    another workspace once every slot is taken. Round-robin: it takes one of the next slots
    that free, after at most one round of the backlog's sends (today: after all 2,000)."""
    concurrency = 16
    outbox = Outbox(client, replace(FAST, concurrency=concurrency))
    await accept_many(outbox, BUSY, 2000)
    sends = Sends(hold=0.5)
    async with outbox.running(sends, tick=0.2):
        await eventually(lambda: holds(sends.inside == concurrency))
        before = len(sends.order)
        await outbox.accept(QUIET, "q", "u", "c", "x")
        # Today's loop would go on through the backlog: stop waiting well past one round.
        await eventually(
            lambda: holds(QUIET in sends.order or len(sends.order) > before + 4 * concurrency),
            within=60,
        )
    assert QUIET in sends.order
    backlog_sends_first = sends.order.index(QUIET) - before
    assert backlog_sends_first <= concurrency, backlog_sends_first


async def test_two_backlogs_share_the_slots_round_robin(client: Client) -> None:
    """Two workspaces with 100 due sessions each and 4 slots: the sends alternate, so at
    every point of the run neither workspace is more than a round (4 sends) ahead."""
    concurrency = 4
    outbox = Outbox(client, replace(FAST, concurrency=concurrency))
    await accept_many(outbox, BUSY, 100)
    await accept_many(outbox, QUIET, 100)
    sends = Sends(hold=0.02)
    async with outbox.running(sends, tick=0.2):
        await eventually(lambda: holds(len(sends.order) >= 120), within=60)
    ahead = [sends.order[:n].count(BUSY) - sends.order[:n].count(QUIET) for n in range(1, 121)]
    assert max(abs(a) for a in ahead) <= concurrency, ahead


async def test_starts_are_paced_so_a_fresh_prompt_is_not_queued_behind_a_thousand(
    client: Client,
) -> None:
    """Default Tunables (1,000 slots), 3,000 due sessions of one workspace and sends that
    take no time; a prompt to another workspace accepted as the backlog's first send begins.
    Each pass starts at most START_BURST drains, so the prompt's own round trips wait behind
    a few dozen others: a burst or two of the backlog goes first, not the thousand that one
    pass started at once before (whose every call shared a batch with the prompt's)."""
    outbox = Outbox(client, Tunables())
    await accept_many(outbox, BUSY, 3000)
    sends = Sends(hold=0.0)
    fresh: list[asyncio.Task[Entry]] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        if not fresh:
            fresh.append(asyncio.create_task(outbox.accept(QUIET, "q", "u", "c", "x")))
        await sends(ws, ses, entry)

    async with outbox.running(deliver, tick=0.2):
        await eventually(lambda: holds(QUIET in sends.order), within=60)
    await fresh[0]
    backlog_sends_first = sends.order.index(QUIET) - 1  # the send that accepted it
    assert backlog_sends_first <= 4 * START_BURST, backlog_sends_first


async def _zrange_calls(client: Client) -> int:
    """ZRANGE calls the server has run (every read of the due index and of a visit is one)."""
    if isinstance(client, ValkeyCluster):
        stats = await client.info("commandstats", target_nodes=ValkeyCluster.PRIMARIES)
        rows = [node.get("cmdstat_zrange", {}) for node in stats.values()]
    else:
        rows = [(await client.info("commandstats")).get("cmdstat_zrange", {})]
    return sum(int(row.get("calls", 0)) for row in rows)


async def test_one_worker_holds_a_thousand_blocking_deliveries(client: Client) -> None:
    """Default Tunables and a deliverer that blocks for the whole turn: 1,000 sessions are in
    it at once (today's default held 64). While every slot is taken, accepts wake the loop
    and it reads nothing; once the turns end, the prompts that waited are sent."""
    outbox = Outbox(client, Tunables())
    held = 1000
    assert outbox.tunables.concurrency == held
    sends = Sends(hold=None)
    # What 20 accepts read of the indexes themselves (the series' oldest pending), alone.
    reads = await _zrange_calls(client)
    await accept_many(outbox, "baseline", 20)
    accepts_read = await _zrange_calls(client) - reads
    await outbox.cleanup_workspace("baseline")
    await accept_many(outbox, BUSY, held)
    async with outbox.running(sends, tick=0.2):
        await eventually(lambda: holds(sends.inside == held), within=120)
        reads_before = await _zrange_calls(client)
        await accept_many(outbox, QUIET, 20)  # each wakes the loop: it has no slot to give
        await asyncio.sleep(0.3)
        reads_while_full = await _zrange_calls(client) - reads_before
        assert len(sends.order) == held
        sends.release.set()
        await eventually(lambda: holds(len(sends.order) == held + 20), within=60)
    assert sends.most_inside == held
    assert reads_while_full == accepts_read  # the loop's own: none
