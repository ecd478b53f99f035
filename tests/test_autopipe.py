"""Auto-pipelining (storage/autopipe.py) against a real Valkey: calls of one turn share one
send; each caller gets its own reply or error; NOSCRIPT is reloaded and sent again once; a
cancelled first caller strands nobody."""

from __future__ import annotations

import asyncio

import pytest
import valkey.asyncio as valkey_async
from bench.roundtrips import Counting
from valkey.exceptions import ResponseError

from prompt_outbox.embedded import EmbeddedValkey
from prompt_outbox.storage.autopipe import AutoPipeline


@pytest.fixture
async def counted(valkey_server: EmbeddedValkey):  # type: ignore[no-untyped-def]
    client = valkey_async.Valkey.from_url(valkey_server.url, connection_class=Counting)
    await client.ping()
    yield client
    await client.aclose()


async def test_calls_of_one_turn_share_one_send_and_each_gets_its_reply(counted) -> None:  # type: ignore[no-untyped-def]
    incr = counted.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    await counted.delete("ap:n")
    await incr(keys=["ap:n"], args=[0])  # loaded
    pipe = AutoPipeline(counted, lambda: asyncio.sleep(0))
    Counting.sent = 0
    replies = await asyncio.gather(*(pipe.call(incr, ["ap:n"], [1]) for _ in range(20)))
    assert Counting.sent == 1
    assert sorted(replies) == list(range(1, 21))  # each ran once, each caller its own


async def test_an_error_reaches_its_own_caller_only(counted) -> None:  # type: ignore[no-untyped-def]
    fail = counted.register_script(
        "if ARGV[1] == 'x' then return redis.error_reply('bad') end return 1"
    )
    await fail(keys=["ap:k"], args=[1])
    pipe = AutoPipeline(counted, lambda: asyncio.sleep(0))
    got = await asyncio.gather(
        pipe.call(fail, ["ap:k"], [1]),
        pipe.call(fail, ["ap:k"], ["x"]),
        pipe.call(fail, ["ap:k"], [2]),
        return_exceptions=True,
    )
    assert got[0] == 1 and got[2] == 1
    assert isinstance(got[1], ResponseError) and "bad" in str(got[1])


async def test_noscript_in_a_batch_is_loaded_and_each_call_runs_once(counted) -> None:  # type: ignore[no-untyped-def]
    incr = counted.register_script("return redis.call('INCR', KEYS[1])")
    await counted.delete("ap:m")
    await counted.script_flush()  # as after a server restart

    async def load() -> None:
        await counted.script_load(incr.script)

    pipe = AutoPipeline(counted, load)
    replies = await asyncio.gather(*(pipe.call(incr, ["ap:m"], []) for _ in range(5)))
    assert sorted(replies) == [1, 2, 3, 4, 5]
    assert int(await counted.get("ap:m")) == 5


async def test_a_cancelled_first_caller_leaves_the_others_sent(counted) -> None:  # type: ignore[no-untyped-def]
    incr = counted.register_script("return redis.call('INCR', KEYS[1])")
    await counted.delete("ap:c")
    await incr(keys=["ap:c"], args=[])
    pipe = AutoPipeline(counted, lambda: asyncio.sleep(0))
    first = asyncio.create_task(pipe.call(incr, ["ap:c"], []))
    await asyncio.sleep(0)  # first is now the turn's sender, yielding once
    others = [asyncio.create_task(pipe.call(incr, ["ap:c"], [])) for _ in range(3)]
    first.cancel()
    assert sorted(await asyncio.wait_for(asyncio.gather(*others), 5)) == [2, 3, 4]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert int(await counted.get("ap:c")) == 4  # the cancelled call was never sent
