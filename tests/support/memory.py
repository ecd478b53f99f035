"""A test server's memory: its INFO memory, and a maxmemory given for a test and then given
back (the servers are shared by the tests of a run)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from valkey.asyncio.cluster import ValkeyCluster

from prompt_outbox.core.keys import SessionKeys
from prompt_outbox.storage.client import Client


def node_of(client: Client, ws: str) -> Any:
    """The node that owns the workspace's slot (None on a standalone server)."""
    if isinstance(client, ValkeyCluster):
        return client.get_node_from_key(SessionKeys(ws, "s").queue)
    return None


async def on_node(client: Client, node: Any, command: str, *args: Any) -> Any:
    """``command`` on ``node`` (None: the standalone server)."""
    if node is None:
        return await client.execute_command(command, *args)
    return await client.execute_command(command, *args, target_nodes=node)


async def memory(client: Client, node: Any) -> dict[str, int]:
    """The node's ``used_memory`` and ``maxmemory`` (``used``, ``max``)."""
    raw = await on_node(client, node, "INFO", "memory")
    info = raw if "used_memory" in raw else next(iter(raw.values()))
    return {"used": int(info["used_memory"]), "max": int(info["maxmemory"])}


def primaries(client: Client) -> list[Any]:
    """Every primary (``[None]``: the standalone server)."""
    if isinstance(client, ValkeyCluster):
        return list(client.get_primaries())
    return [None]


@asynccontextmanager
async def maxmemory(client: Client, limit: int) -> AsyncIterator[None]:
    """Every primary with ``limit`` as its maxmemory while the block runs; as it was after."""
    nodes = primaries(client)
    before = [(await memory(client, node))["max"] for node in nodes]
    for node in nodes:
        await on_node(client, node, "CONFIG", "SET", "maxmemory", str(limit))
    try:
        yield
    finally:
        for node, was in zip(nodes, before, strict=True):
            await on_node(client, node, "CONFIG", "SET", "maxmemory", str(was))


async def sent_bytes(client: Client) -> int:
    """The bytes every primary has sent its clients so far (INFO stats
    ``total_net_output_bytes``): what a read cost, as a difference."""
    total = 0
    for node in primaries(client):
        raw = await on_node(client, node, "INFO", "stats")
        info = raw if "total_net_output_bytes" in raw else next(iter(raw.values()))
        total += int(info["total_net_output_bytes"])
    return total
