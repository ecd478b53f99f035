"""Sharded subscriptions on real servers: many channels over one connection per node, each
(re)subscription announced, and a killed connection made again with nothing wanted lost."""

from __future__ import annotations

import asyncio

import pytest

from prompt_outbox.storage.client import Client
from prompt_outbox.storage.shardsub import ShardSubscriber
from prompt_outbox.storage.topology import topology_of
from tests.support.pubsub import Heard, kill_subscriptions, masters, spublish
from tests.support.waiting import eventually, holds

pytestmark = pytest.mark.cluster_too

CHANNELS = [f"chan:{{ws{n}}}:s" for n in range(60)]  # 60 workspaces: every node holds some


async def test_many_channels_share_one_connection_per_node(client: Client) -> None:
    heard = Heard()
    sub = ShardSubscriber(topology_of(client), heard)
    try:
        for channel in CHANNELS:
            sub.add(channel)
        await eventually(lambda: holds(len(heard.subscribed) == len(CHANNELS)))
        assert sub.connections == await masters(client)
        for channel in CHANNELS:
            await spublish(client, channel, f"to {channel}")
        await eventually(lambda: holds(len(heard.messages) == len(CHANNELS)))
        assert all(heard.messages[c] == [f"to {c}"] for c in CHANNELS)
        # Half go: their messages stop; the rest still come.
        for channel in CHANNELS[::2]:
            sub.discard(channel)
        await asyncio.sleep(0.1)
        for channel in CHANNELS:
            await spublish(client, channel, "again")
        await eventually(lambda: holds(all(len(heard.messages[c]) == 2 for c in CHANNELS[1::2])))
        assert all(len(heard.messages[c]) == 1 for c in CHANNELS[::2])
        # None left: every connection closes.
        for channel in CHANNELS[1::2]:
            sub.discard(channel)
        await eventually(lambda: holds(sub.connections == 0))
    finally:
        await sub.aclose()


async def test_a_killed_connection_is_made_again_and_says_so(client: Client) -> None:
    heard = Heard()
    sub = ShardSubscriber(topology_of(client), heard, retry_after=0.05)
    try:
        for channel in CHANNELS[:10]:
            sub.add(channel)
        await eventually(lambda: holds(len(heard.subscribed) == 10))
        await kill_subscriptions(client)
        # Each channel is announced subscribed again: its reader looks back for what it missed.
        await eventually(lambda: holds(all(heard.subscribed[c] == 2 for c in CHANNELS[:10])))
        for channel in CHANNELS[:10]:
            await spublish(client, channel, "after")
        await eventually(lambda: holds(all(heard.messages[c] == ["after"] for c in CHANNELS[:10])))
        assert 1 <= sub.connections <= await masters(client)
    finally:
        await sub.aclose()
    assert sub.connections == 0
