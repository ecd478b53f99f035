"""One URL names a standalone Valkey or a Valkey Cluster: ``valkey+cluster://host:port`` (any
node: the client discovers the rest), or ``valkeys+cluster://`` with TLS; every other URL is a
standalone server's, as valkey-py reads it."""

from __future__ import annotations

from typing import Any

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster

from .store import Client

CLUSTER_SCHEMES = {
    "valkey+cluster": "valkey",
    "valkeys+cluster": "valkeys",
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
}


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def connect(url: str, **options: Any) -> Client:
    """A client for ``url`` (not yet connected): a ``ValkeyCluster`` for a ``+cluster``
    scheme, else a ``Valkey``. ``options`` go to the client (``socket_timeout``...)."""
    scheme, _, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is not None:
        return ValkeyCluster.from_url(f"{plain}://{rest}", **options)
    client: Valkey = Valkey.from_url(url, **options)
    return client
