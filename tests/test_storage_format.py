"""The storage format (docs/design.md "Storage format"): what an older version left in Valkey is
read and delivered by this one, and a store a newer version wrote to is refused before anything
is written. The fixtures are dumps of real stores written by older checkouts
(devtools/format_fixture.py says how each was made)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from prompt_outbox import Entry, Outbox
from prompt_outbox.core.errors import StorageFormatError
from prompt_outbox.core.keys import FORMAT_KEY, STORAGE_FORMAT
from prompt_outbox.storage.client import Client
from tests.support.tunables import FAST
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

FIXTURES = Path(__file__).parent / "fixtures"


async def load(client: Client, name: str) -> dict[str, Any]:
    """Write every key of a fixture back, with its remaining time to live."""
    fixture: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    for item in fixture["keys"]:
        key, kind, value = item["key"], item["type"], item["value"]
        if kind == "string":
            await client.set(key, value)
        elif kind == "hash":
            await client.hset(key, mapping=value)
        elif kind == "list":
            await client.rpush(key, *value)
        elif kind == "set":
            await client.sadd(key, *value)
        elif kind == "zset":
            await client.zadd(key, {m: s for m, s in value})
        elif kind == "stream":
            for event_id, fields in value:
                await client.xadd(key, fields, id=event_id)
        else:
            raise AssertionError(f"a {kind} key in {name}")
        if item["pttl"] > 0:
            await client.pexpire(key, item["pttl"])
    return fixture


async def test_a_format_1_store_is_read_and_delivered(client: Client) -> None:
    fixture = await load(client, "format-1.json")
    assert fixture["format"] == 1
    assert await client.get(FORMAT_KEY) is None  # format 1 recorded none
    outbox = Outbox(client, FAST)
    listed = await outbox.list("acme", "chat-1")
    assert [e.text for e in listed] == ["first", "second, edited", "third"]
    [refused] = await outbox.list("acme", "chat-2")
    assert refused.attempts == 1 and refused.last_error == "the agent refused it"
    [retried] = await outbox.list("beta", "chat-9")
    assert retried.last_error == "cut" and retried.model == '{"id": "m-1"}'
    counts = await outbox.count_by_workspace()
    assert sum(counts["acme"].values()) == 4 and sum(counts["beta"].values()) == 1

    delivered: list[tuple[str, str]] = []

    async def deliver(ws: str, ses: str, entry: Entry) -> None:
        delivered.append((ses, entry.text))

    async with outbox.running(deliver, tick=0.05):
        await eventually(lambda: holds(len(delivered) == 5), within=20)
    per_session = {s: [t for ses, t in delivered if ses == s] for s, _ in delivered}
    assert per_session == {
        "chat-1": ["first", "second, edited", "third"],
        "chat-2": ["failed one"],
        "chat-9": ["retried later"],
    }
    for ws, ses in (("acme", "chat-1"), ("acme", "chat-2"), ("beta", "chat-9")):
        assert await outbox.list(ws, ses) == []
    # The delivered one's events, written by format 1, are still read from its log.
    assert await client.get(FORMAT_KEY) == str(STORAGE_FORMAT).encode()


async def test_a_newer_format_is_refused_before_anything_is_written(client: Client) -> None:
    await client.set(FORMAT_KEY, str(STORAGE_FORMAT + 1))
    outbox = Outbox(client, FAST)
    with pytest.raises(StorageFormatError, match=f"format {STORAGE_FORMAT + 1}, newer"):
        await outbox.accept("acme", "s1", "u", "c1", "hello")
    with pytest.raises(StorageFormatError):
        async with outbox.running(lambda ws, ses, e: _never()):
            raise AssertionError("a worker ran against a newer store")
    keys = [k async for k in client.scan_iter()]
    assert keys == [FORMAT_KEY.encode()], keys  # nothing else was written
    # A value that is no format at all is refused as well, not overwritten.
    await client.set(FORMAT_KEY, "banana")
    with pytest.raises(StorageFormatError, match="format banana"):
        await Outbox(client, FAST).accept("acme", "s1", "u", "c1", "hello")
    assert await client.get(FORMAT_KEY) == b"banana"


async def _never() -> None:
    raise AssertionError("delivered from a newer store")


async def test_an_older_format_is_raised_to_ours_and_ours_stays(client: Client) -> None:
    await client.set(FORMAT_KEY, "1")
    outbox = Outbox(client, FAST)
    await outbox.accept("acme", "s1", "u", "c1", "hello")
    assert await client.get(FORMAT_KEY) == str(STORAGE_FORMAT).encode()


async def test_the_cli_says_so_in_one_line(client: Client, server_url: str) -> None:
    await Outbox(client, FAST).accept("acme", "s1", "u", "c1", "something to park")
    await client.set(FORMAT_KEY, str(STORAGE_FORMAT + 1))  # a newer version came since
    cli = Path(sys.executable).parent / "prompt-outbox"
    done = await asyncio.create_subprocess_exec(
        *(str(cli), "park", "acme", "--reason", "ops", "--valkey-url", server_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(done.communicate(), 60)
    finally:
        await client.delete(FORMAT_KEY)  # the server outlives the test: leave no newer format
    stderr = err.decode()
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert f"storage format {STORAGE_FORMAT + 1}, newer" in stderr, stderr
    assert [e.status for e in await Outbox(client, FAST).list("acme", "s1")] == ["pending"]
