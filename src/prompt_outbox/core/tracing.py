"""Traces (docs/observability.md, "Traces"): the small face the API and the delivery code call.

One trace per prompt: the accept span, then every send attempt, verification, OnDelivered
call and the turn's end as its children, in whichever process runs them, because the accept
span's W3C ``traceparent`` is kept on the entry (``Entry.trace``) and on its turn's record.

Off, and free, unless OpenTelemetry is configured: every call then goes to ``NOOP``, and
nothing of opentelemetry is imported here. On when

- opentelemetry's global tracer provider is set (an SDK's, not the API's default proxy): by
  the application, or by ``prompt-outbox serve`` / ``worker`` from the ``OTEL_*`` environment
  (``cli/otel.py``); looked at on each call until found, so an application may set it after
  building its ``Outbox``;
- or ``use_provider`` gave a provider of the outbox's own (tests; an application that keeps
  the global one for something else).

Then ``core/otel.py`` (the only module that imports opentelemetry) does the work.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

# W3C Trace Context, version 00, and nothing else: what we write is always this, so a stored
# value that is not (a hostile or damaged entry) is dropped, never passed on. All-zero IDs are
# invalid by the spec.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACEPARENT_LEN = 55

Attribute = str | int | float | bool


def checked_traceparent(value: object) -> str:
    """``value`` if it is a W3C version-00 ``traceparent``, else ''."""
    if isinstance(value, str) and len(value) == TRACEPARENT_LEN and _TRACEPARENT.fullmatch(value):
        return value
    return ""


def about(ws: str, ses: str, entry_id: str = "") -> dict[str, Attribute]:
    """The attributes every span of a prompt carries."""
    return {
        "prompt_outbox.workspace": ws,
        "prompt_outbox.session": ses,
        "prompt_outbox.entry": entry_id,
    }


class Span(Protocol):
    """What the outbox's code does with a span it opened."""

    def set(self, key: str, value: Attribute) -> None: ...

    def fail(self, error: str) -> None:
        """Mark the span's operation failed, saying why."""
        ...


class Tracing(Protocol):
    """The spans the outbox opens (``core/otel.py`` makes them; ``NOOP`` makes none)."""

    def accept(
        self, attributes: dict[str, Attribute], headers: Mapping[str, str]
    ) -> AbstractContextManager[Span]:
        """The HTTP accept's span, current while it runs: a child of the request's server
        span when one is current (FastAPI's own), else of the request's ``traceparent``."""
        ...

    def span(
        self,
        name: str,
        parent: str,
        attributes: dict[str, Attribute],
        *,
        client: bool = False,
        start_ms: int | None = None,
    ) -> AbstractContextManager[Span]:
        """A span of the prompt whose trace context is ``parent`` (a traceparent; '': under
        whatever is current), current while it runs. ``client``: a call out (to the agent).
        ``start_ms``: when it began, if before now (a turn)."""
        ...

    def traceparent(self) -> str:
        """The trace context an accepted entry keeps: the current span's; with none current, a
        ``prompt_outbox.accept`` span of its own begins the prompt's trace. '' when off."""
        ...

    def headers(self) -> dict[str, str]:
        """The current span's context as headers for a call out (the webhook's request)."""
        ...


class _NoSpan:
    def set(self, key: str, value: Attribute) -> None:
        pass

    def fail(self, error: str) -> None:
        pass


class _Off:
    """No traces: every span is one reusable null context."""

    _none: AbstractContextManager[Span] = nullcontext(_NoSpan())

    def accept(self, *args: object, **kwargs: object) -> AbstractContextManager[Span]:
        return self._none

    def span(self, *args: object, **kwargs: object) -> AbstractContextManager[Span]:
        return self._none

    def traceparent(self) -> str:
        return ""

    def headers(self) -> dict[str, str]:
        return {}


NOOP: Tracing = _Off()


class _Chosen:
    """The process's tracing once found on (OpenTelemetry's provider is process-wide too)."""

    tracing: Tracing | None = None


def tracing() -> Tracing:
    """The tracing in force: ``NOOP`` until OpenTelemetry is configured (see the module)."""
    chosen = _Chosen.tracing
    if chosen is not None:
        return chosen
    api: Any = sys.modules.get("opentelemetry.trace")  # imported by whoever configured it
    if api is None:
        return NOOP
    provider = api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return NOOP  # the API's default: nobody configured a provider
    if not isinstance(provider, api.TracerProvider):
        return NOOP  # not one (set_tracer_provider checks nothing): never fail an accept for it
    return use_provider(provider)


def use_provider(provider: object | None) -> Tracing:
    """Trace with ``provider`` (an opentelemetry ``TracerProvider``), whatever the global one
    is; None: back to following the global one."""
    if provider is None:
        _Chosen.tracing = None
        return tracing()
    from .otel import OtelTracing  # opentelemetry is imported from here on, not before

    _Chosen.tracing = OtelTracing(provider)
    return _Chosen.tracing
