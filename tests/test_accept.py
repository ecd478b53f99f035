"""Accept: dedupe, cap, FIFO, validation, model bytes; nothing half-written on any error."""

from __future__ import annotations

import asyncio

import pytest
import valkey.asyncio as valkey_async
from valkey.asyncio.cluster import ValkeyCluster
from valkey.exceptions import ResponseError

from prompt_outbox import (
    Duplicate,
    Entry,
    IdempotencyKeyReused,
    InvalidEventId,
    InvalidId,
    InvalidInput,
    Outbox,
    OutboxFull,
    SessionBusy,
    Status,
    TextTooLarge,
)
from prompt_outbox.core.keys import SessionKeys
from tests.support.entries import MODELS
from tests.support.tunables import FAST

pytestmark = pytest.mark.cluster_too


async def test_accept_then_list_in_fifo_order(outbox: Outbox) -> None:
    ids = [(await outbox.accept("ws", "s1", "u", f"c{i}", f"prompt {i}")).id for i in range(5)]
    listed = await outbox.list("ws", "s1")
    assert [e.id for e in listed] == ids
    assert all(e.status is Status.PENDING for e in listed)
    assert [e.text for e in listed] == [f"prompt {i}" for i in range(5)]
    assert await outbox.list("ws", "other") == []


async def test_duplicate_carries_first_id_and_adds_nothing(outbox: Outbox) -> None:
    first = await outbox.accept("ws", "s1", "u", "same", "hello")
    with pytest.raises(Duplicate) as dup:
        await outbox.accept("ws", "s1", "u", "same", "hello")
    assert dup.value.accepted_id == first.id
    assert [e.id for e in await outbox.list("ws", "s1")] == [first.id]
    # The same clientMessageID in another session is another message.
    other = await outbox.accept("ws", "s2", "u", "same", "hello")
    assert other.id != first.id


async def test_dedupe_marker_lives_dedupe_ttl(outbox: Outbox, client: valkey_async.Valkey) -> None:
    await outbox.accept("ws", "s1", "u", "c1", "hello")
    k = SessionKeys("ws", "s1")
    for key in (k.dedupe("c1"), k.fingerprint("c1")):  # the fingerprint beside it, as long
        pttl = await client.pttl(key)
        assert FAST.dedupe_ttl * 1000 - 2000 < pttl <= FAST.dedupe_ttl * 1000


@pytest.mark.parametrize(
    ("text", "model"),
    [("another text", None), ("hello", '{"id":"m2"}'), ("hello", '{"id": "m1"}')],
    ids=["text", "model", "model bytes"],
)
async def test_a_key_reused_for_another_payload_is_refused_and_writes_nothing(
    outbox: Outbox, client: valkey_async.Valkey, text: str, model: str | None
) -> None:
    # A client bug (one clientMessageID, two prompts) must not lose the second prompt behind
    # a duplicate's answer: it is refused, naming the first entry, and nothing changes.
    first = await outbox.accept("ws", "s1", "u", "key", "hello", '{"id":"m1"}')
    k = SessionKeys("ws", "s1")
    before = [await client.get(k.dedupe("key")), await client.get(k.fingerprint("key"))]
    log_before = await client.xlen(k.events)
    with pytest.raises(IdempotencyKeyReused) as reused:
        await outbox.accept("ws", "s1", "u", "key", text, model)
    assert reused.value.accepted_id == first.id
    assert [e.id for e in await outbox.list("ws", "s1")] == [first.id]
    assert [await client.get(k.dedupe("key")), await client.get(k.fingerprint("key"))] == before
    assert await client.xlen(k.events) == log_before
    # The same payload is still a duplicate; JSON null is no model, as it was accepted.
    with pytest.raises(Duplicate):
        await outbox.accept("ws", "s1", "u", "key", "hello", ' {"id":"m1"} ')
    await outbox.accept("ws", "s1", "u", "plain", "hi")
    with pytest.raises(Duplicate):
        await outbox.accept("ws", "s1", "u", "plain", "hi", "null")


