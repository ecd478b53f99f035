"""The HTTP API (FastAPI): accept, list, retry and dismiss prompts, with token auth."""

from .answers import AnswerLimits
from .app import create_app
from .auth import Principal, TokenTable
from .limits import RateLimit
from .streams import StreamLimits

__all__ = ["AnswerLimits", "Principal", "RateLimit", "StreamLimits", "TokenTable", "create_app"]
