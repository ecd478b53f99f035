"""One URL names a standalone Valkey, a Valkey Cluster or a primary watched by Sentinel:
``valkey+cluster://host:port`` (any node: the client discovers the rest), or
``valkeys+cluster://`` with TLS; ``valkey+sentinel://host:port,.../service`` (sentinel.py);
every other URL is a standalone server's, as valkey-py reads it (``valkeys://`` with TLS,
``user:password@`` an ACL user). ``TLSFiles`` are the CA and client certificate a TLS URL
uses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import libvalkey
from valkey.asyncio import Connection, SSLConnection, UnixDomainSocketConnection, Valkey
from valkey.asyncio.cluster import NodesManager, ValkeyCluster
from valkey.asyncio.connection import AbstractConnection
from valkey.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
from valkey.cluster import PRIMARY
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import DataError

from .client import Client
from .sentinel import SENTINEL_SCHEMES, sentinel_client

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


class _FailoverNodesManager(NodesManager):
    """valkey-py 6.2's table of slot owners, fixed for what a failover does to it.

    - One MOVED applied once. After a failover, concurrent commands all meet MOVED to the new
      primary, and the client applies it once per command. The second time, the new primary
      is already the slot's owner, and the update takes it for the *old* primary: it is
      marked a replica, so SCRIPT LOAD (sent to primaries) skips it and every script on that
      shard answers NOSCRIPT until the table is rebuilt. A MOVED naming the slot's current
      owner is already applied: drop it.
    - The default node kept while the table closes. A lost connection makes the client close
      every node before it rebuilds the table, and the library clears the default node first:
      a pipeline of another task that met an error in that window read the default node's
      name and raised AttributeError. The old default node is kept until the rebuild names a
      new one (a command sent to it meanwhile meets a clear ConnectionError, and is retried).

    tests/chaos/test_failover.py found both; tests/test_connect.py pins them.
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

    async def aclose(self, attr: str = "nodes_cache") -> None:
        # The library's aclose, without clearing default_node (initialize() sets it anew).
        await self._close_pending_node_disconnects()
        await asyncio.gather(*(node.disconnect() for node in getattr(self, attr).values()))


_UTF8 = frozenset({"utf-8", "utf8", "UTF-8", "UTF8"})


