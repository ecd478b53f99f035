"""One URL names a standalone Valkey, a Valkey Cluster or a primary watched by Sentinel:
``valkey+cluster://host:port`` (any node: the client discovers the rest), or
``valkeys+cluster://`` with TLS; ``valkey+sentinel://host:port,.../service`` (sentinel.py);
every other URL is a standalone server's, as valkey-py reads it (``valkeys://`` with TLS,
``user:password@`` an ACL user). ``TLSFiles`` are the CA and client certificate a TLS URL
uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libvalkey
from valkey.asyncio import Connection, SSLConnection, UnixDomainSocketConnection, Valkey
from valkey.asyncio.cluster import ValkeyCluster
from valkey.asyncio.connection import AbstractConnection
from valkey.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
from valkey.exceptions import DataError

from .client import Client
from .compat import CLUSTER_DEFAULTS, ClosedIsUnavailable, fix_cluster
from .sentinel import SENTINEL_SCHEMES, sentinel_client

CLUSTER_SCHEMES = {
    "valkey+cluster": "valkey",
    "valkeys+cluster": "valkeys",
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
}


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


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


class _Connection(ClosedIsUnavailable, _PackedConnection):
    """A cluster node's connection: packed in C, and a close under a running command is a
    ConnectionError (compat.py)."""


class _SSLConnection(_Connection, SSLConnection):
    """_Connection over TLS."""


_SAFE_CONNECTIONS: dict[type[Connection], type[Connection]] = {
    Connection: _Connection,
    SSLConnection: _SSLConnection,
}


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
        fix_cluster(cluster, _SAFE_CONNECTIONS)
        return cluster
    client: Valkey = Valkey.from_url(url, **options)
    pool = client.connection_pool
    # A connection class of the caller's own is left alone.
    pool.connection_class = _PACKED_IN_C.get(pool.connection_class, pool.connection_class)
    return client
