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
    MasterNotFoundError,
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

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


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _no_primary_line(
    service: str,
    sentinels: list[tuple[str, int]],
    unknown: int = 0,
    down: int = 0,
    errors: list[BaseException] | None = None,
) -> str:
    """The one line for "no sentinel names a primary for ``service``": which service, which
    sentinels (addresses only: the URL's credentials stay out), what they answered, what to
    check. ``unknown``: how many answered without the service, ``down``: how many see its
    primary down, ``errors``: why the others did not answer (the first is quoted, last)."""
    why = []
    if unknown:
        why.append(
            "none knows the service"
            if unknown == len(sentinels)
            else f"{unknown} know no such service"
        )
    if down:
        why.append(f"{down} see its primary down")
    if errors:
        first = " ".join(str(errors[0]).split()).rstrip(".") or type(errors[0]).__name__
        why.append(f"{len(errors)} did not answer: {first}")
    where = ", ".join(_address(host, port) for host, port in sentinels)
    return (
        f"no primary for service {service!r} from sentinels {where} ({'; '.join(why)}): "
        "check the service name and that the sentinels run"
    )


class _OneLineSentinel(Sentinel):
    """valkey-py's Sentinel, but when no sentinel names a primary its MasterNotFoundError is
    ``_no_primary_line`` instead of valkey-py's list of the repr of every sentinel client and
    its error (long, with class paths, in the CLI's one line and serve's log). The look-up is
    valkey-py's own loop, redone here because that one keeps only the text of each error."""

    def __init__(self, sentinels: list[tuple[str, int]], **options: Any) -> None:
        super().__init__(sentinels, **options)  # type: ignore[no-untyped-call]
        self.addresses = list(sentinels)

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        unknown = down = 0
        errors: list[BaseException] = []
        for n, sentinel in enumerate(self.sentinels):
            try:
                masters = await sentinel.sentinel_masters()  # type: ignore[no-untyped-call]
            except (ValkeyConnectionError, ValkeyTimeoutError) as exc:
                errors.append(exc)
                continue
            state = masters.get(service_name)
            if state is None:
                unknown += 1
            elif not self.check_master_state(state, service_name):
                down += 1
            else:  # as valkey-py: ask the one that knew first next time
                self.sentinels[0], self.sentinels[n] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
        line = _no_primary_line(service_name, self.addresses, unknown, down, errors)
        raise MasterNotFoundError(line)


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
    sentinel = _OneLineSentinel(parsed.sentinels, sentinel_kwargs=to_sentinels)
    client: Valkey = sentinel.master_for(
        parsed.service,
        connection_class=tls if parsed.tls else plain,
        username=parsed.username,
        password=parsed.password,
        db=parsed.db,
        **options,
    )
    return client
