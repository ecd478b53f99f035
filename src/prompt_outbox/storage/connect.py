"""One URL names a standalone Valkey or a Valkey Cluster: ``valkey+cluster://host:port`` (any
node: the client discovers the rest), or ``valkeys+cluster://`` with TLS; every other URL is a
standalone server's, as valkey-py reads it."""

from __future__ import annotations

from typing import Any

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import ValkeyCluster

from .client import Client

CLUSTER_SCHEMES = {
    "valkey+cluster": "valkey",
    "valkeys+cluster": "valkeys",
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
}


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


CLUSTER_DEFAULTS: dict[str, Any] = {"reinitialize_steps": 0}
"""How a cluster client is built unless the caller says otherwise. ``reinitialize_steps=0``:
follow each MOVED by patching the one slot it names, never by rebuilding the whole node table
every few redirects. valkey-py 6.2's asyncio client disconnects the old table's nodes while
other commands still use them (valkey-py issue 185): during a slot migration that surfaced as
an AttributeError ('NoneType' object has no attribute 'writelines') in the middle of a
transition (tests/test_cluster_migration.py). A lost connection still rebuilds the table."""


def connect(url: str, **options: Any) -> Client:
    """A client for ``url`` (not yet connected): a ``ValkeyCluster`` for a ``+cluster``
    scheme (with ``CLUSTER_DEFAULTS``), else a ``Valkey``. ``options`` go to the client
    (``socket_timeout``...)."""
    scheme, _, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is not None:
        return ValkeyCluster.from_url(f"{plain}://{rest}", **{**CLUSTER_DEFAULTS, **options})
    client: Valkey = Valkey.from_url(url, **options)
    return client
