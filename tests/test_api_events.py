"""SSE through uvicorn on a real port: reset first, an update per change, Last-Event-ID resume
with nothing missed, and the same auth as every other session route."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import pytest

from prompt_outbox import Outbox
from prompt_outbox.api import StreamLimits
from tests.agents import ScriptedAgent
from tests.conftest import eventually
from tests.test_api import ALICE, URL, serve

EVENTS = URL.removesuffix("/prompts") + "/events"


class Sse:
    """Reads one SSE response message by message."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, within: float = 5.0) -> dict[str, Any]:
        message: dict[str, Any] = {}
        async with asyncio.timeout(within):
            async for line in self._lines:
                if not line:
                    if "event" in message:
                        return message
                    message = {}
                    continue
                name, _, value = line.partition(":")
                message[name] = value.removeprefix(" ")
        raise AssertionError(f"stream ended; partial message {message}")


def data(message: dict[str, Any]) -> Any:
    return json.loads(message["data"])


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
