"""The CLI's deliverer choice: a webhook or an opencode server, from options or env."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from ..core.callbacks import Deliverer, Verifier
from ..core.errors import InvalidInput
from ..core.validate import check_unicode
from ..deliver import OpencodeDeliverer, WebhookDeliverer, load_targets, template_targets
from ..deliver.opencode import MAX_SERVERS

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Delivery:
    """What the workers call, what verifies ambiguous sends, and how to close them;
    ``webhook_secret``, the webhook's, with which ``serve`` checks a receiver's signed turn ends."""

    deliverer: Deliverer
    verifier: Verifier | None
    aclose: Callable[[], Awaitable[None]]
    webhook_secret: bytes | None = None


def delivery_options(command: F) -> F:
    """The options of both deliverers (webhook-* or opencode-*; at most one of the two)."""
    options = [
        click.option(
            "--webhook-url",
            envvar="PROMPT_OUTBOX_WEBHOOK_URL",
            help="deliver entries by POSTing them here",
        ),
        click.option(
            "--webhook-verify-url",
            envvar="PROMPT_OUTBOX_WEBHOOK_VERIFY_URL",
            help="GET ?id= answers delivered / absent; GET ?turn= running / ended",
        ),
        click.option(
            "--webhook-secret-env",
            default="PROMPT_OUTBOX_WEBHOOK_SECRET",
            show_default=True,
            help="env var holding the signing secret",
        ),
        click.option(
            "--opencode-url",
            envvar="PROMPT_OUTBOX_OPENCODE_URL",
            help="deliver to this opencode server (a template: {workspace}, {session})",
        ),
        click.option(
            "--opencode-session",
            default="{session}",
            envvar="PROMPT_OUTBOX_OPENCODE_SESSION",
            show_default=True,
            help="the opencode session ID for ours (a template: {workspace}, {session})",
        ),
        click.option(
            "--opencode-allow-shared-sessions",
            is_flag=True,
            envvar="PROMPT_OUTBOX_OPENCODE_ALLOW_SHARED_SESSIONS",
            help="let two workspaces reach one opencode session (a mapping without "
            "{workspace}: one tenant); refused at start otherwise",
        ),
        click.option(
            "--opencode-targets",
            envvar="PROMPT_OUTBOX_OPENCODE_TARGETS",
            type=click.Path(exists=True, dir_okay=False),
            help='a JSON map {"<ws>/<ses>": {"url": ..., "session": ...}} instead of the URL',
        ),
        click.option(
            "--opencode-timeout",
            default=30.0,
            envvar="PROMPT_OUTBOX_OPENCODE_TIMEOUT",
            show_default=True,
            type=float,
            help="seconds one request to opencode may take (a send takes ~0.1 s; the turn "
            "goes on after it); past it the send is verified",
        ),
        click.option(
            "--opencode-connections",
            default=32,
            envvar="PROMPT_OUTBOX_OPENCODE_CONNECTIONS",
            show_default=True,
            type=click.IntRange(min=1),
            help="connections per opencode origin (scheme, host, port), shared by the "
            "servers there; each event stream has one more",
        ),
        click.option(
            "--opencode-max-servers",
            default=MAX_SERVERS,
            envvar="PROMPT_OUTBOX_OPENCODE_MAX_SERVERS",
            show_default=True,
            type=click.IntRange(min=1),
            help="opencode servers (distinct base URLs) kept at once; a send to one more "
            "waits (transient) while all are in use",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def build_delivery(
    webhook_url: str | None,
    webhook_verify_url: str | None,
    webhook_secret_env: str,
    opencode_url: str | None,
    opencode_session: str,
    opencode_targets: str | None,
    opencode_timeout: float,
    opencode_connections: int = 32,
    opencode_max_servers: int = MAX_SERVERS,
    opencode_allow_shared_sessions: bool = False,
) -> Delivery | None:
    """The configured deliverer, or None when none is (usage errors say what is missing, and
    name an opencode mapping that lets two workspaces meet in one agent session)."""
    opencode = opencode_url is not None or opencode_targets is not None
    if webhook_url and opencode:
        raise click.UsageError("choose one deliverer: --webhook-url or --opencode-url/-targets")
    if webhook_url:
        secret = _variable(webhook_secret_env)
        if not secret:
            raise click.UsageError(f"--webhook-url needs a signing secret in ${webhook_secret_env}")
        key = secret.encode()
        hook = WebhookDeliverer(webhook_url, secret=key, verify_url=webhook_verify_url)
        return Delivery(hook, hook.verify if webhook_verify_url else None, hook.aclose, key)
    if opencode:
        shared = opencode_allow_shared_sessions
        try:
            targets = (
                load_targets(opencode_targets, allow_shared_sessions=shared)
                if opencode_targets
                else template_targets(
                    str(opencode_url), opencode_session, allow_shared_sessions=shared
                )
            )
        except (OSError, ValueError) as exc:
            raise click.UsageError(str(exc)) from None
        # opencode's own basic-auth variables, if its server was started with them.
        password = _variable("OPENCODE_SERVER_PASSWORD")
        user = _variable("OPENCODE_SERVER_USERNAME", "opencode")
        agent = OpencodeDeliverer(
            targets,
            timeout=opencode_timeout,
            auth=(user, password) if password else None,
            max_connections_per_server=opencode_connections,
            max_servers=opencode_max_servers,
        )
        return Delivery(agent, agent.verify, agent.aclose)
    return None


def _variable(name: str, default: str = "") -> str:
    """An environment variable a deliverer reads, as Unicode (``validate.check_unicode``): a
    byte that is not UTF-8 in it (a secret no receiver could sign with, a password no request
    could carry) is a usage error naming it."""
    try:
        return check_unicode(f"${name}", os.environ.get(name, default))
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
