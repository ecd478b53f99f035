"""Public import path (README); the code lives in ``prompt_outbox.storage.embedded``."""

from .storage.embedded import DataDirInUse, EmbeddedValkey, answers_ping, free_port, running_url

__all__ = ["DataDirInUse", "EmbeddedValkey", "answers_ping", "free_port", "running_url"]
