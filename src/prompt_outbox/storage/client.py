"""The client the storage layer takes: a standalone server's, or a Valkey Cluster's."""

from __future__ import annotations

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster

Client = Valkey | ValkeyCluster
"""A standalone server's client, or a Valkey Cluster's: the Store takes either."""
