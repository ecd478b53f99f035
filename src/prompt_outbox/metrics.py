"""Public import path (docs/library.md); the code lives in ``prompt_outbox.core.metrics``."""

from .core.metrics import CONTENT_TYPE, Metrics

__all__ = ["CONTENT_TYPE", "Metrics"]
