"""The ``prompt-outbox`` group's one clear line for a Valkey that cannot be used (nothing
listening, a wrong password, TLS on one side only), instead of a traceback, on every
command."""

from __future__ import annotations

from typing import Any

import click

from ..core.errors import StorageFormatError
from ..storage.store import UNAVAILABLE

HINT = "check --valkey-url (PROMPT_OUTBOX_VALKEY_URL)"


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
            raise click.ClickException(f"Valkey unusable ({what}: {found}); {HINT}") from None
