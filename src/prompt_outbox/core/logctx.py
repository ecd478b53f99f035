"""The context every log record carries as fields: bound for a block of code (a session's
delivery step, an HTTP request) and read by the log format (``cli/logs.py``).

One naming everywhere, for what is bound here and for what a call passes as ``extra=``:
``workspace``, ``session``, ``entry``, ``attempt``, ``outcome``, ``failure``, ``status``,
``error``, ``turn``, ``count``, ``request_id``. A context variable, so that concurrent tasks
(one per session, one per request) each see their own, and a task started inside inherits it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType

_EMPTY: Mapping[str, object] = MappingProxyType({})
_fields: ContextVar[Mapping[str, object]] = ContextVar("prompt_outbox_log_fields", default=_EMPTY)


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Every record logged in the block (and in tasks it starts) carries ``fields``, besides
    those already bound; a record's own ``extra=`` fields win."""
    token = _fields.set(MappingProxyType({**_fields.get(), **fields}))
    try:
        yield
    finally:
        _fields.reset(token)


def log_fields() -> Mapping[str, object]:
    """The fields bound here now (read-only)."""
    return _fields.get()


def about_entry(ws: str, ses: str, entry_id: str, **more: object) -> dict[str, object]:
    """The ``extra=`` of a record about one entry's delivery (``more``: ``attempt``,
    ``outcome``, ``error`` ...), in the one naming."""
    return {"workspace": ws, "session": ses, "entry": entry_id, **more}
