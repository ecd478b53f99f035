"""``serve`` with its log captured in a file."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prompt_outbox.embedded import free_port
from tests.support.processes import process_group
from tests.support.serve import BIN, wait_healthy


@contextmanager
def logged_service(
    args: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    auth: tuple[str, ...] = ("--no-auth",),
) -> Iterator[int]:
    """``serve`` with its stderr in ``log``; its port. Stopped by SIGTERM at the end.
    ``auth``: how it lets requests in (``--tokens FILE``, or none)."""
    port = free_port()
    argv = [BIN, "serve", *auth, "--port", str(port), *args]
    with (
        log.open("wb") as err,
        process_group(argv, {**os.environ, **(env or {})}, stderr=err) as proc,
    ):
        try:
            wait_healthy(port)
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)  # past it, the group is killed on the way out
