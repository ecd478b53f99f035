"""Sharded pub/sub on a real server: what a subscriber heard, publishing, and cutting every
subscription."""

from __future__ import annotations

from collections import defaultdict

from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox.storage.client import Client


class Heard:
    """What a subscriber was told: messages per channel, and how often each was (re)subscribed."""

    def __init__(self) -> None:
        self.messages: dict[str, list[str]] = defaultdict(list)
        self.subscribed: dict[str, int] = defaultdict(int)

    def __call__(self, channel: str, message: str | None) -> None:
        if message is None:
            self.subscribed[channel] += 1
        else:
            self.messages[channel].append(message)


async def masters(client: Client) -> int:
    return len(client.get_primaries()) if isinstance(client, ValkeyCluster) else 1


async def spublish(client: Client, channel: str, message: str) -> None:
    await client.execute_command("SPUBLISH", channel, message)


async def kill_subscriptions(client: Client) -> None:
    """CLIENT KILL every pub/sub connection, on every node: what a network cut does."""
    if isinstance(client, ValkeyCluster):
        await client.execute_command(
            "CLIENT KILL", "TYPE", "pubsub", target_nodes=ValkeyCluster.PRIMARIES
        )
    else:
        await client.execute_command("CLIENT KILL", "TYPE", "pubsub")  # type: ignore[no-untyped-call]
