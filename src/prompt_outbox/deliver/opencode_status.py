"""opencode's ``GET {base}/session/status`` (docs/opencode-turns.md): the sessions of a server
that are not idle, read under a bound; the reads of one server asked at once share one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .answer import MiB, bounded_request
from .opencode_servers import Servers

log = logging.getLogger("prompt_outbox.opencode")

STATUS_ANSWER_BYTES = 4 * MiB  # ~50 bytes per busy session


class StatusReads:
    """Status reads of opencode servers, each bounded by ``STATUS_ANSWER_BYTES`` and
    ``timeout`` in total."""

    def __init__(self, servers: Servers, timeout: float) -> None:
        self._servers = servers
        self._timeout = timeout
        self._reads: dict[str, asyncio.Future[set[str] | None]] = {}

    async def busy(self, base: str) -> set[str] | None:
        """The sessions ``GET {base}/session/status`` lists as not idle, or None if it could
        not be read whole."""
        try:
            async with self._servers.request(base) as client:
                answer = await bounded_request(
                    client,
                    "GET",
                    base + "/session/status",
                    limit=STATUS_ANSWER_BYTES,
                    deadline=self._timeout,
                )
            if answer.status != 200:
                raise RuntimeError(f"GET /session/status answered {answer.status}")
            value: Any = answer.json()
            if not isinstance(value, dict):
                raise TypeError("GET /session/status answered no object")
        except Exception as exc:
            log.info("opencode status of %s unreadable: %r", base, exc)
            return None
        return {
            session
            for session, status in value.items()
            if not (isinstance(status, dict) and status.get("type") == "idle")
        }

    async def shared(self, base: str) -> set[str] | None:
        """``busy`` for many turns of one server asked at once (a worker asks about each turn
        it holds every check interval): they share one read in flight."""
        read = self._reads.get(base)
        if read is None:
            read = asyncio.ensure_future(self.busy(base))
            self._reads[base] = read
            read.add_done_callback(lambda _: self._reads.pop(base, None))
        return await asyncio.shield(read)
