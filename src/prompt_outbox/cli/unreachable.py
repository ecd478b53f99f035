"""The ``prompt-outbox`` group's one clear line for a Valkey that cannot be used (nothing
listening, a wrong password, TLS on one side only), instead of a traceback, on every
command."""

from __future__ import annotations

import ssl
from typing import Any

import click

from ..core.errors import StorageFormatError
from ..storage.connect import uses_tls
from ..storage.store import UNAVAILABLE
from .logs import said_as_json

HINT = "check --valkey-url (PROMPT_OUTBOX_VALKEY_URL)"
_URL_META = "prompt_outbox.valkey_url"


def remember_valkey_url(url: str) -> None:
    """Keep the URL a command connects with on the click context, so that the one line for an
    unusable Valkey can say whether TLS is likely the mismatch (click's ``meta`` is shared by
    the group's context and its command's)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_URL_META] = url


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during (valkey-py keeps the socket's error there)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def tls_hint(url: str | None, exc: BaseException) -> str:
    """What to check when TLS is on at one end only, or "" when the error does not look like
    it. A TLS client to a plain server waits out its connect timeout (the server reads the
    handshake as a command and waits for its end) or fails the handshake; a plain client to a
    TLS server has its connection reset."""
    if url is None:
        return ""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    if uses_tls(url):
        if "certificate" in text.lower():  # TLS is on at both ends: the error says what failed
            return ""
        if any(isinstance(e, (TimeoutError, ssl.SSLError)) for e in chain) or "Timeout" in text:
            return "; is TLS on at the server? (valkeys:// speaks TLS)"
        return ""
    reset = any(isinstance(e, (ConnectionResetError, BrokenPipeError)) for e in chain)
    if reset or "reset by peer" in text or "closed by server" in text:
        return "; does the server speak TLS? (then use valkeys://)"
    return ""


def unavailable_in(
    exc: BaseException, kinds: tuple[type[BaseException], ...] = UNAVAILABLE
) -> BaseException | None:
    """``exc`` if it is one of ``kinds`` (by default: Valkey could not answer), or the first
    such in an exception group."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = unavailable_in(inner, kinds)
            if found is not None:
                return found
    return None


class Main(click.Group):
    """A group whose commands end with one line, exit code 1, when Valkey is unreachable or
    refuses the connection, or holds a storage format newer than this version knows."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._one_line(ctx)
        except click.ClickException as failure:
            if said_as_json(ctx, failure):  # --log-format json: its last line is JSON too
                ctx.exit(failure.exit_code)
            raise

    def _one_line(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BaseException as exc:
            newer = unavailable_in(exc, (StorageFormatError,))
            if newer is not None:  # its message says what to do
                raise click.ClickException(str(newer)) from None
            found = unavailable_in(exc)
            if found is None:
                raise
            what = type(found).__name__
            tls = tls_hint(ctx.meta.get(_URL_META), found)
            raise click.ClickException(f"Valkey unusable ({what}: {found}); {HINT}{tls}") from None
