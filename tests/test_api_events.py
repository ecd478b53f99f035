"""SSE through uvicorn on a real port: reset first, an update per change, Last-Event-ID resume
with nothing missed, and the same auth as every other session route."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from prompt_outbox import Entry, FeedLimits, Outbox
from prompt_outbox.api import StreamLimits
from prompt_outbox.api.answers import MAX_PIECE_BYTES
from prompt_outbox.api.sse import Item, event_stream, format_item, message
from prompt_outbox.core.events import QueueReset
from prompt_outbox.storage.client import Client
from tests.agents import ScriptedAgent
from tests.support.api import ALICE, URL, serve
from tests.support.events import ARABIC_INDIC, EVENTS, RAW_MODEL, SpecSse, Sse, data
from tests.support.tunables import FAST
from tests.support.waiting import eventually

JSON_TYPE = "application/json"


async def test_reset_then_an_update_per_change(http: httpx.AsyncClient, outbox: Outbox) -> None:
    async with http.stream("GET", EVENTS, headers=ALICE) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        sse = Sse(r)
        reset = await sse.next()
        assert (reset["event"], data(reset)) == ("queue.reset", {"entries": []})
        model = '{"n":12345678901234567890,"opts":[]}'
        body = '{"clientMessageID":"m1","text":"hi","model":' + model + "}"
        accepted = (await http.post(URL, content=body, headers=ALICE)).json()
        update = await sse.next()
        assert update["event"] == "queue.update" and update["id"] > reset["id"]
        assert '"model":' + model in update["data"]  # raw model JSON, byte for byte
        assert {k: data(update)[k] for k in ("kind", "id")} == {
            "kind": "accepted",
            "id": accepted["id"],
        }
        assert await outbox.deliver_once("acme", "chat-1", ScriptedAgent())
        kinds = [data(await sse.next())["kind"] for _ in range(2)]
        assert kinds == ["delivering", "sent"]


async def test_last_event_id_resumes_without_missing_anything(http: httpx.AsyncClient) -> None:
    async with http.stream("GET", EVENTS, headers=ALICE) as r:
        reset = await Sse(r).next()
    # The phone is away: two prompts arrive, one is dismissed.
    a = (await http.post(URL, json={"clientMessageID": "a", "text": "one"}, headers=ALICE)).json()
    b = (await http.post(URL, json={"clientMessageID": "b", "text": "two"}, headers=ALICE)).json()
    assert (await http.delete(f"{URL}/{a['id']}", headers=ALICE)).status_code == 204
    headers = {**ALICE, "Last-Event-ID": reset["id"]}
    async with http.stream("GET", EVENTS, headers=headers) as r:
        sse = Sse(r)
        got = [await sse.next() for _ in range(3)]
    assert [m["event"] for m in got] == ["queue.update"] * 3  # no reset: nothing was lost
    assert [(data(m)["kind"], data(m)["id"]) for m in got] == [
        ("accepted", a["id"]),
        ("accepted", b["id"]),
        ("dismissed", a["id"]),
    ]
    # The query parameter does the same for clients that cannot set headers.
    async with http.stream("GET", EVENTS, params={"lastEventId": got[1]["id"]}, headers=ALICE) as r:
        only = await Sse(r).next()
    assert (data(only)["kind"], only["id"]) == ("dismissed", got[2]["id"])


async def test_a_resume_point_out_of_range_is_400_and_one_ahead_of_the_log_a_reset(
    http: httpx.AsyncClient,
) -> None:
    # On a session WITH events: the ID reached Valkey's XREAD, which refused it (a 500).
    accepted = await http.post(URL, json={"clientMessageID": "a", "text": "one"}, headers=ALICE)
    assert accepted.status_code == 202
    for bad in ("99999999999999999999-0", "0-18446744073709551616"):
        r = await http.get(EVENTS, headers={**ALICE, "Last-Event-ID": bad})
        assert (r.status_code, r.json()["error"]) == (400, "invalid_event_id"), r.text
    # A header cannot carry other scripts' digits; the query can. A real position in
    # Arabic-Indic digits passed the check and reached XREAD (a 500).
    async with http.stream("GET", EVENTS, headers=ALICE) as r:
        position = (await Sse(r).next())["id"]
    arabic = position.translate(ARABIC_INDIC)
    r = await http.get(EVENTS, params={"lastEventId": arabic}, headers=ALICE)
    assert (r.status_code, r.json()["error"]) == (400, "invalid_event_id"), r.text
    # In range but past the log's last event (made up): a reset, never a silent gap.
    ahead = {**ALICE, "Last-Event-ID": "18446744073709551615-18446744073709551615"}
    async with http.stream("GET", EVENTS, headers=ahead) as r:
        first = await Sse(r).next()
    assert first["event"] == "queue.reset"
    assert [e["id"] for e in data(first)["entries"]] == [accepted.json()["id"]]


@pytest.mark.parametrize(
    ("headers", "path", "status", "code"),
    [
        ({}, EVENTS, 401, "unauthorized"),
        ({"Authorization": "Bearer bob-token"}, EVENTS, 403, "forbidden"),
        ({**ALICE, "Last-Event-ID": "yesterday"}, EVENTS, 400, "invalid_event_id"),
        (ALICE, EVENTS.replace("chat-1", "chat%20one"), 400, "invalid_id"),
    ],
)
async def test_refusals_are_json(
    http: httpx.AsyncClient, headers: dict[str, str], path: str, status: int, code: str
) -> None:
    r = await http.get(path, headers=headers)
    assert (r.status_code, r.json()["error"]) == (status, code)


served = contextlib.asynccontextmanager(serve)
OPS = {"Authorization": "Bearer ops-token"}


async def _refused(http: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    async with asyncio.timeout(5):  # an admitted stream would never end
        return await http.get(EVENTS, headers=headers)


async def test_open_streams_are_bounded_per_token(outbox: Outbox) -> None:
    """Past the per-token bound a new stream is a 429 (JSON, Retry-After); a stream that
    ends (the client went away) gives its slot back."""
    async with served(outbox, streams=StreamLimits(per_process=10, per_token=2)) as http:
        async with contextlib.AsyncExitStack() as streams:
            for headers in (ALICE, ALICE, OPS):  # another token is counted apart
                r = await streams.enter_async_context(http.stream("GET", EVENTS, headers=headers))
                assert r.status_code == 200
            full = await _refused(http, ALICE)
            assert (full.status_code, full.json()["error"]) == (429, "too_many_streams")
            assert full.headers["retry-after"] == "5"

        async def alice_may_open_two() -> bool:
            async with contextlib.AsyncExitStack() as again:
                for _ in range(2):
                    r = await again.enter_async_context(http.stream("GET", EVENTS, headers=ALICE))
                    if r.status_code != 200:
                        return False
            return True

        await eventually(alice_may_open_two, within=10)


async def test_past_the_process_bound_a_new_stream_is_503(outbox: Outbox) -> None:
    limits = StreamLimits(per_process=2, per_token=5)
    async with served(outbox, streams=limits) as http, contextlib.AsyncExitStack() as streams:
        for _ in range(2):
            r = await streams.enter_async_context(http.stream("GET", EVENTS, headers=ALICE))
            assert r.status_code == 200
        full = await _refused(http, OPS)
        assert (full.status_code, full.json()["error"]) == (503, "too_many_streams")
        assert full.headers["retry-after"] == "5"


def test_stream_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="per_token"):
        StreamLimits(per_token=0)


async def test_a_model_with_line_breaks_never_splits_an_event(http: httpx.AsyncClient) -> None:
    """Every watcher parses every event as JSON: the one open before the accept (its update),
    the one opened after (its reset), and both through an edit to another such model. Today's
    writer spliced the model raw into one ``data:`` line, so each line break ended it."""
    body = '{"clientMessageID":"m1","text":"hi\u2028there","model":' + RAW_MODEL + "}"
    async with http.stream("GET", EVENTS, headers=ALICE) as before:
        early = SpecSse(before)
        assert (await early.next() or {}).get("event") == "queue.reset"
        r = await http.post(URL, content=body, headers={**ALICE, "Content-Type": JSON_TYPE})
        assert r.status_code == 202, r.text
        entry_id = r.json()["id"]
        async with http.stream("GET", EVENTS, headers=ALICE) as after:
            late = SpecSse(after)
            edited = '{"model":{"x":\r\r[\n]}}'
            r = await http.patch(
                f"{URL}/{entry_id}", content=edited, headers={**ALICE, "Content-Type": JSON_TYPE}
            )
            assert r.status_code == 200, r.text
            got = [await early.next(), await early.next(), await late.next(), await late.next()]
    parsed = [json.loads(m["data"]) for m in got if m is not None]
    assert len(parsed) == 4
    accepted, edit_seen, reset, edit_seen_late = parsed
    # The same JSON as sent: its whitespace as written, but for each CR, which comes as LF.
    assert accepted["entry"]["model"] == json.loads(RAW_MODEL)
    assert reset["entries"][0]["model"] == json.loads(RAW_MODEL)
    assert reset["entries"][0]["text"] == "hi\u2028there"
    assert (
        edit_seen["entry"]["model"]
        == edit_seen_late["entry"]["model"]
        == {
            "x": [],
        }
    )
    raw = next(m for m in got if m is not None and m["event"] == "queue.update")["data"]
    assert RAW_MODEL.replace("\r\n", "\n").replace("\r", "\n") in raw


async def test_a_client_that_does_not_read_is_cut_off_at_the_byte_bound(client: Client) -> None:
    """A stream whose client takes nothing holds the generator (Starlette awaits each send,
    uvicorn's send waits on its flow control), so its follower fills up to its byte bound and
    is cut off there (not at 1000 events: there are 120), and nothing piles up in between.
    Read at last, it gives what it had, then ends cleanly; resumed by its last ID, the rest."""
    # A log that keeps the 11 MB (event_log_bytes): its resume is the rest, not a reset.
    roomy = dataclasses.replace(FAST, event_log_bytes=16 * 1024 * 1024)
    outbox = Outbox(client, roomy, feed=FeedLimits(max_behind_bytes=256 * 1024))
    headers = {**ALICE, "Content-Type": JSON_TYPE}
    async with served(outbox) as http:
        body = '{"clientMessageID":"m1","text":"small"}'
        entry_id = (await http.post(URL, content=body, headers=headers)).json()["id"]
        async with http.stream("GET", EVENTS, headers=ALICE) as stalled:
            # 120 edits of 90 KB: about 11 MB, past what the sockets' buffers absorb.
            for n in range(120):
                text = f"{n:04d}" + "x" * 90_000
                r = await http.patch(f"{URL}/{entry_id}", json={"text": text}, headers=headers)
                assert r.status_code == 200, r.text

            async def cut() -> bool:
                text = (await http.get("/metrics")).text
                return 'prompt_outbox_streams_fell_behind_total{bound="bytes"} 1.0' in text

            await eventually(cut)
            sse = SpecSse(stalled)
            got = [m async for m in _messages(sse)]
            assert sse.ended  # a clean end: EventSource reconnects with the last ID
        assert got[0]["event"] == "queue.reset"
        seen = [json.loads(m["data"])["entry"]["text"][:4] for m in got[1:]]
        assert 0 < len(seen) < 120
        assert seen == [f"{n:04d}" for n in range(len(seen))]
        resume = {**ALICE, "Last-Event-ID": got[-1]["id"]}
        async with http.stream("GET", EVENTS, headers=resume) as again:
            sse = SpecSse(again)
            rest = [await sse.next() for _ in range(120 - len(seen))]
        assert all(m is not None and m["event"] == "queue.update" for m in rest)  # no reset
        texts = [json.loads(m["data"])["entry"]["text"][:4] for m in rest if m is not None]
        assert seen + texts == [f"{n:04d}" for n in range(120)]
    await outbox.aclose()


async def _messages(sse: SpecSse) -> AsyncIterator[dict[str, Any]]:
    while (message := await sse.next()) is not None:
        yield message


async def test_a_large_message_goes_to_the_server_in_pieces() -> None:
    """A queue.reset of 25 prompts near the text limit is over 2 MB: handed to the server in
    one piece, it would sit whole in uvicorn's transport buffer for a client that does not
    read (flow control only stops the next send); in pieces, at most one piece + one wait."""
    now = datetime.now(UTC)
    entries = [Entry(f"e{n}", f"c{n}", "u", "x" * 90_000, now) for n in range(25)]
    reset = QueueReset("5-0", entries)
    whole = format_item(reset)

    async def nothing_more() -> AsyncIterator[Item]:
        return
        yield

    async def connected() -> bool:
        return False

    chunks = [c async for c in event_stream(reset, nothing_more(), connected)]
    assert max(len(c) for c in chunks) <= MAX_PIECE_BYTES
    assert len(chunks) > 2_000_000 // MAX_PIECE_BYTES
    assert b"".join(c for c in chunks[1:] if isinstance(c, bytes)).decode() == whole
    assert reset.entries == []  # taken out as they were written


def test_an_id_or_event_name_can_never_hold_a_line_break() -> None:
    for event_id, event in (("5-0\ndata: x", "queue.update"), ("5-0", "queue.update\r")):
        with pytest.raises(ValueError, match="line break"):
            message(event_id, event, "{}")
    assert message("5-0", "e", "{\r\n}") == "id: 5-0\nevent: e\ndata: {\ndata: }\n\n"


async def test_a_stream_holds_its_reset_only_while_it_is_sent() -> None:
    """A stream lives for hours, and its first message is the whole queue: the generator
    frees each entry once written, and keeps nothing of the reset once it is sent (it kept
    the reset and its whole text for the stream's life: docs/security.md, a stalled client kept
    whole answers)."""
    now = datetime.now(UTC)
    reset = QueueReset("5-0", [Entry(f"e{n}", f"c{n}", "u", "x" * 9000, now) for n in range(3)])
    whole = format_item(reset)

    async def quiet_forever() -> AsyncIterator[Item]:
        while True:
            yield None

    async def connected() -> bool:
        return False

    stream = event_stream(reset, quiet_forever(), connected)
    try:
        assert (await anext(stream)).startswith("retry:")  # type: ignore[union-attr]
        sent = b""
        while (piece := await anext(stream)) != b"":  # then the wait for the transport
            assert isinstance(piece, bytes)
            sent += piece
        assert sent.decode() == whole and reset.entries == []
        assert await anext(stream) == ": keepalive\n\n"  # suspended again, past the reset
        held = stream.ag_frame.f_locals  # type: ignore[attr-defined]
        assert (held["first"], held["item"], held["hold"]) == (None, None, None)
    finally:
        await stream.aclose()
