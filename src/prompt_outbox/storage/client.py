"""The client the storage layer takes: a standalone server's, or a Valkey Cluster's."""

from __future__ import annotations

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster
from valkey.asyncio.sentinel import SentinelConnectionPool

Client = Valkey | ValkeyCluster
"""A standalone server's client, or a Valkey Cluster's: the Store takes either."""


def address(client: Valkey) -> str:
    """A standalone client's server as ``host:port`` (how a cluster client names its nodes);
    through Sentinel, the primary it last found (or the service's name before it looked)."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        if pool.master_address is None:
            return f"the primary of {pool.service_name!r}"
        host, port = pool.master_address
        return f"{host}:{port}"
    kwargs = pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"
