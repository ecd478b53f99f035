"""whileBusy ``interrupt``: the accept lands as usual, and the run loop delivering the
session's entry in flight (in whichever process) has the deliverer abort that turn. The
aborted entry's send ends as the agent answers it; FIFO goes on; nothing is sent twice.
Against a real Valkey (and the cluster), across two Outbox instances, so the ask travels by
pub/sub as it does between processes. tests/test_opencode.py has it against a real opencode."""

from __future__ import annotations

import asyncio

import pytest

from prompt_outbox import Duplicate, Entry, Outbox
from prompt_outbox.core.keys import SessionKeys
from prompt_outbox.storage.client import Client
from prompt_outbox.storage.dueindex import abort_message, parse_abort
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

WS, SES = "acme", "chat-1"


class AbortableAgent:
    """An agent whose turn runs until it ends by itself or is aborted, as opencode's does: an
    aborted turn still answers (the prompt is in its transcript), so the send succeeds."""

    def __init__(self) -> None:
        self.delivered: list[str] = []
        self.aborts: list[tuple[str, str]] = []
        self.turn_started = asyncio.Event()
        self._aborted = asyncio.Event()

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.delivered.append(entry.text)
        self._aborted.clear()
        self.turn_started.set()
        if entry.text.startswith("long"):
            await asyncio.wait_for(self._aborted.wait(), 30)

    async def abort(self, ws: str, ses: str) -> None:
        self.aborts.append((ws, ses))
        self._aborted.set()


class PlainAgent:
    """A deliverer without ``abort``: an interrupt cannot cut its turn."""

    def __init__(self) -> None:
        self.delivered: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, ws: str, ses: str, entry: Entry) -> None:
        self.delivered.append(entry.text)
        if entry.text.startswith("long"):
            await self.release.wait()


async def _empty(outbox: Outbox) -> bool:
    return await outbox.list(WS, SES) == []


def _aborts(outbox: Outbox, outcome: str) -> float:
    return outbox.metrics.aborts.labels(outcome=outcome)._value.get()


async def test_an_interrupt_aborts_the_turn_in_flight_and_fifo_goes_on(client: Client) -> None:
    worker, api = Outbox(client, FAST), Outbox(client, FAST)  # two "processes"
    agent = AbortableAgent()
    async with worker.running(agent):
        await api.accept(WS, SES, "u", "c1", "long turn")
        await asyncio.wait_for(agent.turn_started.wait(), 10)
        await api.accept(WS, SES, "u", "c2", "stop, do this instead", while_busy="interrupt")
        await eventually(lambda: holds(len(agent.delivered) == 2))
        await eventually(lambda: _empty(api))
    assert agent.aborts == [(WS, SES)]
    # The aborted turn's prompt counts as delivered: sent once, and the new one after it.
    assert agent.delivered == ["long turn", "stop, do this instead"]
    assert _aborts(worker, "asked") == 1


async def test_no_abort_without_a_turn_in_flight_nor_for_a_duplicate(client: Client) -> None:
    worker, api = Outbox(client, FAST), Outbox(client, FAST)
    agent = AbortableAgent()
    # Idle session: nothing in flight, nothing to abort; the prompt is delivered as usual.
    first = await api.accept(WS, SES, "u", "c1", "quick one", while_busy="interrupt")
    async with worker.running(agent):
        await eventually(lambda: holds(agent.delivered == ["quick one"]))
        await api.accept(WS, SES, "u", "c2", "long turn")
        await asyncio.wait_for(agent.turn_started.wait(), 10)
        # The retry of an interrupt that was taken long ago is its duplicate: no second ask,
        # which could only hit the turn in flight NOW, another prompt's.
        with pytest.raises(Duplicate):
            await api.accept(WS, SES, "u", "c1", "quick one", while_busy="interrupt")
        await asyncio.sleep(0.3)
        assert agent.aborts == []
        await agent.abort(WS, SES)  # end the long turn ourselves
        await eventually(lambda: _empty(api))
    assert first.id and agent.delivered == ["quick one", "long turn"]
    assert _aborts(worker, "asked") == 0


async def test_an_ask_for_another_entry_than_the_one_in_flight_aborts_nothing(
    client: Client,
) -> None:
    worker = Outbox(client, FAST)
    agent = AbortableAgent()
    async with worker.running(agent):
        await worker.accept(WS, SES, "u", "c1", "long turn")
        await asyncio.wait_for(agent.turn_started.wait(), 10)
        # A late ask names the entry that WAS in flight: the one now is another, left alone.
        k = SessionKeys(WS, SES)
        await client.execute_command(
            "SPUBLISH", k.workspace.bucket.wake, abort_message(WS, SES, "not-this-one")
        )
        await asyncio.sleep(0.3)
        assert agent.aborts == []
        [entry] = await worker.list(WS, SES)
        await client.execute_command(
            "SPUBLISH", k.workspace.bucket.wake, abort_message(WS, SES, entry.id)
        )
        await eventually(lambda: holds(agent.aborts == [(WS, SES)]))
        await eventually(lambda: _empty(worker))


async def test_a_deliverer_without_abort_finishes_its_turn(client: Client) -> None:
    worker, api = Outbox(client, FAST), Outbox(client, FAST)
    agent = PlainAgent()
    async with worker.running(agent):
        await api.accept(WS, SES, "u", "c1", "long turn")
        await eventually(lambda: holds(agent.delivered == ["long turn"]))
        await api.accept(WS, SES, "u", "c2", "next", while_busy="interrupt")
        await eventually(lambda: holds(_aborts(worker, "unsupported") == 1))
        agent.release.set()
        await eventually(lambda: _empty(api))
    assert agent.delivered == ["long turn", "next"]


def test_the_abort_message_is_never_a_workspace() -> None:
    assert parse_abort(abort_message("w.1", "s-2", "e_3")) == ("w.1", "s-2", "e_3")
    for workspace in ["acme", "abort", "abort-x", ""]:
        assert parse_abort(workspace) is None
