"""Where the CLI's Valkey comes from: a URL, the embedded server another command already runs
on the data dir, or an embedded server this command starts (and stops) itself."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.settings import Tunables, tunables_from_json
from ..outbox import Outbox
from ..storage.connect import connect
from ..storage.durability import DurabilityError, check_durability
from ..storage.embedded import DataDirInUse, EmbeddedValkey, running_url
from ..storage.store import Client

log = logging.getLogger("prompt_outbox.cli")
F = TypeVar("F", bound=Callable[..., Any])


def storage_options(command: F) -> F:
    """--valkey-url / --data-dir / --strict-durability / --tunables, shared by every command."""
    for option in reversed(
        [
            click.option(
                "--valkey-url",
                envvar="PROMPT_OUTBOX_VALKEY_URL",
                help="external Valkey (valkey+cluster://host:port for a cluster); "
                "default: the embedded one on --data-dir",
            ),
            click.option(
                "--data-dir",
                default="./.prompt-outbox",
                show_default=True,
                envvar="PROMPT_OUTBOX_DATA_DIR",
                type=click.Path(path_type=Path),
                help="the embedded Valkey's data",
            ),
            click.option(
                "--strict-durability",
                is_flag=True,
                help="refuse a Valkey that could lose acknowledged accepts",
            ),
            click.option(
                "--tunables",
                "tunables_json",
                envvar="PROMPT_OUTBOX_TUNABLES",
                help="JSON of Tunables fields, e.g. '{\"lease_ttl\": 10}' (default: the seed's)",
            ),
        ]
    ):
        command = option(command)
    return command


@contextlib.asynccontextmanager
async def open_outbox(
    valkey_url: str | None,
    data_dir: Path,
    strict_durability: bool = False,
    tunables_json: str | None = None,
) -> AsyncIterator[Outbox]:
    """An Outbox on the configured Valkey (see ``open_valkey``) with the given tunables."""
    try:
        tunables = tunables_from_json(tunables_json) if tunables_json else Tunables()
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tunables") from None
    async with open_valkey(valkey_url, data_dir, strict_durability) as client:
        yield Outbox(client, tunables)


@contextlib.asynccontextmanager
async def open_valkey(
    valkey_url: str | None, data_dir: Path, strict_durability: bool = False
) -> AsyncIterator[Client]:
    """A client on the configured Valkey, durability checked. Without a URL: attach to the
    embedded server running on ``data_dir``, or start one for as long as the block runs."""
    embedded: EmbeddedValkey | None = None
    url = valkey_url or running_url(data_dir)
    if url is None:
        embedded = EmbeddedValkey(data_dir)
        try:
            embedded.start()
        except DataDirInUse as exc:
            raise click.ClickException(str(exc)) from None
        url = embedded.url
        log.info("embedded Valkey on %s, data in %s", url, embedded.data_dir)
    elif valkey_url is None:
        log.info("using the embedded Valkey already running on %s (%s)", data_dir, url)
    client = connect(url, socket_timeout=10, socket_connect_timeout=5)
    try:
        try:
            for problem in await check_durability(client, strict=strict_durability):
                log.warning("durability: %s", problem)
        except DurabilityError as exc:
            raise click.ClickException(str(exc)) from None
        yield client
    finally:
        await client.aclose()
        if embedded is not None:
            embedded.stop()
