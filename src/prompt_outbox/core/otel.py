"""The OpenTelemetry side of ``core/tracing.py``: the only module that imports opentelemetry,
and only once tracing is on (``tracing.use_provider``). Needs opentelemetry-api alone; the SDK
(the ``otel`` extra) is what a process configures the provider with (``cli/otel.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Nothing from .tracing (it imports this module): the shapes are its protocols, by structure.
Attribute = str | int | float | bool

SCOPE = "prompt_outbox"
ACCEPT = "prompt_outbox.accept"
_W3C = TraceContextTextMapPropagator()  # what an entry keeps is W3C's, whatever OTEL_PROPAGATORS
_ERROR_CHARS = 300


class _Span:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: Attribute) -> None:
        self._span.set_attribute(key, value)

    def fail(self, error: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, error[:_ERROR_CHARS]))


class OtelTracing:
    """``tracing.Tracing`` over an opentelemetry ``TracerProvider``."""

    def __init__(self, provider: object) -> None:
        if not isinstance(provider, trace.TracerProvider):
            raise TypeError(f"not an opentelemetry TracerProvider: {provider!r:.80}")
        self._tracer = provider.get_tracer(SCOPE)

    @contextmanager
    def accept(
        self, attributes: dict[str, Attribute], headers: Mapping[str, str]
    ) -> Iterator[_Span]:
        if trace.get_current_span().get_span_context().is_valid:
            parent, kind = None, SpanKind.INTERNAL  # under the HTTP server's span
        else:  # the global propagators (OTEL_PROPAGATORS; W3C by default) check the header
            parent, kind = propagate.extract(headers), SpanKind.SERVER
        with self._tracer.start_as_current_span(
            ACCEPT, context=parent, kind=kind, attributes=attributes
        ) as span:
            yield _Span(span)

    @contextmanager
    def span(
        self,
        name: str,
        parent: str,
        attributes: dict[str, Attribute],
        *,
        client: bool = False,
        start_ms: int | None = None,
    ) -> Iterator[_Span]:
        context = _W3C.extract({"traceparent": parent}) if parent else None
        with self._tracer.start_as_current_span(
            name,
            context=context,
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=attributes,
            start_time=None if start_ms is None else start_ms * 1_000_000,
        ) as span:
            yield _Span(span)

    def traceparent(self) -> str:
        span = trace.get_current_span()
        if not span.get_span_context().is_valid:
            # Accepted outside any span (a library call): the prompt's trace begins here.
            span = self._tracer.start_span(ACCEPT)
            span.end()
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent", "")

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier
