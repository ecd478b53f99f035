"""Round trips per delivered prompt: with OnDelivered wired, a session's backlog costs the
accept's one, then a stage and a complete per prompt: the complete also answers the next step (no
acquire per entry), and the next stage forgets the OnDelivered call that ran (no call of its own).
Counted at the client, where one write to the socket is one round trip; no timing is measured."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import valkey.asyncio as valkey_async
from bench.roundtrips import Counting, raw_rate, run_backlog

from prompt_outbox import Entry, Outbox
from prompt_outbox.embedded import EmbeddedValkey
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

PROMPTS = 50
# Not per prompt: the run loop's start (recovery pass, subscriptions, the first due-index
# reads), the drain's first acquire and its last OnDelivered record forgotten alone, and the
# pass after the drain (measured: 16 in all).
FIXED = 20


async def test_a_backlog_costs_three_round_trips_per_prompt_with_hooks_wired(
    valkey_server: EmbeddedValkey,
) -> None:
    client = valkey_async.Valkey.from_url(valkey_server.url, connection_class=Counting)
    await client.flushall()
    # The memory ceiling's reading (one INFO per node a second, storage/memory.py) is taken
    # by check_durability; a long interval keeps a slow run from taking it again meanwhile.
    t = replace(FAST, cap=PROMPTS + 1, accept_durability="none", memory_check_interval=3600.0)
    outbox = Outbox(client, t)
    hooked: list[str] = []

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        hooked.append(entry.id)

    async def agent(ws: str, ses: str, entry: Entry) -> None:
        return None

    outbox.set_on_delivered(on_delivered)
    try:
        await outbox.check_durability()  # its probe, script loads, INFO are not per prompt
        Counting.sent = 0
        ids = [(await outbox.accept("ws", "s", "u", f"c{i}", f"p{i}")).id for i in range(PROMPTS)]
        accepts = Counting.sent
        async with outbox.running(agent, tick=60.0):  # no tick pass inside the window
            await eventually(lambda: holds(len(hooked) == PROMPTS), within=30)
            await asyncio.sleep(0.2)  # the drain's last calls
            total = Counting.sent
    finally:
        await client.aclose()
    assert hooked == ids  # each once, in order
    assert accepts == PROMPTS  # one round trip per accept
    # 2 per prompt: a regression to an acquire or a notified per prompt (3 or 4) breaks it.
    assert total - accepts <= 2 * PROMPTS + FIXED, (total - accepts, PROMPTS)


async def test_the_round_trip_benchmark_runs(valkey_server: EmbeddedValkey) -> None:
    """bench/roundtrips.py's parts, tiny (the benchmark proper is ``make bench``)."""
    assert await raw_rate(valkey_server.url, 2, 0.2) > 0
    run = await run_backlog(valkey_server.url, sessions=2, per_session=3, concurrency=2)
    # At most one round trip per accept (the two sessions' accepts may share one: level none
    # auto-pipelines them) and at least two per delivery; a new connection's handshake and
    # the run loop's start come on top (the benchmark subtracts them between two sizes).
    assert run.prompts == 6 and 6 // 2 <= run.accept_trips <= 6 + 4
    assert 2 * 6 <= run.deliver_trips <= 2 * 6 + 2 * FIXED
