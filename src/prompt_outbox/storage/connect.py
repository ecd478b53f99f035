"""One URL names a standalone Valkey or a Valkey Cluster: ``valkey+cluster://host:port`` (any
node: the client discovers the rest), or ``valkeys+cluster://`` with TLS; every other URL is a
standalone server's, as valkey-py reads it."""

from __future__ import annotations

from typing import Any

from valkey.asyncio import Valkey
from valkey.asyncio.cluster import NodesManager, ValkeyCluster
from valkey.cluster import PRIMARY

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


class _OnceMovedNodesManager(NodesManager):
    """valkey-py 6.2's table of slot owners, with one MOVED applied once.

    After a failover, concurrent commands all meet MOVED to the new primary, and the client
    applies that MOVED once per command. The second time, the new primary is already the
    slot's owner, and the update takes it for the *old* primary: it is marked a replica, so
    SCRIPT LOAD (sent to primaries) skips it and every script on that shard answers NOSCRIPT
    until the table is rebuilt (tests/chaos/test_failover.py found it; tests/test_connect.py
    pins it). A MOVED naming the slot's current owner is already applied: drop it.
    """

    __slots__ = ()  # the same layout as NodesManager: the client's instance is re-classed

    def _update_moved_slots(self) -> None:
        moved = self._moved_exception
        owners = self.slots_cache.get(moved.slot_id) if moved is not None else None
        if moved is not None and owners and owners[0].name == f"{moved.host}:{moved.port}":
            owners[0].server_type = PRIMARY
            self._moved_exception = None  # type: ignore[assignment]  # the library's own reset
            return
        super()._update_moved_slots()


def connect(url: str, **options: Any) -> Client:
    """A client for ``url`` (not yet connected): a ``ValkeyCluster`` for a ``+cluster``
    scheme (with ``CLUSTER_DEFAULTS``), else a ``Valkey``. ``options`` go to the client
    (``socket_timeout``...)."""
    scheme, _, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is not None:
        cluster = ValkeyCluster.from_url(f"{plain}://{rest}", **{**CLUSTER_DEFAULTS, **options})
        cluster.nodes_manager.__class__ = _OnceMovedNodesManager
        return cluster
    client: Valkey = Valkey.from_url(url, **options)
    return client
