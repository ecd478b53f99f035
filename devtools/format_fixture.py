"""Write a fixture of what an older prompt-outbox left in Valkey (tests/fixtures/format-N.json).

Run it with an OLDER checkout's package first on the path, e.g. for format 1 (before the
storage format key existed, commit cdebc66)::

    git worktree add /tmp/fmt1 cdebc66
    PYTHONPATH=/tmp/fmt1/src .venv/bin/python -m devtools.format_fixture \\
        --format 1 --commit cdebc66 --out tests/fixtures/format-1.json
    git worktree remove /tmp/fmt1

It starts a throwaway valkey-server, makes a few sessions in every state that version can
leave (pending, edited, failed for good, delivered with its event log, a staged entry left by
a worker that died mid-send), and dumps every key with its type, value and TTL.
tests/test_storage_format.py loads the dump into a fresh server and reads it with today's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import valkey.asyncio as valkey_async

from prompt_outbox import Entry, Outbox
from prompt_outbox.core.errors import TransientDeliveryError
from prompt_outbox.embedded import free_port
from prompt_outbox.storage.compat import valkey_server_binary


async def make_state(client: valkey_async.Valkey) -> None:
    outbox = Outbox(client)

    async def ok(ws: str, ses: str, entry: Entry) -> None:
        return None

    async def fails(ws: str, ses: str, entry: Entry) -> None:
        raise RuntimeError("the agent refused it")

    async def dies(ws: str, ses: str, entry: Entry) -> None:
        raise TransientDeliveryError(RuntimeError("cut"))

    # acme/chat-1: three waiting, the second edited; a model on the third.
    for n, text in enumerate(("first", "second, before its edit", "third")):
        await outbox.accept("acme", "chat-1", "u1", f"c{n}", text)
    listed = await outbox.list("acme", "chat-1")
    await outbox.edit("acme", "chat-1", listed[1].id, text="second, edited")
    # acme/chat-2: one delivered (its events stay in the log), one failed for good.
    await outbox.accept("acme", "chat-2", "u2", "d1", "delivered one")
    assert await outbox.deliver_once("acme", "chat-2", ok)
    await outbox.accept("acme", "chat-2", "u2", "d2", "failed one")
    assert await outbox.deliver_once("acme", "chat-2", fails)
    # beta/chat-9: a transient failure (attempts counted, due later).
    await outbox.accept("beta", "chat-9", "u9", "t1", "retried later", model='{"id": "m-1"}')
    assert await outbox.deliver_once("beta", "chat-9", dies)


async def dump(client: valkey_async.Valkey) -> list[dict[str, Any]]:
    keys = sorted([k async for k in client.scan_iter(count=1000)])
    out: list[dict[str, Any]] = []
    for key in keys:
        kind = (await client.type(key)).decode()
        value: Any
        if kind == "string":
            value = (await client.get(key)).decode()
        elif kind == "hash":
            value = {k.decode(): v.decode() for k, v in (await client.hgetall(key)).items()}
        elif kind == "list":
            value = [v.decode() for v in await client.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(v.decode() for v in await client.smembers(key))
        elif kind == "zset":
            value = [[m.decode(), s] for m, s in await client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            value = [
                [i.decode(), {k.decode(): v.decode() for k, v in f.items()}]
                for i, f in await client.xrange(key)
            ]
        else:
            raise SystemExit(f"{key!r}: a {kind} key this tool does not dump")
        out.append(
            {"key": key.decode(), "type": kind, "pttl": await client.pttl(key), "value": value}
        )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", type=int, required=True)
    parser.add_argument("--commit", required=True, help="the checkout the package came from")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = await asyncio.create_subprocess_exec(
            str(valkey_server_binary()),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", tmp),
            *("--save", "", "--appendonly", "no"),
            stdout=asyncio.subprocess.DEVNULL,
        )
        try:
            client = valkey_async.Valkey(port=port)
            for _ in range(100):
                try:
                    await client.ping()
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            await make_state(client)
            keys = await dump(client)
            await client.aclose()
        finally:
            server.terminate()
            await server.wait()
    fixture = {"format": args.format, "commit": args.commit, "keys": keys}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(keys)} keys -> {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
