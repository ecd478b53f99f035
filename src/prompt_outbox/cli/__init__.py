"""The ``prompt-outbox`` command: ``serve``, ``worker``, the operator commands and ``demo``."""

from __future__ import annotations

import logging

import click

from .admin import cleanup, dismiss, list_prompts, park, retry, stats, unpark
from .demo import demo
from .otel import setup_tracing
from .serve import openapi, serve, worker


@click.group()
def main() -> None:
    """prompt-outbox: a durable outbox for prompts sent to AI-agent sessions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    setup_tracing()  # OTEL_* (cli/otel.py): off, and nothing imported, unless asked


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
):
    main.add_command(command)

__all__ = ["main"]
