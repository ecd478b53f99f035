"""The ``prompt-outbox`` command: ``serve``, ``worker``, the operator commands and ``demo``."""

from __future__ import annotations

import click

from .admin import cleanup, dismiss, list_prompts, park, retry, stats, unpark
from .demo import demo
from .logs import with_logging
from .serve import openapi, serve, worker
from .tokens import tokens
from .unreachable import Main


@click.group(cls=Main)
@click.version_option(package_name="prompt-outbox")
def main() -> None:
    """prompt-outbox: a durable outbox for prompts sent to AI-agent sessions."""
    # Logging is set up by each command (cli/logs.py: --log-format, --log-level), and traces
    # after it (OTEL_*, cli/otel.py: off, and nothing imported, unless asked).


for command in (
    serve,
    worker,
    list_prompts,
    retry,
    dismiss,
    park,
    unpark,
    cleanup,
    stats,
    demo,
    openapi,
    tokens,
):
    main.add_command(with_logging(command))

__all__ = ["main"]