async def test_a_marker_written_before_fingerprints_still_dedupes_any_payload(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    # Markers that a version without fingerprints wrote (up to dedupe_ttl old) carry none:
    # a retry is then a duplicate whatever its payload, as it was.
    first = await outbox.accept("ws", "s1", "u", "old", "hello")
    await client.delete(SessionKeys("ws", "s1").fingerprint("old"))
    with pytest.raises(Duplicate) as dup:
        await outbox.accept("ws", "s1", "u", "old", "another text")
    assert dup.value.accepted_id == first.id


async def test_cap_raises_outbox_full_and_writes_no_marker(
    client: valkey_async.Valkey,
) -> None:
    from dataclasses import replace

    outbox = Outbox(client, replace(FAST, cap=3))
    for i in range(3):
        await outbox.accept("ws", "s1", "u", f"c{i}", "x")
    with pytest.raises(OutboxFull):
        await outbox.accept("ws", "s1", "u", "over", "x")
    assert len(await outbox.list("ws", "s1")) == 3
    assert not await client.exists(SessionKeys("ws", "s1").dedupe("over"))
    # Once there is room, the client's retry of the refused message is accepted (no false dup).
    first = (await outbox.list("ws", "s1"))[0]
    assert (await outbox.dismiss("ws", "s1", first.id)).name == "REMOVED"
    await outbox.accept("ws", "s1", "u", "over", "x")


async def test_failed_push_sets_no_marker(outbox: Outbox, client: valkey_async.Valkey) -> None:
    # Valkey out of memory (noeviction) refuses the push inside the script: the marker, written
    # only after the push, must not exist, or every retry would be a false "duplicate".
    await outbox.accept("ws", "s1", "u", "warm", "x")  # scripts loaded before memory is short
    # One byte: below every node's usage. On a cluster, set on every primary (the async
    # cluster client sends CONFIG SET to one node): the marks and the workspace live apart.
    await _set_maxmemory(client, "1")
    try:
        with pytest.raises(ResponseError, match="maxmemory"):
            await outbox.accept("ws", "s1", "u", "c1", "lost?")
    finally:
        await _set_maxmemory(client, "0")
    assert not await client.exists(SessionKeys("ws", "s1").dedupe("c1"))
    assert [e.client_message_id for e in await outbox.list("ws", "s1")] == ["warm"]
    retried = await outbox.accept("ws", "s1", "u", "c1", "lost?")
    assert (await outbox.list("ws", "s1"))[-1].id == retried.id


async def _set_maxmemory(client: valkey_async.Valkey, value: str) -> None:
    if isinstance(client, ValkeyCluster):
        await client.config_set("maxmemory", value, target_nodes=ValkeyCluster.PRIMARIES)
    else:
        await client.config_set("maxmemory", value)


@pytest.mark.parametrize("model", MODELS)
async def test_model_json_survives_valkey_byte_for_byte(outbox: Outbox, model: str) -> None:
    await outbox.accept("ws", "s1", "u", "c1", "hi", model=model)
    seen: list[Entry] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        seen.append(entry)

    [listed] = await outbox.list("ws", "s1")
    assert listed.model == model.strip()
    assert await outbox.deliver_once("ws", "s1", deliver)
    assert seen[0].model == model.strip()


async def test_unicode_text_survives(outbox: Outbox) -> None:
    text = 'héllo ✓ 模型 🚀 "quoted" \\ back\nslash \u2028 {"status":"error"}'
    await outbox.accept("ws", "s1", "u", "c1", text, model='{"status":"error","id":"evil"}')
    [e] = await outbox.list("ws", "s1")
    assert e.text == text
    assert e.status is Status.PENDING  # the model's own "status" key is not the entry's


BAD_IDS = ["", "a{b", "a}b", "a:b", "a b", "tab\t", "x" * 129, "ünï", "a*b", None, 7]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_bad_ids_are_rejected_before_any_write(
    outbox: Outbox, client: valkey_async.Valkey, bad: object
) -> None:
    with pytest.raises(ValueError):
        await outbox.accept(bad, "s1", "u", "c1", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await outbox.accept("ws", bad, "u", "c1", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await outbox.list("ws", bad)  # type: ignore[arg-type]
    assert await client.dbsize() == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cmid", ""),
        ("cmid", "has space"),
        ("cmid", "x" * 257),
        ("text", ""),
        ("text", "x" * (100 * 1024 + 1)),
        ("text", "lone \ud800 surrogate"),
        ("text", b"bytes"),
        ("model", "{not json"),
        ("model", "[" * 40 + "]" * 40),
        ("model", {"a": 1}),
        ("user", "x" * 257),
    ],
)
async def test_bad_input_is_a_value_error_and_writes_nothing(
    outbox: Outbox, client: valkey_async.Valkey, field: str, value: object
) -> None:
    args: dict[str, object] = {"cmid": "c1", "text": "hello", "model": None, "user": "u"}
    args[field] = value
    with pytest.raises(ValueError):
        await outbox.accept("ws", "s1", args["user"], args["cmid"], args["text"], args["model"])  # type: ignore[arg-type]
    assert await client.dbsize() == 0


async def test_text_at_the_limit_is_accepted(outbox: Outbox) -> None:
    text = "é" * (50 * 1024)  # 100 KiB in UTF-8 exactly
    await outbox.accept("ws", "s1", "u", "c1", text)
    assert (await outbox.list("ws", "s1"))[0].text == text


async def test_bad_input_errors_are_typed_with_stable_codes(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    """The one boundary: the library's checks raise typed InvalidInput kinds (still
    ValueErrors), whose codes the HTTP API answers with."""
    with pytest.raises(InvalidId) as bad_id:
        await outbox.accept("a:b", "s1", "u", "c1", "x")
    with pytest.raises(TextTooLarge) as big:
        await outbox.accept("ws", "s1", "u", "has space", "x" * (100 * 1024 + 1))
    with pytest.raises(InvalidInput) as bad_cmid:
        await outbox.accept("ws", "s1", "u", "has space", "x")
    with pytest.raises(InvalidEventId) as bad_event:
        await anext(outbox.watch("ws", "s1", "yesterday"))
    codes = [e.value.code for e in (bad_id, big, bad_cmid, bad_event)]
    assert codes == ["invalid_id", "text_too_large", "invalid_input", "invalid_event_id"]
    assert all(isinstance(e.value, ValueError) for e in (bad_id, big, bad_cmid, bad_event))
    assert await client.dbsize() == 0


async def test_while_busy_reject_refuses_a_busy_session_and_writes_nothing(
    outbox: Outbox, client: valkey_async.Valkey
) -> None:
    k = SessionKeys("ws", "s1")
    await outbox.accept("ws", "s1", "u", "c1", "one", while_busy="reject")  # idle
    events = await client.xlen(k.events)
    with pytest.raises(SessionBusy):  # a pending prompt is waiting
        await outbox.accept("ws", "s1", "u", "c2", "two", while_busy="reject")
    assert not await client.exists(k.dedupe("c2")) and await client.xlen(k.events) == events
    with pytest.raises(Duplicate):  # the retry of the one accepted is its duplicate, busy or not
        await outbox.accept("ws", "s1", "u", "c1", "one", while_busy="reject")
    release, sending = asyncio.Event(), asyncio.Event()

    async def held(ws: str, ses: str, entry: Entry) -> None:
        sending.set()
        await release.wait()

    delivery = asyncio.create_task(outbox.deliver_once("ws", "s1", held))
    await asyncio.wait_for(sending.wait(), 5)
    with pytest.raises(SessionBusy):  # being delivered: staged, the queue empty
        await outbox.accept("ws", "s1", "u", "c3", "three", while_busy="reject")
    release.set()
    await delivery
    assert [e.id for e in await outbox.list("ws", "s1")] == []
    await outbox.accept("ws", "s1", "u", "c3", "three", while_busy="reject")  # idle again
    # Entries in error or parked wait for an operator, not for the agent: not busy.
    await outbox.seed_entry_for_test(
        "ws",
        "s2",
        '{"id":"e1","clientMessageID":"e1","userID":"u","text":"t",'
        '"acceptedAt":"2026-12-01T00:00:00.000000Z","attempts":5,"status":"error"}',
    )
    await outbox.accept("ws", "s2", "u", "c4", "four", while_busy="reject")
    with pytest.raises(InvalidInput):
        await outbox.accept("ws", "s3", "u", "c5", "x", while_busy="cancel")  # type: ignore[arg-type]
