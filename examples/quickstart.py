import asyncio

from prompt_outbox import Duplicate, Entry, Outbox, connect
from prompt_outbox.embedded import EmbeddedValkey


async def deliver(ws: str, ses: str, entry: Entry) -> None:
    print(f"agent {ws}/{ses} got: {entry.text!r}")  # POST to your agent here; raise to fail


async def main() -> None:
    with EmbeddedValkey("./.prompt-outbox") as server:  # durable: appendfsync always
        outbox = Outbox(connect(server.url))  # or any valkey.asyncio client
        async with outbox.running(deliver):  # on exit: in-flight deliveries finish first
            try:
                entry = await outbox.accept("acme", "chat-1", "user-7", "msg-1", "Hello, agent!")
                print("accepted", entry.id, entry.status)
            except Duplicate as dup:  # a client retry (or a second run: the data dir is durable)
                print("already accepted as", dup.accepted_id)
            await asyncio.sleep(0.5)  # the worker delivers it in the background
            print("still queued:", await outbox.list("acme", "chat-1"))


asyncio.run(main())
