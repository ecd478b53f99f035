"""The HTTP API (FastAPI): accept, list, retry and dismiss prompts, with token auth."""

from .app import create_app
from .auth import Principal, TokenTable

__all__ = ["Principal", "TokenTable", "create_app"]
