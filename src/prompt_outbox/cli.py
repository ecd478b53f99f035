"""The ``prompt-outbox`` command: ``serve`` runs the HTTP API and the delivery workers."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import uvicorn
import valkey.asyncio as valkey_async

from .api import TokenTable, create_app
from .callbacks import Deliverer
from .deliver import WebhookDeliverer
from .durability import check_durability
from .embedded import EmbeddedValkey
from .outbox import Outbox

log = logging.getLogger("prompt_outbox.cli")


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM once it has stopped, which would kill the process
    before the workers are joined and the embedded Valkey is stopped: we handle signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def request_exit(self) -> None:
        self.should_exit = True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.group()
def main() -> None:
    """prompt-outbox: a durable outbox for prompts sent to AI-agent sessions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")


@main.command()
@click.option(
    "--valkey-url", envvar="PROMPT_OUTBOX_VALKEY_URL", help="external Valkey; default: embedded"
)
@click.option(
    "--data-dir",
    default="./.prompt-outbox",
    show_default=True,
    type=click.Path(path_type=Path),
    help="embedded Valkey's data",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--tokens",
    "tokens_file",
    envvar="PROMPT_OUTBOX_TOKENS_FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="bearer-token file (JSON)",
)
@click.option("--no-auth", is_flag=True, help="let every request in (loopback development only)")
@click.option(
    "--strict-durability", is_flag=True, help="refuse a Valkey that could lose acknowledged accepts"
)
@click.option(
    "--webhook-url", envvar="PROMPT_OUTBOX_WEBHOOK_URL", help="deliver entries by POSTing them here"
)
@click.option("--webhook-verify-url", envvar="PROMPT_OUTBOX_WEBHOOK_VERIFY_URL")
@click.option(
    "--webhook-secret-env",
    default="PROMPT_OUTBOX_WEBHOOK_SECRET",
    show_default=True,
    help="env var holding the signing secret",
)
def serve(
    valkey_url: str | None,
    data_dir: Path,
    host: str,
    port: int,
    tokens_file: str | None,
    no_auth: bool,
    strict_durability: bool,
    webhook_url: str | None,
    webhook_verify_url: str | None,
    webhook_secret_env: str,
) -> None:
    """Run the HTTP API and the delivery workers in one process."""
    if no_auth and not _is_loopback(host):
        raise click.UsageError("--no-auth is only allowed on a loopback --host")
    if not no_auth and tokens_file is None:
        raise click.UsageError("give --tokens FILE (or --no-auth for loopback development)")
    tokens = TokenTable({}, disabled=True) if no_auth else TokenTable.from_file(str(tokens_file))
    if no_auth:
        click.secho(
            "WARNING: authentication is DISABLED (--no-auth); loopback only.", fg="red", err=True
        )
    deliverer: Deliverer | None = None
    if webhook_url:
        secret = os.environ.get(webhook_secret_env, "")
        if not secret:
            raise click.UsageError(f"--webhook-url needs a signing secret in ${webhook_secret_env}")
        deliverer = WebhookDeliverer(
            webhook_url, secret=secret.encode(), verify_url=webhook_verify_url
        )
    asyncio.run(_serve(valkey_url, data_dir, host, port, tokens, strict_durability, deliverer))


async def _serve(
    valkey_url: str | None,
    data_dir: Path,
    host: str,
    port: int,
    tokens: TokenTable,
    strict_durability: bool,
    deliverer: Deliverer | None,
) -> None:
    embedded = None
    if valkey_url is None:
        embedded = EmbeddedValkey(data_dir)
        embedded.start()
        valkey_url = embedded.url
        log.info("embedded Valkey on %s, data in %s", valkey_url, embedded.data_dir)
    client = valkey_async.Valkey.from_url(valkey_url, socket_timeout=10, socket_connect_timeout=5)
    worker: asyncio.Task[None] | None = None
    try:
        for problem in await check_durability(client, strict=strict_durability):
            log.warning("durability: %s", problem)
        outbox = Outbox(client)
        if isinstance(deliverer, WebhookDeliverer) and deliverer.verify_url:
            outbox.set_verifier(deliverer.verify)
        if deliverer is None:
            log.warning("no deliverer configured: prompts are accepted and wait in the outbox")
        else:
            worker = asyncio.create_task(outbox.run(deliverer))
        # Open event streams never end by themselves: give them a bound at shutdown.
        config = uvicorn.Config(
            create_app(outbox, tokens), host=host, port=port, timeout_graceful_shutdown=5
        )
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.request_exit)
        await server.serve()  # returns once a signal asked it to
    finally:
        if worker is not None:
            worker.cancel()  # run() finishes in-flight deliveries before it returns
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        if isinstance(deliverer, WebhookDeliverer):
            await deliverer.aclose()
        await client.aclose()
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    sys.exit(main())
