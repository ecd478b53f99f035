"""Round trips per delivered prompt (issue 12): with OnDelivered wired, a session's backlog
costs the accept's one, then a stage and a complete per prompt: the complete also answers the
next step (no acquire per entry), and the next stage forgets the OnDelivered call that ran (no
call of its own). Counted at the client, where one write to the socket is one round trip; no
timing is measured."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import valkey.asyncio as valkey_async
from valkey.asyncio import Connection

from prompt_outbox import Entry, Outbox
from prompt_outbox.embedded import EmbeddedValkey
from tests.conftest import FAST, eventually, holds

PROMPTS = 50
# Not per prompt: the run loop's start (recovery pass, subscriptions, the first due-index
# reads), the drain's first acquire and its last OnDelivered record forgotten alone, and the
# pass after the drain (measured: 16 in all).
FIXED = 20


class Counting(Connection):
    """A connection that counts what it sends: one packed send is one round trip (a pipeline
    is one send)."""

    sent = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counting.sent += 1
        await super().send_packed_command(command, check_health)


async def test_a_backlog_costs_three_round_trips_per_prompt_with_hooks_wired(
    valkey_server: EmbeddedValkey,
) -> None:
    client = valkey_async.Valkey.from_url(valkey_server.url, connection_class=Counting)
    await client.flushall()
    outbox = Outbox(client, replace(FAST, cap=PROMPTS + 1, accept_durability="none"))
    hooked: list[str] = []

    async def on_delivered(ws: str, ses: str, entry: Entry) -> None:
        hooked.append(entry.id)

    async def agent(ws: str, ses: str, entry: Entry) -> None:
        return None

    outbox.set_on_delivered(on_delivered)
    try:
        await outbox.check_durability()  # its probe and script loads are not per prompt
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
