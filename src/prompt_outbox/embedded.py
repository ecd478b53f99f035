"""Public import path (docs/library.md); the code lives in ``prompt_outbox.storage.embedded``."""

from .storage.embedded import (
    MAXMEMORY_CAP,
    DataDirInUse,
    EmbeddedValkey,
    UnsafeDataDir,
    answers_ping,
    default_maxmemory,
    free_port,
    read_password,
    redacted,
    running_url,
)

__all__ = [
    "MAXMEMORY_CAP",
    "DataDirInUse",
    "EmbeddedValkey",
    "UnsafeDataDir",
    "answers_ping",
    "default_maxmemory",
    "free_port",
    "read_password",
    "redacted",
    "running_url",
]
