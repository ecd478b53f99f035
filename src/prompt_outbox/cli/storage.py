"""Where the CLI's Valkey comes from: a URL, the embedded server another command already runs
on the data dir, or an embedded server this command starts (and stops) itself."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.settings import DURABILITY_LEVELS, Tunables, tunables_from_json
from ..outbox import Outbox
from ..storage.client import Client
from ..storage.connect import TLSFiles, connect
from ..storage.durability import DurabilityError
from ..storage.embedded import (
    DataDirInUse,
    EmbeddedValkey,
    UnsafeDataDir,
    redacted,
    running_url,
)
from ..storage.feed import FeedLimits
from .unreachable import remember_valkey_url

log = logging.getLogger("prompt_outbox.cli")
F = TypeVar("F", bound=Callable[..., Any])


_SIZE_UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3}


class ByteSize(click.ParamType[int, Any]):
    """A size in bytes: a whole number, or with kb / mb / gb (powers of 1024, as Valkey reads
    them)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        unit = _SIZE_UNITS.get(text[-2:], 1)
        number = text[:-2] if unit > 1 else text
        if not (number.isascii() and number.isdigit()):
            self.fail(f"{value!r} is not a size (e.g. 2gb, 512mb, or bytes)", param, ctx)
        return int(number) * unit


def storage_options(command: F) -> F:
    """--valkey-url / --data-dir / --valkey-maxmemory / --tunables, shared by every command."""
    for option in reversed(
        [
            click.option(
                "--valkey-url",
                envvar="PROMPT_OUTBOX_VALKEY_URL",
                help="external Valkey: valkey://[user:password@]host:port (valkeys:// with "
                "TLS), valkey+cluster://host:port for a cluster, "
                "valkey+sentinel://host:port[,host:port...]/service through Sentinel "
                "(docs/deploy.md); default: the embedded one on --data-dir",
            ),
            *tls_options(),
            click.option(
                "--data-dir",
                default="./.prompt-outbox",
                show_default=True,
                envvar="PROMPT_OUTBOX_DATA_DIR",
                type=click.Path(path_type=Path),
                help="the embedded Valkey's data",
            ),
            click.option(
                "--valkey-maxmemory",
                type=ByteSize(),
                envvar="PROMPT_OUTBOX_VALKEY_MAXMEMORY",
                help="the embedded Valkey's maxmemory when this command starts it (e.g. 2gb; "
                "0: none); default a quarter of the memory, at most 4gb. Accepts stop at "
                "accept_memory_ratio of it",
            ),
            click.option(
                "--tunables",
                "tunables_json",
                envvar="PROMPT_OUTBOX_TUNABLES",
                help="JSON of Tunables fields, e.g. '{\"lease_ttl\": 10}' (default: see"
                " docs/contract.md)",
            ),
        ]
    ):
        command = option(command)
    return command


_TLS_META = "prompt_outbox.tls"


