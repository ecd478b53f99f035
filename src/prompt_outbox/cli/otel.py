"""Traces for the commands, from the standard ``OTEL_*`` environment only (docs/observability.md,
"Traces"). The rule: on when ``OTEL_TRACES_EXPORTER`` names an exporter (not ``none``) and
``OTEL_SDK_DISABLED`` is not ``true``; then OpenTelemetry's own env-driven setup (the SDK's,
through opentelemetry-distro's ``OpenTelemetryConfigurator``) builds the global tracer
provider, and ``core/tracing.py`` follows it. Unlike the SDK's default (``otlp``), an unset
``OTEL_TRACES_EXPORTER`` means off: with no ``OTEL_*`` set nothing is imported or sent."""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

import click

log = logging.getLogger("prompt_outbox.cli")

SERVICE_NAME = "prompt-outbox"  # OTEL_SERVICE_NAME when it is not set


def traces_asked(environ: MutableMapping[str, str]) -> str:
    """The exporters the environment asks for ('' none, or disabled)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ""
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    return "" if exporters.lower() in ("", "none") else exporters


def setup_tracing(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Configure OpenTelemetry from the environment when it asks for traces; True if on. The
    extra missing: a warning, and the command runs without traces."""
    exporters = traces_asked(environ)
    if not exporters:
        return False
    try:
        from opentelemetry.distro import OpenTelemetryConfigurator
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER=%s, but OpenTelemetry is not installed "
            "(pip install 'prompt-outbox[otel]'): no traces",
            exporters,
        )
        return False
    environ.setdefault("OTEL_SERVICE_NAME", SERVICE_NAME)
    try:
        OpenTelemetryConfigurator().configure()  # type: ignore[no-untyped-call]
    except Exception as exc:  # an exporter name no package provides, a bad protocol
        raise click.ClickException(f"OTEL_TRACES_EXPORTER={exporters}: {exc}") from exc
    return True
