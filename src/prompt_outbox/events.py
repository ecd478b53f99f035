"""Public import path (docs/library.md); the code lives in ``prompt_outbox.core.events``."""

from .core.events import QueueEvent, QueueReset

__all__ = ["QueueEvent", "QueueReset"]