class _PacksInC(AbstractConnection):
    """A connection that packs each command in C, with libvalkey's ``pack_command``.

    valkey-py's sync client already does; its asyncio client packs in Python, one encode and
    one isinstance per argument: 26 us of an accept's ~130 us of CPU (a 25-argument script
    call), against 4 us here (docs/performance.md, "HTTP accept"). ``pack_commands`` (a
    pipeline) packs through this method too. The bytes are the same: the test pins it.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if encoder.encoding not in _UTF8 or encoder.encoding_errors != "strict":
            return super().pack_command(*args)  # libvalkey encodes text as strict UTF-8 only
        # As valkey-py does: a command name given as 'CONFIG GET' is two arguments.
        head = args[0]
        if isinstance(head, str):
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [libvalkey.pack_command(args)]
        except TypeError as err:  # as valkey-py's encoder: bool, None... are not arguments
            raise DataError(str(err)) from err


class _PackedConnection(_PacksInC, Connection):
    """_PacksInC over TCP."""


class _PackedSSLConnection(_PacksInC, SSLConnection):
    """_PacksInC over TLS."""


class _PackedUnixConnection(_PacksInC, UnixDomainSocketConnection):
    """_PacksInC over a Unix socket."""


class _PackedSentinelConnection(_PacksInC, SentinelManagedConnection):
    """_PacksInC to the primary Sentinel names."""


class _PackedSentinelSSLConnection(_PacksInC, SentinelManagedSSLConnection):
    """_PacksInC to the primary Sentinel names, over TLS."""


_PACKED_IN_C: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _PackedConnection,
    SSLConnection: _PackedSSLConnection,
    UnixDomainSocketConnection: _PackedUnixConnection,
}


class _Connection(_PackedConnection):
    """A cluster node's connection whose close under a running command is a ConnectionError.

    When the client rebuilds its table it disconnects every old node's connections, those in
    use by other tasks too (valkey-py issue 185). A task then writing on one met
    AttributeError ('NoneType' object has no attribute 'writelines'): an HTTP 500 where
    "Valkey unavailable" (503, and the client's own retry) is the truth.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with _closed_is_unavailable(self):
            await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        with _closed_is_unavailable(self):
            return await super().read_response(*args, **kwargs)


class _SSLConnection(_Connection, SSLConnection):
    """_Connection over TLS."""


_SAFE_CONNECTIONS: dict[type[Connection], type[Connection]] = {
    Connection: _Connection,
    SSLConnection: _SSLConnection,
}


@contextlib.contextmanager
def _closed_is_unavailable(connection: Connection) -> Iterator[None]:
    try:
        yield
    except AttributeError as err:
        if connection.is_connected:  # on an open connection, a bug: it stays one
            raise
        raise ValkeyConnectionError(f"the connection closed under the command ({err})") from err


def _fix_cluster(cluster: ValkeyCluster) -> None:
    """The workarounds above, on a cluster client not yet connected."""
    nodes = cluster.nodes_manager
    nodes.__class__ = _FailoverNodesManager
    kind = nodes.connection_kwargs.get("connection_class", Connection)
    safe = _SAFE_CONNECTIONS.get(kind, kind)  # a class of the caller's own is left alone
    nodes.connection_kwargs["connection_class"] = safe
    for node in nodes.startup_nodes.values():
        node.connection_class = safe


_TLS_SCHEMES = frozenset({"valkeys", "rediss"})


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The files a TLS connection uses (PEM): ``ca_file`` the CA that signed the server's
    certificate (default: the system's CAs), ``cert_file`` / ``key_file`` this client's
    certificate and key when the server asks for one (``tls-auth-clients``)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def options(self, url: str) -> dict[str, Any]:
        """The client's TLS options for ``url``; ValueError if files are given for a URL
        without TLS (they would be ignored: a mistake worth saying)."""
        given = {
            name: value
            for name, value in (
                ("ssl_ca_certs", self.ca_file),
                ("ssl_certfile", self.cert_file),
                ("ssl_keyfile", self.key_file),
            )
            if value
        }
        if not uses_tls(url):
            if given:
                raise ValueError(
                    "TLS files are given but the Valkey URL has no TLS: use valkeys:// "
                    "(valkeys+cluster://, valkeys+sentinel://)"
                )
            return {}
        # The server's certificate must name the host the URL (or the cluster, or Sentinel)
        # gives: an IP address needs an IP entry in the certificate.
        return {"ssl_check_hostname": True, **given}


def uses_tls(url: str) -> bool:
    """Whether ``url``'s scheme speaks TLS."""
    scheme = url.partition("://")[0].lower()
    return scheme.partition("+")[0] in _TLS_SCHEMES


def connect(url: str, tls: TLSFiles | None = None, **options: Any) -> Client:
    """A client for ``url`` (not yet connected): a ``ValkeyCluster`` for a ``+cluster``
    scheme (with ``CLUSTER_DEFAULTS``), a Sentinel-managed ``Valkey`` for a ``+sentinel`` one,
    else a ``Valkey``. ``tls``: the files of a TLS URL (ValueError on a URL without TLS).
    ``options`` go to the client (``socket_timeout``...)."""
    options = {**(tls or TLSFiles()).options(url), **options}
    scheme, _, rest = url.partition("://")
    if scheme.lower() in SENTINEL_SCHEMES:
        return sentinel_client(
            url, _PackedSentinelConnection, _PackedSentinelSSLConnection, **options
        )
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is not None:
        cluster = ValkeyCluster.from_url(f"{plain}://{rest}", **{**CLUSTER_DEFAULTS, **options})
        _fix_cluster(cluster)
        return cluster
    client: Valkey = Valkey.from_url(url, **options)
    pool = client.connection_pool
    # A connection class of the caller's own is left alone.
    pool.connection_class = _PACKED_IN_C.get(pool.connection_class, pool.connection_class)
    return client
