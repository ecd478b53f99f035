"""Public import path (docs/library.md); the code lives in ``prompt_outbox.storage.durability``."""

from .storage.durability import DurabilityError, check_durability, durability_problems

__all__ = ["DurabilityError", "check_durability", "durability_problems"]
