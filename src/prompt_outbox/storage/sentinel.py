"""A primary found through Valkey Sentinel: ``valkey+sentinel://[user:password@]host:port[,host:
port...]/service-name[?db=N&sentinel_username=U&sentinel_password=P]``.

The hosts are the sentinels (port 26379 when left out), the path names the service (the
``sentinel monitor <name>`` they watch). ``user:password`` are the data nodes' credentials (the
ACL user the outbox writes as); the sentinels' own, when they require any, go in
``sentinel_username`` / ``sentinel_password``. ``valkeys+sentinel://`` speaks TLS to the
sentinels and the data nodes alike (``redis+sentinel`` / ``rediss+sentinel`` are the same).

The client is valkey-py's ``Sentinel.master_for``: each new connection asks the sentinels for
the primary's address. After a primary dies, its connections fail (``ConnectionError``: an
HTTP 503, the run loop's retry) and the next connection goes where the sentinels point: still
the dead primary until they fail over (refused at once on a live host), then the promoted
replica. A demoted primary that is still up answers ``READONLY``, which the client turns into
a ``ConnectionError`` and a fresh look-up. Sentinel itself closes the clients of a primary it
demotes, subscribers included, so the wake-up subscriptions (``shardsub.py``) reconnect too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

from valkey.asyncio import Valkey
from valkey.asyncio.sentinel import (
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

SENTINEL_SCHEMES = {
    "valkey+sentinel": False,
    "valkeys+sentinel": True,
    "redis+sentinel": False,
    "rediss+sentinel": True,
}
"""Scheme -> whether it speaks TLS."""

DEFAULT_SENTINEL_PORT = 26379
_QUERY = ("db", "sentinel_username", "sentinel_password")


class SentinelURLError(ValueError):
    """A ``+sentinel`` URL that does not say which sentinels and which service."""


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """What a ``+sentinel`` URL says."""

    sentinels: list[tuple[str, int]]
    service: str
    tls: bool
    username: str | None = None
    password: str | None = None
    db: int = 0
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def parse_sentinel_url(url: str) -> SentinelURL:
    """Read a ``+sentinel`` URL (see the module's docstring); SentinelURLError if it is not one."""
    scheme, _, rest = url.partition("://")
    tls = SENTINEL_SCHEMES.get(scheme.lower())
    if tls is None:
        raise SentinelURLError(f"not a sentinel URL (the scheme is {scheme!r})")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = [_host_port(part) for part in hosts.split(",") if part.strip()]
    if not sentinels:
        raise SentinelURLError("a sentinel URL names at least one sentinel: host:port")
    service = unquote(path.strip("/"))
    if not service or "/" in service:
        raise SentinelURLError("a sentinel URL ends with the service's name: .../service-name")
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(_QUERY))
    if unknown:
        raise SentinelURLError(
            f"unknown option(s) in the sentinel URL: {', '.join(unknown)} "
            f"(known: {', '.join(_QUERY)})"
        )
    db = options.get("db", "0")
    if not db.isdigit():
        raise SentinelURLError(f"db={db!r} in the sentinel URL is not a database number")
    return SentinelURL(
        sentinels,
        service,
        tls,
        username,
        password,
        int(db),
        options.get("sentinel_username") or None,
        options.get("sentinel_password") or None,
    )


def _host_port(text: str) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [ipv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host or (port and not port.isdigit()):
        raise SentinelURLError(f"{text!r} in the sentinel URL is not host:port")
    return host, int(port) if port else DEFAULT_SENTINEL_PORT


def sentinel_client(
    url: str,
    plain: type[SentinelManagedConnection] = SentinelManagedConnection,
    tls: type[SentinelManagedConnection] = SentinelManagedSSLConnection,
    **options: Any,
) -> Valkey:
    """A client of the primary of the service ``url`` names (not yet connected). ``options``
    go to its connections (``socket_timeout``, ``ssl_ca_certs``...); the sentinels get the
    socket and TLS ones. ``plain`` / ``tls``: the connection classes (valkey-py's
    sentinel-managed ones, or subclasses)."""
    parsed = parse_sentinel_url(url)
    to_sentinels = {k: v for k, v in options.items() if k.startswith(("socket_", "ssl_"))}
    if parsed.tls:
        to_sentinels["ssl"] = True
    if parsed.sentinel_username:
        to_sentinels["username"] = parsed.sentinel_username
    if parsed.sentinel_password:
        to_sentinels["password"] = parsed.sentinel_password
    sentinel = Sentinel(parsed.sentinels, sentinel_kwargs=to_sentinels)  # type: ignore[no-untyped-call]
    client: Valkey = sentinel.master_for(
        parsed.service,
        connection_class=tls if parsed.tls else plain,
        username=parsed.username,
        password=parsed.password,
        db=parsed.db,
        **options,
    )
    return client