def tls_options() -> list[Callable[[F], F]]:
    """--valkey-ca-file / --valkey-cert-file / --valkey-key-file: kept on the click context
    (not passed to each command) and read by ``open_valkey``."""

    def keep(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None and param.name is not None:
            ctx.meta.setdefault(_TLS_META, {})[param.name] = value

    return [
        click.option(
            f"--valkey-{name}-file",
            f"{name}_file",
            envvar=f"PROMPT_OUTBOX_VALKEY_{name.upper()}_FILE",
            type=click.Path(exists=True, dir_okay=False),
            expose_value=False,
            callback=keep,
            help=text,
        )
        for name, text in (
            ("ca", "PEM file of the CA that signed a valkeys:// server's certificate "
             "(default: the system's CAs)"),
            ("cert", "PEM client certificate, for a valkeys:// server that asks for one"),
            ("key", "PEM key of --valkey-cert-file"),
        )
    ]  # fmt: skip


def durability_options(command: F) -> F:
    """--accept-durability / --durability-timeout / --strict-durability (serve, worker)."""
    for option in reversed(
        [
            click.option(
                "--accept-durability",
                type=click.Choice(DURABILITY_LEVELS),
                envvar="PROMPT_OUTBOX_ACCEPT_DURABILITY",
                help="what an acknowledged accept promises: none (the server's config), fsync "
                "(on the primary's disk), replica (also on a replica's disk); default fsync, "
                "stepping down with a warning if the server cannot",
            ),
            click.option(
                "--durability-timeout",
                type=click.FloatRange(min=0.001),
                envvar="PROMPT_OUTBOX_DURABILITY_TIMEOUT",
                help="seconds an accept waits for its durability before answering 503 "
                "not_durable (default 5)",
            ),
            click.option(
                "--strict-durability",
                is_flag=True,
                envvar="PROMPT_OUTBOX_STRICT_DURABILITY",
                help="refuse a Valkey that could lose acknowledged accepts",
            ),
        ]
    ):
        command = option(command)
    return command


@dataclass(frozen=True)
class Durability:
    """The durability options of serve and worker; None: the tunables' own value."""

    accept_durability: str | None = None
    durability_timeout: float | None = None
    strict_durability: bool = False


def _tunables(tunables_json: str | None, durability: Durability | None) -> Tunables:
    try:
        tunables = tunables_from_json(tunables_json) if tunables_json else Tunables()
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tunables") from None
    if durability is None:
        return tunables
    chosen: dict[str, Any] = {}
    if durability.accept_durability is not None:
        chosen["accept_durability"] = durability.accept_durability
    if durability.durability_timeout is not None:
        chosen["durability_timeout"] = durability.durability_timeout
    return replace(tunables, **chosen)


@contextlib.asynccontextmanager
async def open_outbox(
    valkey_url: str | None,
    data_dir: Path,
    tunables_json: str | None = None,
    durability: Durability | None = None,
    feed: FeedLimits | None = None,
    valkey_maxmemory: int | None = None,
    attach: bool = True,
) -> AsyncIterator[Outbox]:
    """An Outbox on the configured Valkey (see ``open_valkey``) with the given tunables.
    With ``durability`` (serve, worker), the level in force is decided and logged first.
    ``feed``: the bounds of its event streams (serve)."""
    tunables = _tunables(tunables_json, durability)
    # A blocked WAITAOF answers at durability_timeout: the socket must wait longer than that.
    socket_timeout = max(10.0, tunables.durability_timeout + 5.0)
    opened = open_valkey(valkey_url, data_dir, socket_timeout, valkey_maxmemory, attach)
    async with opened as client:
        outbox = Outbox(client, tunables, feed=feed)
        if durability is not None:
            await _check_durability(outbox, durability.strict_durability)
        yield outbox


async def _check_durability(outbox: Outbox, strict: bool) -> None:
    try:
        report = await outbox.check_durability()
    except DurabilityError as exc:
        raise click.ClickException(str(exc)) from None
    log.info("durability: %s", report.summary())
    for note in report.notes:
        log.warning("durability: %s", note)
    for problem in report.problems:
        log.warning("durability: %s", problem)
    if strict and report.problems:
        raise click.ClickException(
            f"--strict-durability at accept_durability={report.level}: "
            + "; ".join(report.problems)
        )


@contextlib.asynccontextmanager
async def open_valkey(
    valkey_url: str | None,
    data_dir: Path,
    socket_timeout: float = 10.0,
    maxmemory: int | None = None,
    attach: bool = True,
) -> AsyncIterator[Client]:
    """A client on the configured Valkey. Without a URL: attach to the embedded server
    running on ``data_dir`` (with the password kept there), or start one (with
    ``maxmemory``, bytes) for as long as the block runs. URLs are logged without password.
    ``attach=False`` (serve): start one, or refuse with ``DataDirInUse`` naming the holder."""
    embedded: EmbeddedValkey | None = None
    try:
        url = valkey_url or (running_url(data_dir) if attach else None)
        if url is None:
            embedded = EmbeddedValkey(data_dir, maxmemory=maxmemory)
            embedded.start()
            url = embedded.url
            log.info(
                "embedded Valkey on %s (maxmemory %d bytes), data in %s",
                redacted(url),
                embedded.maxmemory,
                embedded.data_dir,
            )
        elif valkey_url is None:
            log.info(
                "using the embedded Valkey already running on %s (%s)", data_dir, redacted(url)
            )
    except (DataDirInUse, UnsafeDataDir) as exc:
        raise click.ClickException(str(exc)) from None
    remember_valkey_url(url)  # for the one line if it proves unusable (TLS on one side only)
    ctx = click.get_current_context(silent=True)
    tls = TLSFiles(**(ctx.meta.get(_TLS_META, {}) if ctx is not None else {}))
    try:
        client = connect(url, tls, socket_timeout=socket_timeout, socket_connect_timeout=5)
    except ValueError as exc:  # a sentinel URL that names no service, TLS files without TLS
        raise click.BadParameter(str(exc), param_hint="--valkey-url") from None
    try:
        yield client
    finally:
        await client.aclose()
        if embedded is not None:
            embedded.stop()
