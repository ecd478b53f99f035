"""Edit before dispatch: a pending or error entry's text or model replaced in place, refused while
a delivery holds the session and once the entry is on its way."""

from __future__ import annotations

import pytest
import valkey.asyncio as valkey_async

from prompt_outbox import Duplicate, EditResult, Entry, InvalidInput, Outbox, Status
from prompt_outbox.core.keys import SessionKeys, session_keys
from prompt_outbox.storage.store import Store
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

ENTRY = (
    '{{"id":"{id}","clientMessageID":"{id}","userID":"u","text":"as sent",'
    '"acceptedAt":"2026-12-01T00:00:00.000000Z","attempts":{attempts},{extra}"status":"{status}"}}'
)


async def _kinds(client: valkey_async.Valkey, ses: str) -> list[str]:
    rows = await client.xrange(SessionKeys("ws", ses).events)
    return [fields[b"kind"].decode() for _, fields in rows]


async def test_an_edit_replaces_text_and_model_in_place(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    a = await outbox.accept("ws", "s1", "u", "c1", "first", '{"id":"m1"}')
    b = await outbox.accept("ws", "s1", "u", "c2", "second")
    assert await outbox.edit("ws", "s1", a.id, text="first, fixed") is EditResult.UPDATED
    assert await outbox.edit("ws", "s1", b.id, model=' {"id": "m2"} ') is EditResult.UPDATED
    listed = await outbox.list("ws", "s1")
    assert [(e.id, e.text, e.model, e.status) for e in listed] == [
        (a.id, "first, fixed", '{"id":"m1"}', Status.PENDING),
        (b.id, "second", '{"id": "m2"}', Status.PENDING),  # the model's bytes, as given
    ]
    assert await outbox.edit("ws", "s1", a.id, model="null") is EditResult.UPDATED  # removed
    assert (await outbox.list("ws", "s1"))[0].model is None
    assert (await _kinds(client, "s1"))[-3:] == ["edited", "edited", "edited"]
    # The original POST, retried, is still its duplicate: the key names what was accepted.
    with pytest.raises(Duplicate):
        await outbox.accept("ws", "s1", "u", "c1", "first", '{"id":"m1"}')


async def test_an_edited_prompt_is_delivered_as_edited(outbox: Outbox) -> None:
    a = await outbox.accept("ws", "s1", "u", "c1", "typo")
    assert await outbox.edit("ws", "s1", a.id, text="no typo") is EditResult.UPDATED
    got: list[str] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        got.append(entry.text)

    async with outbox.running(deliver, tick=0.05):
        await eventually(lambda: holds(got == ["no typo"]), within=5)


async def test_an_error_entry_stays_in_error_after_an_edit(outbox: Outbox) -> None:
    raw = ENTRY.format(id="e1", attempts=5, extra='"lastError":"x",', status="error")
    await outbox.seed_entry_for_test("ws", "s1", raw)
    assert await outbox.edit("ws", "s1", "e1", text="try this") is EditResult.UPDATED
    [e] = await outbox.list("ws", "s1")
    assert (e.text, e.status, e.attempts, e.last_error) == ("try this", Status.ERROR, 5, "x")


@pytest.mark.parametrize("status", ["verifying", "parked"])
async def test_an_entry_on_its_way_is_not_editable(outbox: Outbox, status: str) -> None:
    await outbox.seed_entry_for_test(
        "ws", "s1", ENTRY.format(id="e1", attempts=1, extra="", status=status)
    )
    assert await outbox.edit("ws", "s1", "e1", text="late") is EditResult.NOT_EDITABLE
    assert (await outbox.list("ws", "s1"))[0].text == "as sent"


async def test_an_edit_is_refused_while_a_delivery_holds_the_session(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    a = await outbox.accept("ws", "s1", "u", "c1", "hi")
    assert await Store(client).lock(session_keys("ws", "s1"), "holder", 30_000, 0)
    assert await outbox.edit("ws", "s1", a.id, text="changed") is EditResult.BUSY
    assert (await outbox.list("ws", "s1"))[0].text == "hi"


async def test_an_edit_of_nothing_or_with_bad_input_is_refused(outbox: Outbox) -> None:
    a = await outbox.accept("ws", "s1", "u", "c1", "hi")
    assert await outbox.edit("ws", "s1", "nosuch", text="x") is EditResult.NOT_FOUND
    for bad in ({}, {"text": ""}, {"model": "{not json"}, {"text": "x" * 200_000}):
        with pytest.raises(InvalidInput):
            await outbox.edit("ws", "s1", a.id, **bad)
    assert (await outbox.list("ws", "s1"))[0].text == "hi"
