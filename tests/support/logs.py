"""``serve`` with its log captured in a file."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prompt_outbox.embedded import free_port
from tests.support.serve import BIN, wait_healthy


@contextmanager
def logged_service(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """``serve`` with its stderr in ``log``; its port. Stopped by SIGTERM at the end."""
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [BIN, "serve", "--no-auth", "--port", str(port), *args],
            env={**os.environ, **(env or {})},
            start_new_session=True,
            stderr=err,
        )
    try:
        wait_healthy(port)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
