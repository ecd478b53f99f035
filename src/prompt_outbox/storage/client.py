"""The client the storage layer takes: a standalone server's, or a Valkey Cluster's."""

from __future__ import annotations

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster

Client = Valkey | ValkeyCluster
"""A standalone server's client, or a Valkey Cluster's: the Store takes either."""


def address(client: Valkey) -> str:
    """A standalone client's server as ``host:port`` (how a cluster client names its nodes)."""
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"
