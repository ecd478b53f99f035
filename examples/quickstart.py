import asyncio
from contextlib import suppress

from prompt_outbox import Duplicate, Entry, Outbox, connect
from prompt_outbox.embedded import EmbeddedValkey


async def deliver(ws: str, ses: str, entry: Entry) -> None:  # POST to your agent; raise to fail
    print(f"agent {ws}/{ses} got: {entry.text!r}")


async def main() -> None:
    with EmbeddedValkey("./.prompt-outbox-lib") as server:  # durable: appendfsync always
        outbox = Outbox(connect(server.url))  # or any valkey.asyncio client
        with suppress(Duplicate):  # msg-1 seen: a retry, or a 2nd run (the data is kept)
            await outbox.accept("acme", "chat-1", "user-7", "msg-1", "Hello, agent!")
        await outbox.deliver_once("acme", "chat-1", deliver)  # one step; see below


asyncio.run(main())
